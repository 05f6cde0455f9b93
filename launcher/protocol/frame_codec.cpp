#include "gpurun/store/frame_codec.hpp"

#include <algorithm>
#include <cstring>
#include <utility>

#include <fmt/format.h>

#include "gpurun/check.hpp"

namespace gpurun::store {

namespace {

// Bytes reserved up front for a string whose length passed its limit; longer
// strings grow as their bytes actually arrive.
constexpr std::size_t kInitialStringReserve = 64 * 1024;

constexpr const char* kNames[kNumQueryTypes] = {
    "VALIDATE",    "SET",        "COMPARE_SET", "GET",       "ADD",       "CHECK",
    "WAIT",        "GETNUMKEYS", "DELETE_KEY",  "APPEND",    "MULTI_GET", "MULTI_SET",
    "CANCEL_WAIT", "PING",       "QUEUE_PUSH",  "QUEUE_POP", "QUEUE_LEN", "LIST_KEYS",
};

// torch 1.13's QueryType (no VALIDATE, PING, APPEND, MULTI_*, CANCEL_WAIT, queues, LIST_KEYS)
// in today's numbering; WATCH_KEY (7, key-change callbacks) has no counterpart.
constexpr uint8_t kLegacyWatchKey = 7;
constexpr uint8_t kNumLegacyTypes = 9;
constexpr QueryType kLegacyTypes[kNumLegacyTypes] = {
    QueryType::kSet,        QueryType::kCompareSet,
    QueryType::kGet,        QueryType::kAdd,
    QueryType::kCheck,      QueryType::kWait,
    QueryType::kGetNumKeys, QueryType::kWait /* WATCH_KEY: refused before use */,
    QueryType::kDeleteKey,
};

uint64_t load_le(const uint8_t* p, std::size_t n) {
  uint64_t v = 0;
  for (std::size_t i = 0; i < n; ++i) v |= uint64_t{p[i]} << (8 * i);
  return v;
}

}  // namespace

std::string query_type_name(uint8_t code) {
  if (code < kNumQueryTypes) return kNames[code];
  return fmt::format("code {}", code);
}

std::string printable(std::string_view bytes, std::size_t max_chars) {
  std::string out = "'";
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    if (out.size() >= max_chars) {
      out += "...";
      break;
    }
    const auto c = static_cast<unsigned char>(bytes[i]);
    if (c >= 0x20 && c < 0x7F && c != '\\' && c != '\'') {
      out.push_back(static_cast<char>(c));
    } else {
      out += fmt::format("\\x{:02x}", c);
    }
  }
  out += "'";
  return out;
}

// ---- FrameDecoder ---------------------------------------------------------------

FrameDecoder::FrameDecoder(Limits limits, bool expect_handshake)
    : limits_(limits),
      expect_handshake_(expect_handshake),
      validated_(!expect_handshake),
      dialect_(expect_handshake ? Dialect::kUndecided : Dialect::kCurrent) {}

FrameDecoder::Status FrameDecoder::fail(std::string reason) {
  stage_ = Stage::kFailed;
  error_ = std::move(reason);
  return Status::kError;
}

