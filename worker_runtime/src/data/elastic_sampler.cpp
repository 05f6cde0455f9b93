#include "gpurun/elastic_sampler.hpp"

#include <numeric>
#include <random>

#include <fmt/format.h>

#include "gpurun/error.hpp"

namespace gpurun {

namespace {

// Uniform integer in [0, bound) by rejection (no modulo bias, same result everywhere,
// unlike std::uniform_int_distribution whose algorithm is unspecified).
uint64_t uniform_below(std::mt19937_64& rng, uint64_t bound) {
  const uint64_t limit = UINT64_MAX - UINT64_MAX % bound;
  uint64_t x;
  do {
    x = rng();
  } while (x >= limit);
  return x % bound;
}

// Seed of the generator for (seed, epoch): splitmix64 of each, so nearby seeds and
// epochs give unrelated permutations.
uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

}  // namespace

ElasticSampler::ElasticSampler(int64_t dataset_size, ElasticSamplerOptions options)
    : size_(dataset_size), options_(options) {
  if (dataset_size < 0)
    throw Error(fmt::format("ElasticSampler: dataset size {} is negative", dataset_size));
  set_epoch(0);
}

void ElasticSampler::set_epoch(int64_t epoch) {
  if (epoch < 0) throw Error(fmt::format("ElasticSampler: epoch {} is negative", epoch));
  epoch_ = epoch;
  cursor_ = 0;
  perm_.resize(static_cast<size_t>(size_));
  std::iota(perm_.begin(), perm_.end(), int64_t{0});
  if (!options_.shuffle || size_ < 2) return;
  std::mt19937_64 rng(mix(options_.seed) ^ mix(static_cast<uint64_t>(epoch) + 1));
  for (size_t i = perm_.size() - 1; i > 0; --i) {  // Fisher–Yates, back to front
    const size_t j = static_cast<size_t>(uniform_below(rng, i + 1));
    std::swap(perm_[i], perm_[j]);
  }
}

void ElasticSampler::advance(int64_t samples) {
  if (samples < 0 || samples > size_ - cursor_)
    throw Error(
        fmt::format("ElasticSampler: cannot advance by {} samples at cursor {} of {} (epoch {})",
                    samples, cursor_, size_, epoch_));
  cursor_ += samples;
}

int64_t ElasticSampler::num_samples(int rank, int world) const {
  if (world < 1 || rank < 0 || rank >= world)
    throw Error(fmt::format("ElasticSampler: rank {} is not in a world of {}", rank, world));
  const int64_t remaining = size_ - cursor_;
  if (options_.drop_last) return remaining / world;
  return remaining / world + (rank < remaining % world ? 1 : 0);
}

std::vector<int64_t> ElasticSampler::indices(int rank, int world) const {
  const int64_t n = num_samples(rank, world);
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(n));
  for (int64_t k = 0; k < n; ++k)
    out.push_back(perm_[static_cast<size_t>(cursor_ + rank + k * world)]);
  return out;
}

std::vector<int64_t> ElasticSampler::window_indices(int64_t count, int rank, int world) const {
  if (world < 1 || rank < 0 || rank >= world)
    throw Error(fmt::format("ElasticSampler: rank {} is not in a world of {}", rank, world));
  if (count < 0 || count > size_ - cursor_)
    throw Error(fmt::format(
        "ElasticSampler: a window of {} samples does not fit at cursor {} of {} (epoch {})", count,
        cursor_, size_, epoch_));
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(count / world + 1));
  for (int64_t p = rank; p < count; p += world)
    out.push_back(perm_[static_cast<size_t>(cursor_ + p)]);
  return out;
}

void ElasticSampler::load_state(State s) {
  if (s.cursor < 0 || s.cursor > size_)
    throw Error(fmt::format("ElasticSampler: cursor {} does not fit a dataset of {} samples",
                            s.cursor, size_));
  set_epoch(s.epoch);
  cursor_ = s.cursor;
}

}  // namespace gpurun
