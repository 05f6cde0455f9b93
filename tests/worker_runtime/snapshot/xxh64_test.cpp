#include "gpurun/snapshot/xxh64.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "gpurun/snapshot/format.hpp"

using gpurun::snapshot::Xxh64;

namespace {

uint64_t of(const std::string& s) {
  return Xxh64::of(s.data(), s.size());
}

}  // namespace

TEST_CASE("xxh64: digests equal the reference implementation's") {
  // Expected values: `printf '<input>' | xxhsum -H1` (xxHash 0.8.1, the reference).
  CHECK(of("") == 0xef46db3751d8e999ULL);
  CHECK(of("a") == 0xd24ec4f1a98c6e5bULL);
  CHECK(of("abc") == 0x44bc2cf5ad770999ULL);
  CHECK(of(std::string(100, 'x')) == 0x92f0de5a88a3c094ULL);
  CHECK(of("The quick brown fox jumps over the lazy dog, 0123456789!") == 0xe7f33cf046a90de0ULL);
}

TEST_CASE("xxh64: a stream cut anywhere gives the one-buffer digest; every bit counts") {
  std::vector<uint8_t> buf(1000);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<uint8_t>(i * 131 + 7);
  const uint64_t whole = Xxh64::of(buf.data(), buf.size());
  for (size_t piece : {1, 3, 7, 8, 31, 32, 33, 64, 999}) {
    CAPTURE(piece);
    Xxh64 h;
    for (size_t at = 0; at < buf.size(); at += piece)
      h.update(buf.data() + at, std::min(piece, buf.size() - at));
    CHECK(h.digest() == whole);
  }
  for (size_t bit : {0, 7, 4000, 7999}) {
    CAPTURE(bit);
    auto flipped = buf;
    flipped[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
    CHECK(Xxh64::of(flipped.data(), flipped.size()) != whole);
  }
  CHECK(Xxh64::of(buf.data(), buf.size() - 1) != whole);  // truncation
  CHECK(Xxh64::of(buf.data(), buf.size(), /*seed=*/1) != whole);
}

TEST_CASE("xxh64: throughput on a 1 GiB buffer" * doctest::skip()) {
  std::vector<uint8_t> buf(size_t{1} << 30);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<uint8_t>((i * 2654435761u) >> 13);
  double best = 1e9;
  uint64_t digest = 0;
  for (int round = 0; round < 3; ++round) {
    const auto t0 = std::chrono::steady_clock::now();
    digest ^= Xxh64::of(buf.data(), buf.size());
    best = std::min(best,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  MESSAGE("XXH64 of 1 GiB: " << best << " s, " << buf.size() / best / 1e9 << " GB/s (digest "
                             << digest << ")");
}

TEST_CASE(
    "payload_digest: the XXH64 of the 64 MiB chunks' XXH64s (little-endian, in order); every "
    "chunk counts") {
  using gpurun::snapshot::kPayloadChunkBytes;
  using gpurun::snapshot::payload_digest;
  // By hand, one chunk after the other on this thread: what format 4 defines.
  const auto by_hand = [](const uint8_t* p, uint64_t n) {
    Xxh64 top;
    for (uint64_t at = 0; at < n; at += kPayloadChunkBytes) {
      const uint64_t d = Xxh64::of(p + at, std::min(kPayloadChunkBytes, n - at));
      uint8_t le[8];
      for (int b = 0; b < 8; ++b) le[b] = static_cast<uint8_t>(d >> (8 * b));
      top.update(le, 8);
    }
    return top.digest();
  };
  std::vector<uint8_t> buf(kPayloadChunkBytes * 5 / 2);  // 2.5 chunks: 3 of them
  uint64_t x = 1;
  for (auto& b : buf) b = static_cast<uint8_t>((x = x * 6364136223846793005ULL + 1) >> 56);
  for (uint64_t n : {uint64_t{0}, uint64_t{1}, uint64_t{1000}, kPayloadChunkBytes,
                     kPayloadChunkBytes + 1, static_cast<uint64_t>(buf.size())}) {
    CAPTURE(n);
    CHECK(payload_digest(buf.data(), n) == by_hand(buf.data(), n));
  }
  // Not the one-stream XXH64 of format 3 (a file of that version is refused, not misread).
  CHECK(payload_digest(buf.data(), buf.size()) != Xxh64::of(buf.data(), buf.size()));
  const uint64_t before = payload_digest(buf.data(), buf.size());
  for (uint64_t at : {uint64_t{0}, kPayloadChunkBytes, static_cast<uint64_t>(buf.size() - 1)}) {
    buf[at] ^= 0x01;
    CHECK(payload_digest(buf.data(), buf.size()) != before);
    buf[at] ^= 0x01;
  }
  // Chunks swapped: a different digest (the order counts).
  std::swap_ranges(buf.begin(), buf.begin() + static_cast<std::ptrdiff_t>(kPayloadChunkBytes),
                   buf.begin() + static_cast<std::ptrdiff_t>(kPayloadChunkBytes));
  CHECK(payload_digest(buf.data(), buf.size()) != before);
}

TEST_CASE(
    "payload_digest with a PayloadFrontier: hashes only what the writer declared final, so a "
    "payload written in order while it hashes gives the digest of the finished bytes") {
  using gpurun::snapshot::kPayloadChunkBytes;
  using gpurun::snapshot::payload_digest;
  using gpurun::snapshot::PayloadFrontier;
  const uint64_t n = kPayloadChunkBytes * 3 + 12345;
  std::vector<uint8_t> want(n);
  uint64_t x = 7;
  for (auto& b : want) b = static_cast<uint8_t>((x = x * 6364136223846793005ULL + 1) >> 56);
  const uint64_t expected = payload_digest(want.data(), n);

  // The buffer starts as garbage (0xAB); a writer fills it in 1 MiB steps, advancing the
  // frontier after each, with a pause before the last chunk. A digest that read ahead of the
  // frontier would hash garbage and differ.
  std::vector<uint8_t> buf(n, 0xAB);
  PayloadFrontier written;
  uint64_t got = 0;
  std::thread hasher([&] { got = payload_digest(buf.data(), n, written); });
  for (uint64_t at = 0; at < n; at += uint64_t{1} << 20) {
    const uint64_t len = std::min<uint64_t>(uint64_t{1} << 20, n - at);
    if (at == kPayloadChunkBytes * 3) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    std::memcpy(buf.data() + at, want.data() + at, len);
    written.advance(at + len);
    written.advance(at);  // a smaller value is ignored
  }
  hasher.join();
  CHECK(got == expected);

  // An abandoned write: the digest returns (it does not wait forever).
  PayloadFrontier failed;
  failed.advance(kPayloadChunkBytes);
  std::thread h2([&] { (void)payload_digest(buf.data(), n, failed); });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  failed.abandon();
  h2.join();
  CHECK(failed.wait_for(1) == false);
}