FrameDecoder::Status FrameDecoder::begin_command(uint8_t code) {
  if (dialect_ == Dialect::kUndecided) {
    if (code == 0) {  // VALIDATE, or a torch 1.13 SET: the next 4 bytes tell
      stage_ = Stage::kProbe;
      int_have_ = 0;
      int_need_ = 4;
      return Status::kNeedMore;
    }
    dialect_ = Dialect::kLegacy;
    validated_ = true;
  }
  if (dialect_ == Dialect::kLegacy) {
    if (code == kLegacyWatchKey) {
      return fail(
          "WATCH_KEY (code 7 of a torch 1.13 client: key-change callbacks) is not served by "
          "gpurun's store");
    }
    if (code >= kNumLegacyTypes) {
      return fail(fmt::format(
          "unknown command byte {} from a torch 1.13 - 2.0 client (it has codes 0-8)", code));
    }
    code = static_cast<uint8_t>(kLegacyTypes[code]);
  } else if (code >= kNumQueryTypes) {
    return fail(fmt::format(
        "unknown command byte {} (gpurun serves codes 0-17 of torch 2.11; 18 is BARRIER of "
        "newer torch)",
        code));
  }
  if (expect_handshake_ && dialect_ == Dialect::kCurrent && validated_ &&
      code == static_cast<uint8_t>(QueryType::kValidate)) {
    return fail("second VALIDATE on an already validated connection");
  }
  req_ = Request{};
  req_.type = static_cast<QueryType>(code);
  num_fixed_ = 0;
  next_fixed_ = 0;
  repeat_left_ = 0;
  repeat_value_next_ = false;
  repeated_pairs_ = req_.type == QueryType::kMultiSet;
  auto fields = [this](std::initializer_list<Field> f) {
    for (Field x : f) fixed_[num_fixed_++] = x;
  };
  switch (req_.type) {
    case QueryType::kValidate:
    case QueryType::kPing:
      fields({Field::kU32});
      break;
    case QueryType::kSet:
    case QueryType::kAppend:
    case QueryType::kQueuePush:
      fields({Field::kKey, Field::kValue});
      break;
    case QueryType::kCompareSet:
      fields({Field::kKey, Field::kValue, Field::kValue});
      break;
    case QueryType::kGet:
    case QueryType::kDeleteKey:
    case QueryType::kQueuePop:
    case QueryType::kQueueLen:
      fields({Field::kKey});
      break;
    case QueryType::kAdd:
      fields({Field::kKey, Field::kI64});
      break;
    case QueryType::kCheck:
    case QueryType::kWait:
    case QueryType::kMultiGet:
    case QueryType::kMultiSet:
      fields({Field::kCount});
      break;
    case QueryType::kGetNumKeys:
    case QueryType::kCancelWait:
    case QueryType::kListKeys:
      break;
  }
  return Status::kNeedMore;
}

FrameDecoder::Status FrameDecoder::finish_probe() {
  if (load_le(int_buf_, 4) == kValidationMagic) {
    dialect_ = Dialect::kCurrent;
    req_ = Request{};
    req_.type = QueryType::kValidate;
    req_.u32 = kValidationMagic;
    num_fixed_ = next_fixed_ = 0;
    repeat_left_ = 0;
    repeat_value_next_ = repeated_pairs_ = false;
    return Status::kRequest;
  }
  // A torch 1.13 SET: the 4 bytes are the low half of its key's u64 length.
  dialect_ = Dialect::kLegacy;
  validated_ = true;
  if (begin_command(0) == Status::kError) return Status::kError;  // SET: key, value
  start_next_field();                                             // the key's length ...
  int_have_ = 4;                                                  // ... half read already
  return Status::kNeedMore;
}

bool FrameDecoder::start_next_field() {
  Field f;
  if (next_fixed_ < num_fixed_) {
    f = fixed_[next_fixed_++];
  } else if (repeat_value_next_) {
    f = Field::kValue;
    repeat_value_next_ = false;
  } else if (repeat_left_ > 0) {
    --repeat_left_;
    f = Field::kKey;
    repeat_value_next_ = repeated_pairs_;
  } else {
    return false;
  }
  current_ = f;
  int_have_ = 0;
  int_need_ = f == Field::kU32 ? 4 : 8;
  stage_ = (f == Field::kKey || f == Field::kValue) ? Stage::kStringLength : Stage::kFixedInt;
  return true;
}

FrameDecoder::Status FrameDecoder::finish_fixed_int() {
  const uint64_t v = load_le(int_buf_, int_need_);
  const auto name = query_type_name(static_cast<uint8_t>(req_.type));
  switch (current_) {
    case Field::kU32:
      req_.u32 = static_cast<uint32_t>(v);
      if (req_.type == QueryType::kValidate && expect_handshake_ && req_.u32 != kValidationMagic) {
        return fail(
            fmt::format("VALIDATE magic 0x{:08X} is not 0x{:08X}: not a torch >= 2.3 "
                        "TCPStore client",
                        req_.u32, kValidationMagic));
      }
      break;
    case Field::kI64:
      req_.delta = static_cast<int64_t>(v);
      break;
    case Field::kCount:
      if (v > limits_.max_keys_per_request) {
        return fail(fmt::format("{} with {} keys exceeds the limit of {} keys per request", name, v,
                                limits_.max_keys_per_request));
      }
      repeat_left_ = v;
      break;
    default:
      break;
  }
  return Status::kNeedMore;
}

