// gpurun::rt::StateChecksum — the 64-bit checksum of a training state (StateRegistry::checksum):
// bitwise over tensors, computed where the tensors live, plus host values. Internal header.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include <ATen/ATen.h>

namespace gpurun::rt {

/// Accumulates tensors and host values, then mixes them into one 64-bit value.
///
/// Per tensor (any dtype, any device, any shape): its bytes are read as native (little-endian on
/// every supported host and GPU) 32-bit words w_i, i = 0…n-1 (the last word zero-padded), and two
/// integer sums are computed on the tensor's device, modulo 2^64: S = Σ w_i and P = Σ (i+1)·w_i. S
/// changes when any bit changes; P also when words move. The sums are exact integers, so they do
/// not depend on reduction order: equal bytes give equal sums on CPU and CUDA. finish() folds, in
/// the order of the add calls, each tensor's shape, dtype name, S and P, then every host value,
/// through splitmix64 (Steele, Lea, Flood: "Fast splittable pseudorandom number generators", 2014).
/// Not cryptographic: it detects corruption and divergence, not tampering.
class StateChecksum {
 public:
  /// Queues the device work for `t` (device memory: two int64 copies of at most 16 Mi words at
  /// a time). Does not block on CUDA.
  void add_tensor(const at::Tensor& t);
  void add(uint64_t value);
  void add(int64_t value) { add(static_cast<uint64_t>(value)); }
  /// The IEEE-754 bits of `value`.
  void add(double value);
  void add(std::string_view bytes);

  /// The checksum. Blocks until the device work queued by add_tensor is done (one
  /// device→host copy of 16 bytes per tensor, batched per device).
  uint64_t finish() const;

 private:
  struct TensorEntry {
    std::vector<uint64_t> meta;  ///< shape and dtype name hash
    at::Tensor sums;             ///< int64 [2] on the tensor's device: S, P
  };
  std::vector<TensorEntry> tensors_;
  std::vector<uint64_t> values_;
};

/// splitmix64's output function of `x` (a bijection on 64-bit words).
uint64_t splitmix64(uint64_t x);

/// FNV-1a, 64-bit (Fowler, Noll, Vo; offset basis 0xcbf29ce484222325, prime 0x100000001b3)
/// of `bytes`. Used for metadata (dtype names, manifests), not for tensor data.
uint64_t fnv1a64(std::string_view bytes);

}  // namespace gpurun::rt
