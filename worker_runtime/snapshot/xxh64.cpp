#include "gpurun/snapshot/xxh64.hpp"

#include <algorithm>
#include <cstring>

namespace gpurun::snapshot {
namespace {

// The five primes of the specification.
constexpr uint64_t kP1 = 0x9E3779B185EBCA87ULL;
constexpr uint64_t kP2 = 0xC2B2AE3D27D4EB4FULL;
constexpr uint64_t kP3 = 0x165667B19E3779F9ULL;
constexpr uint64_t kP4 = 0x85EBCA77C2B2AE63ULL;
constexpr uint64_t kP5 = 0x27D4EB2F165667C5ULL;

constexpr uint64_t rotl(uint64_t x, int r) {
  return (x << r) | (x >> (64 - r));
}

// Little-endian loads (native on every supported host; memcpy: any alignment).
uint64_t load64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
uint32_t load32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

constexpr uint64_t round(uint64_t acc, uint64_t lane) {
  acc += lane * kP2;
  acc = rotl(acc, 31);
  return acc * kP1;
}

constexpr uint64_t merge(uint64_t acc, uint64_t v) {
  acc ^= round(0, v);
  return acc * kP1 + kP4;
}

// Consumes whole 32-byte stripes of [p, p + n) into v; returns the bytes consumed.
size_t stripes(uint64_t (&v)[4], const uint8_t* p, size_t n) {
  uint64_t v0 = v[0], v1 = v[1], v2 = v[2], v3 = v[3];
  const uint8_t* const end = p + n / 32 * 32;
  for (; p < end; p += 32) {
    v0 = round(v0, load64(p));
    v1 = round(v1, load64(p + 8));
    v2 = round(v2, load64(p + 16));
    v3 = round(v3, load64(p + 24));
  }
  v[0] = v0, v[1] = v1, v[2] = v2, v[3] = v3;
  return n / 32 * 32;
}

}  // namespace

Xxh64::Xxh64(uint64_t seed) noexcept
    : v_{seed + kP1 + kP2, seed + kP2, seed, seed - kP1}, seed_(seed) {}

void Xxh64::update(const void* data, size_t bytes) noexcept {
  const auto* p = static_cast<const uint8_t*>(data);
  total_ += bytes;
  if (buffered_ > 0) {
    const size_t take = std::min(bytes, sizeof buffer_ - buffered_);
    std::memcpy(buffer_ + buffered_, p, take);
    buffered_ += take;
    p += take;
    bytes -= take;
    if (buffered_ < sizeof buffer_) return;
    stripes(v_, buffer_, sizeof buffer_);
    buffered_ = 0;
  }
  const size_t done = stripes(v_, p, bytes);
  p += done;
  bytes -= done;
  std::memcpy(buffer_, p, bytes);
  buffered_ = bytes;
}

uint64_t Xxh64::digest() const noexcept {
  uint64_t acc;
  if (total_ >= 32) {
    acc = rotl(v_[0], 1) + rotl(v_[1], 7) + rotl(v_[2], 12) + rotl(v_[3], 18);
    for (uint64_t v : v_) acc = merge(acc, v);
  } else {
    acc = seed_ + kP5;
  }
  acc += total_;
  const uint8_t* p = buffer_;
  size_t n = buffered_;
  for (; n >= 8; p += 8, n -= 8) acc = rotl(acc ^ round(0, load64(p)), 27) * kP1 + kP4;
  if (n >= 4) {
    acc = rotl(acc ^ (uint64_t{load32(p)} * kP1), 23) * kP2 + kP3;
    p += 4;
    n -= 4;
  }
  for (; n > 0; ++p, --n) acc = rotl(acc ^ (uint64_t{*p} * kP5), 11) * kP1;
  acc ^= acc >> 33;
  acc *= kP2;
  acc ^= acc >> 29;
  acc *= kP3;
  acc ^= acc >> 32;
  return acc;
}

uint64_t Xxh64::of(const void* data, size_t bytes, uint64_t seed) noexcept {
  Xxh64 h(seed);
  h.update(data, bytes);
  return h.digest();
}

}  // namespace gpurun::snapshot