FrameDecoder::Status FrameDecoder::finish_string_length() {
  const uint64_t len = load_le(int_buf_, 8);
  const bool is_key = current_ == Field::kKey;
  const std::size_t limit = is_key ? limits_.max_key_bytes : limits_.max_value_bytes;
  if (len > limit) {
    const bool probed = dialect_ == Dialect::kLegacy && first_request_ &&
                        req_.type == QueryType::kSet && req_.keys.empty() && is_key;
    return fail(fmt::format(
        "{} {} of {} bytes exceeds the limit of {} bytes{}",
        query_type_name(static_cast<uint8_t>(req_.type)), is_key ? "key" : "value", len, limit,
        probed ? " (a first byte 0x00 not followed by VALIDATE's magic CE F7 85 3C is read as "
                 "the SET of a torch 1.13 client)"
               : ""));
  }
  str_.clear();
  str_.reserve(std::min<std::size_t>(len, kInitialStringReserve));
  str_need_ = len;
  stage_ = Stage::kStringBody;
  return Status::kNeedMore;
}

void FrameDecoder::finish_string_body() {
  if (current_ == Field::kKey) {
    req_.keys.push_back(std::move(str_));
  } else {
    req_.values.push_back(std::move(str_));
  }
  str_ = std::string();
}

bool FrameDecoder::take_int(std::span<const uint8_t>& input) {
  const std::size_t take = std::min<std::size_t>(int_need_ - int_have_, input.size());
  std::memcpy(int_buf_ + int_have_, input.data(), take);
  int_have_ = static_cast<uint8_t>(int_have_ + take);
  input = input.subspan(take);
  return int_have_ == int_need_;
}

FrameDecoder::Status FrameDecoder::decode(std::span<const uint8_t>& input, Request& out) {
  for (;;) {
    switch (stage_) {
      case Stage::kFailed:
        return Status::kError;
      case Stage::kCommand: {
        if (input.empty()) return Status::kNeedMore;
        const uint8_t code = input[0];
        input = input.subspan(1);
        if (begin_command(code) == Status::kError) return Status::kError;
        if (stage_ == Stage::kProbe) continue;  // VALIDATE or a torch 1.13 SET: 4 bytes decide
        break;
      }
      case Stage::kProbe: {
        if (!take_int(input)) return Status::kNeedMore;
        const Status s = finish_probe();
        if (s == Status::kError) return s;
        if (s == Status::kRequest) {
          stage_ = Stage::kCommand;
          first_request_ = false;
          validated_ = true;
          out = std::move(req_);
          req_ = Request{};
          return Status::kRequest;
        }
        continue;  // the rest of the SET's key length
      }
      case Stage::kFixedInt:
      case Stage::kStringLength: {
        if (!take_int(input)) return Status::kNeedMore;
        const Status s = stage_ == Stage::kFixedInt ? finish_fixed_int() : finish_string_length();
        if (s == Status::kError) return s;
        if (stage_ == Stage::kStringBody) continue;  // the string's bytes come next
        break;
      }
      case Stage::kStringBody: {
        const std::size_t take =
            static_cast<std::size_t>(std::min<uint64_t>(str_need_ - str_.size(), input.size()));
        str_.append(reinterpret_cast<const char*>(input.data()), take);
        input = input.subspan(take);
        if (str_.size() < str_need_) return Status::kNeedMore;
        finish_string_body();
        break;
      }
    }
    // A field (or the command byte) just completed: start the next field or finish.
    if (!start_next_field()) {
      stage_ = Stage::kCommand;
      first_request_ = false;
      if (req_.type == QueryType::kValidate) validated_ = true;
      out = std::move(req_);
      req_ = Request{};
      return Status::kRequest;
    }
  }
}

// ---- encoding -------------------------------------------------------------------

