// gpurun::rt::StateChecksum — the 64-bit checksum of a training state (StateRegistry::checksum):
// bitwise over tensors, computed where the tensors live, plus host values. Internal header.
#pragma once

#include "gpurun/snapshot/format.hpp"

#include <cstdint>
#include <string_view>
#include <utility>
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
///
/// How (the value is defined by the formulas above, not by this): per device, the tensors' words
/// are packed into chunks of at most `chunk_words` (a tensor may span chunks), each chunk's
/// inclusive prefix sums C1 = cumsum(w) and C2 = cumsum(C1) are taken in int64, and per piece
/// [b, e) of length L: S = C1[e-1] − C1[b-1], Σ (i−b+1)·w_i = L·S − (C2[e-2] − C2[b-1]) +
/// (L−1)·C1[b-1] (Abel summation; C[−1] = 0); a piece that starts at word k of its tensor adds
/// k·S to the tensor's P. About ten tensor operations per chunk instead of about ten per tensor
/// (a ViT-H state has ~1,200 tensors: the per-tensor form was launch-bound, ~0.15 s on an H200).
/// CPU tensors take cpu_word_sums() instead (CpuSums::kLoop): one plain pass over their bytes,
/// no temporary memory; the same S and P (tested equal on every dtype and odd sizes).
class StateChecksum {
 public:
  /// How CPU tensors' sums are taken: kLoop, cpu_word_sums() (0.13-0.16 s per GB and thread
  /// on the 2-core CI machine, against 3.8-18 s per GB for the prefix sums there,
  /// docs/results.md#elastic-nodes-on-loopback-2026-12-06); kPrefixSums, the device path
  /// above on the CPU too (for tests: the two must agree).
  enum class CpuSums { kLoop, kPrefixSums };

  /// `chunk_words`: words (4 bytes) per chunk of the prefix-sum path, > 0; temporary device
  /// memory per chunk is about 20 bytes per word (the packed words and two int64 prefix sums).
  explicit StateChecksum(int64_t chunk_words = kDefaultChunkWords, CpuSums cpu = CpuSums::kLoop);
  static constexpr int64_t kDefaultChunkWords = int64_t{32} << 20;  // 128 MiB of state

  /// Records `t` (a reference: it must not change before finish()). No device work yet.
  void add_tensor(const at::Tensor& t);
  void add(uint64_t value);
  void add(int64_t value) { add(static_cast<uint64_t>(value)); }
  /// The IEEE-754 bits of `value`.
  void add(double value);
  void add(std::string_view bytes);

  /// The checksum. Queues the device work for every recorded tensor and blocks until it is done
  /// (one device→host copy per device).
  uint64_t finish() const;

  /// Each recorded tensor's (S, P), in the order of the add_tensor calls. Blocks like finish().
  std::vector<std::pair<uint64_t, uint64_t>> tensor_sums() const;

 private:
  struct TensorEntry {
    std::vector<uint64_t> meta;  ///< shape and dtype name hash
    at::Tensor words;            ///< int32 [n] view of the bytes (padded): the prefix-sum path
    at::Tensor host;             ///< the tensor itself: a CPU tensor for cpu_word_sums()
  };                             // neither when n = 0
  int64_t chunk_words_;
  CpuSums cpu_;
  std::vector<TensorEntry> tensors_;
  std::vector<uint64_t> values_;
};

/// The per-tensor sums (S, P) of StateChecksum's definition of CPU tensors (any dtype, shape,
/// strides), in order: one plain pass over each tensor's bytes (a contiguous copy only of a
/// non-contiguous tensor), in pieces of 16 MiB spread over ATen's intra-op threads
/// (at::parallel_for: OMP_NUM_THREADS / at::set_num_threads; one thread inside a parallel
/// region). A piece starting at word k of its tensor adds its S and Σ (j+1)·w_j + k·S: exact
/// modulo 2^64, so the value does not depend on the number of threads. Blocks; throws
/// InvariantError for a tensor not on the CPU.
std::vector<std::pair<uint64_t, uint64_t>> cpu_word_sums(const std::vector<at::Tensor>& ts);

/// The per-tensor sums (S, P) of StateChecksum's definition computed the direct way (one
/// int64 copy of the words and an arange per tensor). The reference for tests.
std::pair<uint64_t, uint64_t> reference_sums(const at::Tensor& t);

/// Runs StateChecksum once on a few bytes on `device` (a uint8 tensor that needs padding and a
/// float one, in one chunk), so that the kernels it launches are loaded: CUDA loads a kernel
/// at its first launch (lazy loading), and a joiner's first checksum comes right after the
/// state handoff, where its peers wait for it. Blocks until done (milliseconds once CUDA is
/// set up); a no-op for a CPU device.
void warm_checksum_kernels(const at::Device& device);

/// splitmix64's output function of `x` (a bijection on 64-bit words).
uint64_t splitmix64(uint64_t x);

/// FNV-1a of metadata (dtype names, manifests): gpurun/snapshot/format.hpp.
using snapshot::fnv1a64;

}  // namespace gpurun::rt
