// gpurun::store::Client — blocking TCPStore client speaking the same protocol
// as torch's TCPStore client (torch >= 2.5 handshake: VALIDATE + PING).
// Protocol: docs/store-protocol.md.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gpurun/error.hpp"
#include "gpurun/store/frame_codec.hpp"

namespace gpurun::store {

/// Where to connect and how long to try.
struct ClientOptions {
  /// Store host name or address (resolved with getaddrinfo; every address tried).
  std::string host = "127.0.0.1";
  /// Store TCP port.
  uint16_t port = 29500;
  /// Deadline of the connect loop and of every operation, including how long
  /// get()/wait()/queue_pop(block) wait for keys. torch's default: 300 s.
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
  /// Connect retry backoff (torch 2.5+ values): first delay, growth factor,
  /// random jitter as a fraction (±50 %), and the cap of one delay.
  std::chrono::milliseconds connect_backoff_initial{500};
  double connect_backoff_factor = 1.5;
  double connect_backoff_jitter = 0.5;
  std::chrono::milliseconds connect_backoff_max{std::chrono::seconds(60)};
  /// Limits applied to replies (a reply value longer than max_value_bytes is
  /// a protocol error, not an allocation).
  Limits limits{};
};

/// Thrown by Client's constructor when its last attempt connected but what listens there did
/// not complete the TCPStore handshake (VALIDATE + PING): it closed or reset the connection,
/// stayed silent until the deadline, or answered PING with bytes other than its echo. what():
/// "127.0.0.1:29400 answers but is not a TCPStore (it answered PING with 'HTTP/1.1 400 ...')".
/// A port that refuses connections (nothing listens yet) is a plain StoreError.
class NotAStoreError : public StoreError {
 public:
  NotAStoreError(const std::string& peer, std::string seen);
  /// What the listener did, e.g. "it closed the connection without answering PING".
  const std::string& seen() const { return seen_; }

 private:
  std::string seen_;
};

/// One connection to a store. Keys and values are raw bytes carried in
/// std::string (any byte, NUL included). Every method blocks until the reply
/// arrives or ClientOptions::timeout passes, and is safe to call from several
/// threads (one mutex serialises requests, as torch's client does).
///
/// Errors: gpurun::StoreTimeout when the deadline passes (message names the
/// keys and elapsed ms); gpurun::StoreError for connection or protocol
/// failures (message names host:port). After a StoreError other than a wait
/// timeout the connection is closed and every later call throws StoreError.
class Client {
 public:
  /// Connects, retrying with jittered exponential backoff until
  /// options.timeout, then sends VALIDATE and PING (nonce = pid) and checks
  /// the echo. Throws StoreError listing the attempts when it cannot connect,
  /// NotAStoreError when the last attempt reached a listener that is not a store.
  explicit Client(ClientOptions options);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  /// "host:port" of the store.
  const std::string& peer() const { return peer_; }

  /// SET: stores `value` under `key`.
  void set(std::string_view key, std::string_view value);
  /// WAIT [key] then GET: blocks until `key` exists (up to the timeout).
  std::string get(std::string_view key);
  /// ADD: adds `delta` to the integer at `key` (missing = 0); returns the new value.
  int64_t add(std::string_view key, int64_t delta);
  /// COMPARE_SET (server semantics: docs/store-protocol.md); returns the reply value.
  std::string compare_set(std::string_view key, std::string_view expected,
                          std::string_view desired);
  /// CHECK: true iff every key exists now. Does not block on the keys.
  bool check(const std::vector<std::string>& keys);
  /// WAIT: blocks until every key exists, up to options.timeout or `timeout`.
  /// On timeout sends CANCEL_WAIT and throws StoreTimeout.
  void wait(const std::vector<std::string>& keys);
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);
  /// GETNUMKEYS: number of keys in the store (queues excluded).
  int64_t num_keys();
  /// DELETE_KEY: true if the key existed.
  bool delete_key(std::string_view key);
  /// APPEND: appends `value` to the value at `key` (creates it if missing).
  void append(std::string_view key, std::string_view value);
  /// WAIT [keys] then MULTI_GET: values in the order of `keys`.
  std::vector<std::string> multi_get(const std::vector<std::string>& keys);
  /// MULTI_SET: keys[i] = values[i]. Sizes must match (InvariantError otherwise).
  void multi_set(const std::vector<std::string>& keys, const std::vector<std::string>& values);
  /// QUEUE_PUSH: appends `value` to the FIFO queue `key`.
  void queue_push(std::string_view key, std::string_view value);
  /// QUEUE_POP: the head of queue `key`. block=true waits (WAIT + POP, up to
  /// the timeout, StoreTimeout after); block=false returns nullopt when empty.
  std::optional<std::string> queue_pop(std::string_view key, bool block = true);
  /// QUEUE_LEN: number of values in queue `key`.
  int64_t queue_len(std::string_view key);
  /// LIST_KEYS: every key in raw wire form (queues excluded), unordered.
  std::vector<std::string> list_keys();
  /// PING with this process's pid as nonce; throws StoreError if the echo differs.
  void ping();

 private:
  using Clock = std::chrono::steady_clock;

  void connect_with_retry();
  int connect_once(Clock::time_point deadline);  // returns fd; throws StoreError
  void handshake(Clock::time_point deadline);
  void ping_locked(Clock::time_point deadline);
  void send_all(const std::string& bytes, Clock::time_point deadline);
  // Reads exactly n bytes; throws StoreTimeout at the deadline, StoreError on EOF/error.
  void read_exact(void* dst, std::size_t n, Clock::time_point deadline);
  // Waits for one byte; false when the deadline passed first.
  bool read_byte_until(uint8_t& byte, Clock::time_point deadline);
  // Sends `req` and returns a reader for its reply with the op deadline.
  ReplyReader request(const Request& req, Clock::time_point deadline);
  // WAIT with cancel-on-timeout; the caller holds the mutex.
  void wait_locked(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);
  void ensure_usable() const;
  // Closes the socket after a failure; later calls report `reason`.
  [[noreturn]] void fail(const std::string& reason);
  Clock::time_point op_deadline() const { return Clock::now() + options_.timeout; }

  ClientOptions options_;
  std::string peer_;
  std::mutex mutex_;
  int fd_ = -1;
  std::string broken_reason_;
};

}  // namespace gpurun::store