void put_u8(std::string& out, uint8_t v) {
  out.push_back(static_cast<char>(v));
}

void put_u32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

void put_u64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

void put_i64(std::string& out, int64_t v) {
  put_u64(out, static_cast<uint64_t>(v));
}

void put_bytes(std::string& out, std::string_view bytes) {
  put_u64(out, bytes.size());
  out.append(bytes);
}

void encode_request(const Request& req, std::string& out) {
  const auto code = static_cast<uint8_t>(req.type);
  GPURUN_CHECK(code < kNumQueryTypes, "cannot encode unknown command byte {}", code);
  const auto name = query_type_name(code);
  auto need = [&](std::size_t keys, std::size_t values) {
    GPURUN_CHECK(req.keys.size() == keys && req.values.size() == values,
                 "{} needs {} key(s) and {} value(s), got {} and {}", name, keys, values,
                 req.keys.size(), req.values.size());
  };
  put_u8(out, code);
  switch (req.type) {
    case QueryType::kValidate:
    case QueryType::kPing:
      need(0, 0);
      put_u32(out, req.u32);
      break;
    case QueryType::kSet:
    case QueryType::kAppend:
    case QueryType::kQueuePush:
      need(1, 1);
      put_bytes(out, req.keys[0]);
      put_bytes(out, req.values[0]);
      break;
    case QueryType::kCompareSet:
      need(1, 2);
      put_bytes(out, req.keys[0]);
      put_bytes(out, req.values[0]);
      put_bytes(out, req.values[1]);
      break;
    case QueryType::kGet:
    case QueryType::kDeleteKey:
    case QueryType::kQueuePop:
    case QueryType::kQueueLen:
      need(1, 0);
      put_bytes(out, req.keys[0]);
      break;
    case QueryType::kAdd:
      need(1, 0);
      put_bytes(out, req.keys[0]);
      put_i64(out, req.delta);
      break;
    case QueryType::kCheck:
    case QueryType::kWait:
    case QueryType::kMultiGet:
      need(req.keys.size(), 0);
      put_u64(out, req.keys.size());
      for (const auto& k : req.keys) put_bytes(out, k);
      break;
    case QueryType::kMultiSet:
      need(req.keys.size(), req.keys.size());
      put_u64(out, req.keys.size());
      for (std::size_t i = 0; i < req.keys.size(); ++i) {
        put_bytes(out, req.keys[i]);
        put_bytes(out, req.values[i]);
      }
      break;
    case QueryType::kGetNumKeys:
    case QueryType::kCancelWait:
    case QueryType::kListKeys:
      need(0, 0);
      break;
  }
}

// ---- ReplyReader ----------------------------------------------------------------

ReplyReader::ReplyReader(ReadExact read_exact, Limits limits, std::string peer)
    : read_exact_(std::move(read_exact)), limits_(limits), peer_(std::move(peer)) {}

uint8_t ReplyReader::u8() {
  uint8_t v = 0;
  read_exact_(&v, 1);
  return v;
}

uint32_t ReplyReader::u32() {
  uint8_t b[4];
  read_exact_(b, 4);
  return static_cast<uint32_t>(load_le(b, 4));
}

int64_t ReplyReader::i64() {
  uint8_t b[8];
  read_exact_(b, 8);
  return static_cast<int64_t>(load_le(b, 8));
}

std::string ReplyReader::bytes() {
  uint8_t b[8];
  read_exact_(b, 8);
  const uint64_t len = load_le(b, 8);
  if (len > limits_.max_value_bytes) {
    throw StoreError(
        fmt::format("store at {} announced a reply value of {} bytes, over the limit of {} bytes",
                    peer_, len, limits_.max_value_bytes));
  }
  std::string s(static_cast<std::size_t>(len), '\0');
  if (len > 0) read_exact_(s.data(), s.size());
  return s;
}

std::vector<std::string> ReplyReader::byte_list(uint64_t count) {
  std::vector<std::string> out;
  // Grow as entries arrive: `count` comes from the peer.
  for (uint64_t i = 0; i < count; ++i) out.push_back(bytes());
  return out;
}

}  // namespace gpurun::store
