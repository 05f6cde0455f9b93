#include "gpurun/elastic_sampler.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <random>
#include <set>
#include <vector>

#include "gpurun/error.hpp"

using gpurun::ElasticSampler;
using gpurun::ElasticSamplerOptions;

namespace {

// Simulates one epoch in which the world size changes at step boundaries: at each
// boundary every rank has trained k steps of `batch` samples from its share. Returns
// every index any rank trained on, in order of consumption.
std::vector<int64_t> run_epoch_with_resizes(ElasticSampler& s, std::mt19937& rng) {
  std::vector<int64_t> seen;
  while (s.cursor() < s.dataset_size()) {
    const int world = std::uniform_int_distribution<int>(1, 8)(rng);
    const int64_t batch = std::uniform_int_distribution<int>(1, 10)(rng);
    const int64_t min_share = s.num_samples(world - 1, world);  // the last rank's is smallest
    const int64_t max_steps = min_share / batch;
    const bool last_segment = max_steps == 0 || rng() % 4 == 0;
    if (last_segment) {  // train on everything left (uneven tail) and end the epoch
      for (int r = 0; r < world; ++r) {
        const auto share = s.indices(r, world);
        seen.insert(seen.end(), share.begin(), share.end());
      }
      s.advance(s.dataset_size() - s.cursor());
      break;
    }
    const int64_t steps = std::uniform_int_distribution<int64_t>(1, max_steps)(rng);
    for (int r = 0; r < world; ++r) {
      const auto share = s.indices(r, world);
      seen.insert(seen.end(), share.begin(), share.begin() + steps * batch);
    }
    s.advance(steps * batch * world);  // the boundary: the world may change now
  }
  return seen;
}

}  // namespace

TEST_CASE("elastic sampler: every index exactly once per epoch across any resize sequence") {
  std::mt19937 rng(12345);
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t n = std::uniform_int_distribution<int64_t>(0, 700)(rng);
    ElasticSamplerOptions o;
    o.seed = rng();
    ElasticSampler s(n, o);
    for (int64_t epoch = 0; epoch < 3; ++epoch) {
      s.set_epoch(epoch);
      auto seen = run_epoch_with_resizes(s, rng);
      std::sort(seen.begin(), seen.end());
      std::vector<int64_t> all(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) all[static_cast<size_t>(i)] = i;
      INFO("trial " << trial << ", n " << n << ", epoch " << epoch);
      REQUIRE(seen == all);
    }
  }
}

TEST_CASE("elastic sampler: one permutation per (seed, epoch), the same on every rank") {
  ElasticSamplerOptions o;
  o.seed = 42;
  ElasticSampler a(1000, o), b(1000, o);
  a.set_epoch(3);
  b.set_epoch(3);
  CHECK(a.indices(1, 4) == b.indices(1, 4));  // two processes agree without talking
  // The four shares of one world are disjoint and cover the dataset.
  std::vector<int64_t> all;
  for (int r = 0; r < 4; ++r) {
    auto sh = a.indices(r, 4);
    CHECK(sh.size() == 250);
    all.insert(all.end(), sh.begin(), sh.end());
  }
  std::sort(all.begin(), all.end());
  CHECK(std::adjacent_find(all.begin(), all.end()) == all.end());
  CHECK(all.size() == 1000);

  const auto epoch3 = a.indices(0, 1);
  a.set_epoch(4);
  CHECK(a.indices(0, 1) != epoch3);  // reshuffled every epoch
  ElasticSamplerOptions other = o;
  other.seed = 43;
  ElasticSampler c(1000, other);
  c.set_epoch(3);
  CHECK(c.indices(0, 1) != epoch3);  // and per seed
}

TEST_CASE("elastic sampler: the same indices on every platform (own Fisher-Yates)") {
  // std::shuffle and std::uniform_int_distribution differ between standard libraries;
  // the sampler must not, or a CPU rank and a GPU rank built elsewhere would disagree.
  // These values were produced by this implementation (g++ 12 / libstdc++, Debian 12)
  // and checked again on the GPU machine (g++ 13, Ubuntu 24.04).
  ElasticSamplerOptions o;
  o.seed = 7;
  ElasticSampler s(10, o);
  s.set_epoch(1);
  CHECK(s.indices(0, 1) == std::vector<int64_t>{3, 0, 5, 6, 1, 7, 2, 9, 4, 8});
}

TEST_CASE("elastic sampler: no shuffle is strided identity; drop_last gives equal shares") {
  ElasticSamplerOptions o;
  o.shuffle = false;
  ElasticSampler s(10, o);
  CHECK(s.indices(0, 3) == std::vector<int64_t>{0, 3, 6, 9});
  CHECK(s.indices(2, 3) == std::vector<int64_t>{2, 5, 8});
  o.drop_last = true;
  ElasticSampler d(10, o);
  CHECK(d.indices(0, 3) == std::vector<int64_t>{0, 3, 6});
  CHECK(d.num_samples(1, 3) == 3);
  CHECK(d.num_samples(2, 3) == 3);
}

TEST_CASE("elastic sampler: state is (epoch, cursor); a joiner continues where the world is") {
  ElasticSamplerOptions o;
  o.seed = 9;
  ElasticSampler world(100, o);
  world.set_epoch(5);
  world.advance(40);  // 4 ranks trained 10 samples each, then a boundary
  ElasticSampler joiner(100, o);
  joiner.load_state(world.state());
  CHECK(joiner.epoch() == 5);
  CHECK(joiner.cursor() == 40);
  CHECK(joiner.indices(2, 3) == world.indices(2, 3));

  CHECK_THROWS_AS(world.advance(61), gpurun::Error);
  CHECK_THROWS_AS(world.indices(3, 3), gpurun::Error);
  CHECK_THROWS_AS(joiner.load_state({1, 101}), gpurun::Error);
  CHECK_THROWS_AS(ElasticSampler(-1), gpurun::Error);
}

TEST_CASE("elastic sampler: windows of a global batch partition it for any world size") {
  // The same global batches (same samples per optimizer step) whatever the world size:
  // what makes an elastic run's loss match a fixed-size run's.
  const int64_t n = 1000, global = 64;
  auto batches_of = [&](std::vector<int> worlds) {  // world size per step (cycled)
    gpurun::ElasticSampler s(n, {.seed = 3});
    s.set_epoch(2);
    std::vector<std::set<int64_t>> out;
    for (size_t step = 0; s.remaining() > 0; ++step) {
      const int w = worlds[step % worlds.size()];
      const int64_t count = std::min(global, s.remaining());
      std::set<int64_t> batch;
      size_t total = 0;
      for (int r = 0; r < w; ++r) {
        auto idx = s.window_indices(count, r, w);
        CHECK(idx.size() == static_cast<size_t>(count / w + (r < count % w ? 1 : 0)));
        total += idx.size();
        batch.insert(idx.begin(), idx.end());
      }
      CHECK(total == static_cast<size_t>(count));
      CHECK(batch.size() == static_cast<size_t>(count));
      out.push_back(batch);
      s.advance(count);
    }
    return out;
  };
  const auto fixed = batches_of({4});
  CHECK(fixed.size() == 16);  // ceil(1000 / 64)
  CHECK(batches_of({1}) == fixed);
  CHECK(batches_of({2, 3, 1, 4, 3}) == fixed);
  gpurun::ElasticSampler s(10);
  CHECK_THROWS_WITH_AS(s.window_indices(11, 0, 1),
                       "ElasticSampler: a window of 11 samples does not fit at cursor 0 of 10 "
                       "(epoch 0)",
                       gpurun::Error);
}
