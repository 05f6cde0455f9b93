// gpurun::store frame codec: the TCPStore wire format (docs/store-protocol.md). One codec
// serves the server (request decoding, reply encoding) and the client (request encoding,
// reply decoding).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace gpurun::store {

/// Command byte of a request (torch 2.11 `QueryType`). Codes are only ever
/// appended upstream, so 0..17 serves every client from torch 2.3 to 2.11.
enum class QueryType : uint8_t {
  kValidate = 0,
  kSet = 1,
  kCompareSet = 2,
  kGet = 3,
  kAdd = 4,
  kCheck = 5,
  kWait = 6,
  kGetNumKeys = 7,
  kDeleteKey = 8,
  kAppend = 9,
  kMultiGet = 10,
  kMultiSet = 11,
  kCancelWait = 12,
  kPing = 13,
  kQueuePush = 14,
  kQueuePop = 15,
  kQueueLen = 16,
  kListKeys = 17,
};

/// Number of known command codes; any byte >= this (e.g. 18 = BARRIER of newer
/// upstream trees) is rejected.
inline constexpr uint8_t kNumQueryTypes = 18;

/// The u32 that follows the VALIDATE command byte (bytes CE F7 85 3C on the wire).
inline constexpr uint32_t kValidationMagic = 0x3C85F7CE;

/// Reply bytes of CHECK, WAIT and CANCEL_WAIT.
inline constexpr uint8_t kCheckReady = 0;
inline constexpr uint8_t kCheckNotReady = 1;
inline constexpr uint8_t kStopWaiting = 0;
inline constexpr uint8_t kWaitCanceled = 1;

/// Human-readable name of a command ("SET", "LIST_KEYS", "code 200").
std::string query_type_name(uint8_t code);

/// `bytes` quoted for an error message: printable ASCII kept, other bytes as
/// \xNN, cut to `max_chars` with "..." (keys are raw bytes on the wire).
std::string printable(std::string_view bytes, std::size_t max_chars = 128);

/// Size limits enforced on untrusted input. The defaults equal torch's libuv
/// server (the default TCPStore server since torch 2.4); a request beyond any
/// of them closes the connection.
struct Limits {
  /// Largest key (and any other string argument, e.g. COMPARE_SET's expected
  /// value is a value, not a key), in bytes. libuv: 8192.
  std::size_t max_key_bytes = 8192;
  /// Largest value (SET, COMPARE_SET expected/desired, APPEND, MULTI_SET,
  /// QUEUE_PUSH), in bytes. libuv: 8 MiB = 8388608.
  std::size_t max_value_bytes = 8u << 20;
  /// Largest key count in CHECK, WAIT, MULTI_GET and MULTI_SET. libuv: 131072.
  std::size_t max_keys_per_request = 131072;
  /// Most key registrations one connection may have pending in WAITs at once
  /// (a WAIT on n missing keys registers n). gpurun-specific (libuv has no
  /// such limit); the default admits one maximal WAIT. Enforced by Backend.
  std::size_t max_pending_waits_per_connection = 131072;
};

/// One decoded request. Which fields are meaningful depends on `type`:
///   VALIDATE, PING: `u32` (magic / nonce).
///   SET, APPEND, QUEUE_PUSH: keys[0], values[0].
///   COMPARE_SET: keys[0], values[0] = expected, values[1] = desired.
///   GET, DELETE_KEY, QUEUE_POP, QUEUE_LEN: keys[0].
///   ADD: keys[0], `delta`.
///   CHECK, WAIT, MULTI_GET: keys (count = keys.size()).
///   MULTI_SET: keys[i] paired with values[i].
///   GETNUMKEYS, CANCEL_WAIT, LIST_KEYS: nothing.
/// Keys and values are raw bytes held in std::string (no charset, may hold NUL).
struct Request {
  QueryType type = QueryType::kValidate;
  std::vector<std::string> keys;
  std::vector<std::string> values;
  int64_t delta = 0;
  uint32_t u32 = 0;

  bool operator==(const Request&) const = default;
};

/// Which TCPStore client generation a connection speaks, fixed by its first bytes.
enum class Dialect : uint8_t {
  kUndecided,  ///< no byte decoded yet (or only a 0x00 whose next 4 bytes decide)
  kCurrent,    ///< torch >= 2.1: VALIDATE + magic first, codes of torch 2.11 (QueryType)
  /// torch 1.13 - 2.0: no handshake; SET=0, COMPARE_SET=1, GET=2, ADD=3, CHECK=4, WAIT=5,
  /// GETNUMKEYS=6, WATCH_KEY=7 (not served), DELETE_KEY=8; replies as in torch 2.11.
  kLegacy,
};

/// Incremental request decoder (server side). Feed it byte chunks as they
/// arrive, split or coalesced arbitrarily; it returns one complete request at
/// a time. Work and memory are linear in the bytes fed; no allocation is ever
/// sized by an untrusted length before that length has passed its limit.
/// Not thread-safe; one decoder per connection.
class FrameDecoder {
 public:
  enum class Status {
    kNeedMore,  ///< every byte of input was consumed; the request is incomplete
    kRequest,   ///< `out` holds a complete request; input may hold more bytes
    kError,     ///< malformed input; error() says why; the decoder stays failed
  };

