#include "gpurun/store/frame_codec.hpp"

#include <doctest/doctest.h>

#include <cstring>
#include <string>
#include <vector>

#include "gpurun/check.hpp"

namespace gpurun::store {
namespace {

std::string validate_bytes() {
  std::string out;
  encode_request(Request{QueryType::kValidate, {}, {}, 0, kValidationMagic}, out);
  return out;
}

// One sample request of every type but VALIDATE.
std::vector<Request> sample_requests() {
  using Q = QueryType;
  return {
      {Q::kSet, {"/k"}, {std::string("v\0v", 3)}, 0, 0},
      {Q::kCompareSet, {"k"}, {"old", "new"}, 0, 0},
      {Q::kGet, {"k"}, {}, 0, 0},
      {Q::kAdd, {"init/"}, {}, -7, 0},
      {Q::kCheck, {"a", "b"}, {}, 0, 0},
      {Q::kWait, {"a", "", "c"}, {}, 0, 0},
      {Q::kGetNumKeys, {}, {}, 0, 0},
      {Q::kDeleteKey, {"k"}, {}, 0, 0},
      {Q::kAppend, {"k"}, {"tail"}, 0, 0},
      {Q::kMultiGet, {"x", "y"}, {}, 0, 0},
      {Q::kMultiSet, {"x", "y"}, {"1", ""}, 0, 0},
      {Q::kCancelWait, {}, {}, 0, 0},
      {Q::kPing, {}, {}, 0, 0xDEADBEEF},
      {Q::kQueuePush, {"q"}, {"item"}, 0, 0},
      {Q::kQueuePop, {"q"}, {}, 0, 0},
      {Q::kQueueLen, {"q"}, {}, 0, 0},
      {Q::kListKeys, {}, {}, 0, 0},
  };
}

struct Decoded {
  std::vector<Request> requests;
  FrameDecoder::Status last = FrameDecoder::Status::kNeedMore;
  std::string error;
};

// Feeds `bytes` in chunks of the given sizes (the rest in one last chunk).
Decoded feed(const std::string& bytes, std::vector<std::size_t> cuts = {}, Limits limits = {},
             bool handshake = true) {
  FrameDecoder dec(limits, handshake);
  Decoded d;
  std::size_t pos = 0;
  cuts.push_back(bytes.size());
  for (std::size_t cut : cuts) {
    const std::size_t end = std::min(cut, bytes.size());
    std::span<const uint8_t> in(reinterpret_cast<const uint8_t*>(bytes.data()) + pos, end - pos);
    pos = end;
    for (;;) {
      Request r;
      d.last = dec.decode(in, r);
      if (d.last == FrameDecoder::Status::kRequest) {
        d.requests.push_back(std::move(r));
        continue;
      }
      if (d.last == FrameDecoder::Status::kError) {
        d.error = dec.error();
        return d;
      }
      CHECK(in.empty());
      break;
    }
  }
  return d;
}

std::string encode_all(const std::vector<Request>& reqs) {
  std::string out = validate_bytes();
  for (const auto& r : reqs) encode_request(r, out);
  return out;
}

std::string key_frame(QueryType t, std::size_t key_len) {
  std::string out = validate_bytes();
  put_u8(out, static_cast<uint8_t>(t));
  put_bytes(out, std::string(key_len, 'k'));
  return out;
}

}  // namespace

TEST_CASE("codec: the bytes of a real torch 2.11 client decode as VALIDATE then PING") {
  std::string bytes("\x00\xce\xf7\x85\x3c\x0d\x39\x30\x00\x00", 10);
  auto d = feed(bytes);
  REQUIRE(d.last == FrameDecoder::Status::kNeedMore);
  REQUIRE(d.requests.size() == 2);
  CHECK(d.requests[0].type == QueryType::kValidate);
  CHECK(d.requests[1].type == QueryType::kPing);
  CHECK(d.requests[1].u32 == 12345u);
}

TEST_CASE("codec: every query type round-trips, coalesced, byte by byte and split anywhere") {
  const auto reqs = sample_requests();
  REQUIRE(reqs.size() == kNumQueryTypes - 1);
  const std::string bytes = encode_all(reqs);

  auto whole = feed(bytes);
  REQUIRE(whole.requests.size() == reqs.size() + 1);
  for (std::size_t i = 0; i < reqs.size(); ++i) CHECK(whole.requests[i + 1] == reqs[i]);

  std::vector<std::size_t> every_byte;
  for (std::size_t i = 1; i < bytes.size(); ++i) every_byte.push_back(i);
  auto bytewise = feed(bytes, every_byte);
  CHECK(bytewise.requests == whole.requests);

  for (std::size_t cut = 0; cut <= bytes.size(); ++cut) {
    auto split = feed(bytes, {cut});
    CHECK_MESSAGE(split.requests == whole.requests, "split at byte " << cut);
    CHECK(split.last == FrameDecoder::Status::kNeedMore);
  }
}

TEST_CASE("codec: a truncated request is never returned") {
  for (const auto& r : sample_requests()) {
    std::string one;
    encode_request(r, one);
    for (std::size_t len = 0; len < one.size(); ++len) {
      auto d = feed(validate_bytes() + one.substr(0, len));
      CHECK(d.last == FrameDecoder::Status::kNeedMore);
      CHECK(d.requests.size() == 1);  // only the VALIDATE
    }
  }
}

// Requests as a torch 1.13 client writes them (tests/store/fixtures/tcpstore_torch113.txt):
// no handshake, SET=0 COMPARE_SET=1 GET=2 ADD=3 CHECK=4 WAIT=5 GETNUMKEYS=6 DELETE_KEY=8.
std::string legacy_bytes(uint8_t code, const std::vector<std::string>& strings) {
  std::string out(1, static_cast<char>(code));
  for (const auto& s : strings) put_bytes(out, s);
  return out;
}

TEST_CASE("codec: a torch 1.13 client's requests decode in its own numbering") {
  const std::string add = "\x03" + std::string("\x05\0\0\0\0\0\0\0init/", 13) +
                          std::string("\x01\0\0\0\0\0\0\0", 8);  // ADD init/ 1: its first
  std::string wait(1, '\x05');
  put_u64(wait, 1);
  put_bytes(wait, "/k");
  const std::string bytes = add + legacy_bytes(0, {"/k", "v"}) + legacy_bytes(1, {"/k", "v", "w"}) +
                            legacy_bytes(2, {"/k"}) + wait + std::string("\x06", 1) +
                            legacy_bytes(8, {"/k"});
  // Every split point: the dialect is decided the same way.
  for (std::size_t cut : {std::size_t{1}, std::size_t{3}, std::size_t{5}, bytes.size()}) {
    FrameDecoder dec;
    std::vector<Request> got;
    for (std::string_view part :
         {std::string_view(bytes).substr(0, cut), std::string_view(bytes).substr(cut)}) {
      std::span<const uint8_t> in(reinterpret_cast<const uint8_t*>(part.data()), part.size());
      Request r;
      while (dec.decode(in, r) == FrameDecoder::Status::kRequest) got.push_back(r);
    }
    CHECK(dec.dialect() == Dialect::kLegacy);
    REQUIRE(got.size() == 7);
    CHECK(got[0] == Request{QueryType::kAdd, {"init/"}, {}, 1, 0});
    CHECK(got[1] == Request{QueryType::kSet, {"/k"}, {"v"}, 0, 0});
    CHECK(got[2] == Request{QueryType::kCompareSet, {"/k"}, {"v", "w"}, 0, 0});
    CHECK(got[3] == Request{QueryType::kGet, {"/k"}, {}, 0, 0});
    CHECK(got[4] == Request{QueryType::kWait, {"/k"}, {}, 0, 0});
    CHECK(got[5].type == QueryType::kGetNumKeys);
    CHECK(got[6] == Request{QueryType::kDeleteKey, {"/k"}, {}, 0, 0});
  }
  SUBCASE("a first SET (0x00 and a key length) is not taken for VALIDATE") {
    for (std::size_t cut = 1; cut < 9; ++cut) {
      const std::string set = legacy_bytes(0, {"/key0", "value0"});
      FrameDecoder dec;
      std::vector<Request> got;
      for (std::string_view part :
           {std::string_view(set).substr(0, cut), std::string_view(set).substr(cut)}) {
        std::span<const uint8_t> in(reinterpret_cast<const uint8_t*>(part.data()), part.size());
        Request r;
        while (dec.decode(in, r) == FrameDecoder::Status::kRequest) got.push_back(r);
      }
      REQUIRE(got.size() == 1);
      CHECK(got[0] == Request{QueryType::kSet, {"/key0"}, {"value0"}, 0, 0});
      CHECK(dec.dialect() == Dialect::kLegacy);
    }
  }
  SUBCASE("WATCH_KEY (7) and codes past 8 close, naming them") {
    auto d = feed(legacy_bytes(7, {"/k"}));
    CHECK(d.last == FrameDecoder::Status::kError);
    CHECK(d.error.find("WATCH_KEY") != std::string::npos);
    d = feed(add + std::string("\x09", 1));
    CHECK(d.last == FrameDecoder::Status::kError);
    CHECK(d.error.find("unknown command byte 9 from a torch 1.13 - 2.0 client") !=
          std::string::npos);
  }
  SUBCASE("a 2.x client is kCurrent") {
    std::string v = validate_bytes();
    encode_request(Request{QueryType::kSet, {"/k"}, {"v"}, 0, 0}, v);
    for (std::size_t cut = 1; cut < 8; ++cut) {
      FrameDecoder dec;
      std::vector<Request> got;
      for (std::string_view part :
           {std::string_view(v).substr(0, cut), std::string_view(v).substr(cut)}) {
        std::span<const uint8_t> in(reinterpret_cast<const uint8_t*>(part.data()), part.size());
        Request r;
        while (dec.decode(in, r) == FrameDecoder::Status::kRequest) got.push_back(r);
      }
      REQUIRE(got.size() == 2);
      CHECK(got[0] == Request{QueryType::kValidate, {}, {}, 0, kValidationMagic});
      CHECK(got[1] == Request{QueryType::kSet, {"/k"}, {"v"}, 0, 0});
      CHECK(dec.dialect() == Dialect::kCurrent);
    }
  }
}

TEST_CASE("codec: handshake errors") {
  SUBCASE("a first 0x00 without the magic is a torch 1.13 SET: a ~300 MB key is refused") {
    std::string bytes;
    encode_request(Request{QueryType::kValidate, {}, {}, 0, 0x12345678}, bytes);
    bytes += std::string(4, '\0');  // the rest of the 8-byte length: 0x12345678
    auto d = feed(bytes);
    CHECK(d.last == FrameDecoder::Status::kError);
    CHECK(d.error.find("SET key of 305419896 bytes exceeds the limit of 8192") !=
          std::string::npos);
    CHECK(d.error.find("not followed by VALIDATE's magic") != std::string::npos);
  }
  SUBCASE("second VALIDATE") {
    auto d = feed(validate_bytes() + validate_bytes());
    CHECK(d.requests.size() == 1);
    CHECK(d.last == FrameDecoder::Status::kError);
    CHECK(d.error.find("second VALIDATE") != std::string::npos);
  }
  SUBCASE("no handshake expected (client-side use)") {
    std::string bytes;
    encode_request(Request{QueryType::kGet, {"k"}, {}, 0, 0}, bytes);
    auto d = feed(bytes, {}, Limits{}, false);
    REQUIRE(d.requests.size() == 1);
    CHECK(d.requests[0].keys[0] == "k");
  }
}

TEST_CASE("codec: unknown command bytes close, including 18 (BARRIER)") {
  for (int code : {18, 19, 200, 255}) {
    auto d = feed(validate_bytes() + std::string(1, static_cast<char>(code)));
    CHECK(d.last == FrameDecoder::Status::kError);
    CHECK(d.error.find(fmt::format("unknown command byte {}", code)) != std::string::npos);
  }
}

TEST_CASE("codec: key limit 8192 bytes") {
  for (auto t : {QueryType::kGet, QueryType::kDeleteKey, QueryType::kQueueLen}) {
    auto ok = feed(key_frame(t, 8192));
    REQUIRE(ok.requests.size() == 2);
    CHECK(ok.requests[1].keys[0].size() == 8192);
    auto bad = feed(key_frame(t, 8193));
    CHECK(bad.last == FrameDecoder::Status::kError);
    CHECK(bad.error.find("8193 bytes exceeds the limit of 8192") != std::string::npos);
  }
  // In counted requests too.
  std::string wait = validate_bytes();
  put_u8(wait, static_cast<uint8_t>(QueryType::kWait));
  put_u64(wait, 2);
  put_bytes(wait, "a");
  put_bytes(wait, std::string(8193, 'k'));
  CHECK(feed(wait).last == FrameDecoder::Status::kError);
}

TEST_CASE("codec: value limit 8 MiB") {
  const std::size_t limit = 8388608;
  for (auto t : {QueryType::kSet, QueryType::kAppend, QueryType::kQueuePush}) {
    std::string ok;
    encode_request(Request{t, {"k"}, {std::string(limit, 'v')}, 0, 0}, ok);
    auto d = feed(validate_bytes() + ok);
    REQUIRE(d.requests.size() == 2);
    CHECK(d.requests[1].values[0].size() == limit);
    std::string bad = validate_bytes();
    put_u8(bad, static_cast<uint8_t>(t));
    put_bytes(bad, "k");
    put_u64(bad, limit + 1);  // only the length: the decoder must refuse before any data
    auto e = feed(bad);
    CHECK(e.last == FrameDecoder::Status::kError);
    CHECK(e.error.find("8388609 bytes exceeds the limit of 8388608") != std::string::npos);
  }
  // A huge length is refused without allocating it.
  std::string huge = validate_bytes();
  put_u8(huge, static_cast<uint8_t>(QueryType::kCompareSet));
  put_bytes(huge, "k");
  put_u64(huge, uint64_t{1} << 62);
  CHECK(feed(huge).last == FrameDecoder::Status::kError);
}

TEST_CASE("codec: key count limit 131072") {
  for (auto t : {QueryType::kCheck, QueryType::kWait, QueryType::kMultiGet, QueryType::kMultiSet}) {
    std::string at = validate_bytes();
    put_u8(at, static_cast<uint8_t>(t));
    put_u64(at, 131072);
    for (int i = 0; i < 131072; ++i) {
      put_bytes(at, "");
      if (t == QueryType::kMultiSet) put_bytes(at, "");
    }
    auto d = feed(at);
    REQUIRE(d.requests.size() == 2);
    CHECK(d.requests[1].keys.size() == 131072);

    std::string over = validate_bytes();
    put_u8(over, static_cast<uint8_t>(t));
    put_u64(over, 131073);
    auto e = feed(over);
    CHECK(e.last == FrameDecoder::Status::kError);
    CHECK(e.error.find("131073 keys exceeds the limit of 131072") != std::string::npos);
  }
}

TEST_CASE("codec: custom limits and sticky errors") {
  Limits small;
  small.max_key_bytes = 4;
  auto d = feed(key_frame(QueryType::kGet, 5) + key_frame(QueryType::kGet, 1), {}, small);
  CHECK(d.last == FrameDecoder::Status::kError);
  CHECK(d.requests.size() == 1);
  FrameDecoder dec;
  std::string bad("\x07", 1);
  std::span<const uint8_t> in(reinterpret_cast<const uint8_t*>(bad.data()), bad.size());
  Request r;
  CHECK(dec.decode(in, r) == FrameDecoder::Status::kError);
  std::string good = validate_bytes();
  std::span<const uint8_t> in2(reinterpret_cast<const uint8_t*>(good.data()), good.size());
  CHECK(dec.decode(in2, r) == FrameDecoder::Status::kError);
}

TEST_CASE("codec: encoder rejects requests that do not match the layout") {
  std::string out;
  CHECK_THROWS_AS(encode_request(Request{QueryType::kSet, {"k"}, {}, 0, 0}, out),
                  gpurun::InvariantError);
  CHECK_THROWS_AS(encode_request(Request{QueryType::kMultiSet, {"a", "b"}, {"1"}, 0, 0}, out),
                  gpurun::InvariantError);
}

TEST_CASE("codec: reply reader decodes replies and refuses oversized lengths") {
  std::string wire;
  put_u8(wire, 1);
  put_u32(wire, 77);
  put_i64(wire, -2);
  put_bytes(wire, "hello");
  put_bytes(wire, "a");
  put_bytes(wire, "");
  put_u64(wire, 9);  // announced length over the custom limit below
  std::size_t pos = 0;
  Limits limits;
  limits.max_value_bytes = 8;
  ReplyReader reader(
      [&](void* dst, std::size_t n) {
        if (pos + n > wire.size()) throw StoreError("eof");
        std::memcpy(dst, wire.data() + pos, n);
        pos += n;
      },
      limits, "peer:1");
  CHECK(reader.u8() == 1);
  CHECK(reader.u32() == 77u);
  CHECK(reader.i64() == -2);
  CHECK(reader.bytes() == "hello");
  CHECK(reader.byte_list(2) == std::vector<std::string>{"a", ""});
  try {
    reader.bytes();
    FAIL("oversized reply accepted");
  } catch (const StoreError& e) {
    CHECK(std::string(e.what()).find("peer:1") != std::string::npos);
    CHECK(std::string(e.what()).find("limit of 8 bytes") != std::string::npos);
  }
}

TEST_CASE("codec: printable quotes binary keys") {
  CHECK(printable(std::string("a\0b", 3)) == "'a\\x00b'");
  CHECK(printable(std::string(500, 'x'), 10).size() < 20);
}

}  // namespace gpurun::store
