// gpurun::ElasticSampler — which dataset indices each rank trains on, so that every
// sample is seen exactly once per epoch whatever resizes happen at boundaries.
// Design: docs/worker-runtime.md#what-happens-at-a-boundary (how steps deal the sampler's
// permutation); used by the worker runtime.
#pragma once

#include <cstdint>
#include <vector>

namespace gpurun {

/// Options of an ElasticSampler; defaults match torch's DistributedSampler.
struct ElasticSamplerOptions {
  /// Base seed; the permutation of an epoch depends only on (seed, epoch).
  uint64_t seed = 0;
  /// false: identity order (0, 1, 2, ...) every epoch.
  bool shuffle = true;
  /// true: each rank gets floor(remaining / world) indices, the tail of the epoch is
  /// skipped (ranks stay in lock step); false: shares differ by at most one and every
  /// index is used exactly once (no padding, unlike DistributedSampler).
  bool drop_last = false;
};

/// One global permutation per (seed, epoch), shared by every rank; the part not yet
/// consumed in this epoch (from `cursor()`) is dealt out strided by rank:
/// rank r of world W takes remaining[r], remaining[r + W], ... So after every rank has
/// consumed k samples (k per rank, in order), exactly the first k·W remaining indices are
/// used, and a boundary can change W without repeating or skipping a sample: call
/// advance(k·W) on every rank, then ask for the new share.
///
/// Deterministic across platforms and compilers (its own Fisher–Yates over
/// std::mt19937_64, not std::shuffle, whose algorithm is unspecified). Not thread-safe;
/// no call blocks. Indices are int64 positions in [0, dataset_size).
class ElasticSampler {
 public:
  /// Throws gpurun::Error if dataset_size < 0.
  ElasticSampler(int64_t dataset_size, ElasticSamplerOptions options = {});

  /// Starts `epoch` (>= 0): new permutation, cursor back to 0.
  void set_epoch(int64_t epoch);
  /// Marks `samples` more of this epoch as consumed by the whole world (sum over ranks).
  /// Throws gpurun::Error if that passes the end of the epoch.
  void advance(int64_t samples);

  /// This rank's indices of the rest of the epoch (from the cursor), in training order.
  /// Throws gpurun::Error unless 0 <= rank < world.
  std::vector<int64_t> indices(int rank, int world) const;
  /// This rank's indices among the next `count` unconsumed samples (window positions
  /// rank, rank + world, ... < count), in training order. Over all ranks of a world the
  /// windows partition those `count` samples, whatever the world size: this is how a global
  /// batch is split (then advance(count)). Throws gpurun::Error unless 0 <= rank < world
  /// and 0 <= count <= dataset_size() - cursor().
  std::vector<int64_t> window_indices(int64_t count, int rank, int world) const;
  /// Samples of the current epoch not consumed yet.
  int64_t remaining() const { return size_ - cursor_; }
  /// Number of indices(rank, world) would return, without building them.
  int64_t num_samples(int rank, int world) const;

  int64_t epoch() const { return epoch_; }
  /// Samples of the current epoch already consumed by the world.
  int64_t cursor() const { return cursor_; }
  int64_t dataset_size() const { return size_; }
  const ElasticSamplerOptions& options() const { return options_; }

  /// What a joiner needs to continue exactly where the world is: (epoch, cursor). The
  /// permutation is recomputed from the seed, so the state is two integers.
  struct State {
    int64_t epoch = 0;
    int64_t cursor = 0;
  };
  State state() const { return {epoch_, cursor_}; }
  /// Throws gpurun::Error if the state does not fit this dataset.
  void load_state(State s);

 private:
  int64_t size_;
  ElasticSamplerOptions options_;
  int64_t epoch_ = 0;
  int64_t cursor_ = 0;
  std::vector<int64_t> perm_;
};

}  // namespace gpurun