  /// `expect_handshake` (server behaviour): the connection's first bytes choose its dialect.
  /// VALIDATE + kValidationMagic (00 CE F7 85 3C) → Dialect::kCurrent, where any later
  /// VALIDATE is an error; any other start → Dialect::kLegacy (torch 1.13's numbering; its
  /// SET is also 0x00, but a key length whose low 4 bytes are the magic is ~1 GB, far over
  /// any limit, so the two never collide). Requests come out as QueryType either way.
  /// Without `expect_handshake` (client-side decoding): Dialect::kCurrent from the start.
  explicit FrameDecoder(Limits limits = {}, bool expect_handshake = true);

  /// The connection's dialect, once its first request decided it.
  Dialect dialect() const { return dialect_; }

  /// The command of the request being decoded, in QueryType numbering whatever the dialect
  /// (meaningful once its first byte was decoded; VALIDATE while a first 0x00 is probed).
  QueryType request_type() const { return req_.type; }

  /// Consumes bytes from the front of `input` (advancing it) until one request
  /// is complete (kRequest, written to `out`), the input is exhausted
  /// (kNeedMore) or the input is malformed (kError). Call again with the rest
  /// of `input` to get the next request. Never throws on bad input.
  Status decode(std::span<const uint8_t>& input, Request& out);

  /// The reason of the last kError, a sentence naming the command and limit.
  const std::string& error() const { return error_; }

  /// True once a complete VALIDATE has been decoded (or if no handshake is expected).
  bool validated() const { return validated_; }

  /// True if some bytes of an unfinished request are buffered.
  bool mid_request() const { return stage_ != Stage::kCommand; }

 private:
  enum class Stage : uint8_t {
    kCommand,
    kProbe,  // a first 0x00: VALIDATE's magic or a torch 1.13 SET's key length follows
    kFixedInt,
    kStringLength,
    kStringBody,
    kFailed
  };
  enum class Field : uint8_t { kU32, kI64, kCount, kKey, kValue };

  Status fail(std::string reason);
  Status begin_command(uint8_t code);
  // The probe's 4 bytes are in: VALIDATE (kCurrent) or the start of a 1.13 SET (kLegacy).
  Status finish_probe();
  // Moves bytes of the fixed-width integer being read from `input`; true once it is whole.
  bool take_int(std::span<const uint8_t>& input);
  // Starts the next field or, when none is left, reports completion.
  bool start_next_field();
  Status finish_fixed_int();
  Status finish_string_length();
  void finish_string_body();

  Limits limits_;
  bool expect_handshake_;
  bool validated_;
  Dialect dialect_;
  bool first_request_ = true;  // no request of this connection completed yet
  Stage stage_ = Stage::kCommand;
  std::string error_;

  // Request under construction and where we are in its layout.
  Request req_;
  Field fixed_[3] = {};
  uint8_t num_fixed_ = 0;
  uint8_t next_fixed_ = 0;
  bool repeated_pairs_ = false;  // repeated pattern is (key, value) instead of (key)
  uint64_t repeat_left_ = 0;     // repetitions not yet started
  bool repeat_value_next_ = false;
  Field current_ = Field::kU32;

  // Partial fixed-width integer.
  uint8_t int_buf_[8] = {};
  uint8_t int_have_ = 0;
  uint8_t int_need_ = 0;

  // Partial string.
  std::string str_;
  uint64_t str_need_ = 0;
};

// ---- encoding (little-endian; both sides) -------------------------------------

/// Appends fixed-width little-endian integers and length-prefixed bytes to `out`.
void put_u8(std::string& out, uint8_t v);
void put_u32(std::string& out, uint32_t v);
void put_u64(std::string& out, uint64_t v);
void put_i64(std::string& out, int64_t v);
void put_bytes(std::string& out, std::string_view bytes);

/// Appends the wire form of `req` (client side) to `out`. Field usage as
/// documented on Request; throws gpurun::InvariantError when keys/values do
/// not match the layout of `req.type`.
void encode_request(const Request& req, std::string& out);

/// Reads replies (client side) through a blocking `read_exact(ptr, n)` callback
/// that fills exactly n bytes or throws. Lengths and counts announced by the
/// peer are checked against `limits` before anything is allocated; a violation
/// throws gpurun::StoreError naming `peer` and the limit.
class ReplyReader {
 public:
  using ReadExact = std::function<void(void* dst, std::size_t n)>;
  ReplyReader(ReadExact read_exact, Limits limits, std::string peer);

  uint8_t u8();
  uint32_t u32();
  int64_t i64();
  /// u64 length + bytes, length <= limits.max_value_bytes.
  std::string bytes();
  /// LIST_KEYS: i64 count (<= 2^32) then count×bytes.
  std::vector<std::string> byte_list(uint64_t count);

 private:
  ReadExact read_exact_;
  Limits limits_;
  std::string peer_;
};

}  // namespace gpurun::store
