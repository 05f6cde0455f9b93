// gpurun::rt::GradientSync — averages the gradients of a fixed list of parameters over the
// group of a Communicator, in DDP-style buckets (flat buffers, one all-reduce per bucket).
// Internal header: not part of the public API.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include <ATen/ATen.h>

#include "comm/communicator.hpp"

namespace gpurun::rt {

struct GradientSyncOptions {
  /// Upper bound of one bucket's flat buffer, in bytes (DDP's default: 25 MiB). A parameter
  /// larger than the cap gets a bucket of its own. Must be > 0.
  int64_t bucket_cap_bytes = int64_t{25} << 20;
};

/// Bucketing: parameters are taken in reverse order (the order backward produces their
/// gradients) and appended to the open bucket of their (dtype, device); a bucket is closed
/// when the next parameter would push it past bucket_cap_bytes. So a bucket holds a single
/// dtype, and every rank computes the same layout from the same parameter list.
///
/// Buffers: one flat buffer per bucket (numel = sum of its parameters' numel, the bucket's
/// dtype, the parameters' device), allocated by the first average() and reused; release()
/// frees them (e.g. while offloading) and the next average() allocates them again.
///
/// Threads: not thread-safe; one thread calls every method.
class GradientSync {
 public:
  /// `params`: the parameters whose .grad() is averaged (typically those with
  /// requires_grad()); shared handles, not copies. Parameters may differ in dtype and shape;
  /// all must be on the communicator's device. Throws gpurun::Error on an undefined
  /// parameter or a non-positive bucket cap.
  explicit GradientSync(std::vector<at::Tensor> params, GradientSyncOptions options = {});
  /// Same, with only the bucket cap (bytes).
  GradientSync(std::vector<at::Tensor> params, int64_t bucket_cap_bytes);

  /// The communicator of the current generation (nullptr: none). Not owned; must outlive
  /// its use here. Call with the new one whenever a new generation starts.
  void set_communicator(Communicator* comm) { comm_ = comm; }
  Communicator* communicator() const { return comm_; }

  /// Replaces every parameter's gradient by its mean over the group:
  ///   grad_p <- (sum over ranks r of grad_p on r) / size().
  /// A parameter whose gradient is undefined on this rank contributes zeros; afterwards its
  /// gradient is defined and holds the same mean as on every other rank (zeros if no rank
  /// had a gradient for it).
  /// Gradients keep their shape, dtype and strides; float16/bfloat16 buckets are summed by the
  /// communicator (Gloo: in float32) and divided in their own dtype.
  ///
  /// Blocks until every bucket is averaged and written back (NCCL: also waits for the stream,
  /// through Communicator::synchronize). The gradients are written only after every bucket's
  /// all-reduce succeeded, so on CommError they are unchanged and average() can be repeated
  /// with the next generation's communicator.
  ///
  /// Throws CommError (a peer failed, timeout), gpurun::Error when no communicator is set or
  /// a gradient's shape, dtype or device differs from its parameter's.
  void average();

  /// Frees the flat buffers (their memory goes back to the allocator). Never throws.
  void release() noexcept;

  /// Parameter indices (into the constructor's list) of each bucket, in all-reduce order.
  std::vector<std::vector<size_t>> bucket_layout() const;
  size_t num_buckets() const { return buckets_.size(); }
  /// Bytes held by the flat buffers now (0 after release()).
  int64_t buffer_bytes() const;

 private:
  struct Bucket {
    at::ScalarType dtype;
    at::Device device;
    std::vector<size_t> params;   // indices into params_
    std::vector<int64_t> offset;  // element offset of each parameter in the flat buffer
    int64_t numel = 0;
    at::Tensor flat;  // undefined until allocated
  };

  std::vector<at::Tensor> params_;
  GradientSyncOptions options_;
  std::vector<Bucket> buckets_;
  Communicator* comm_ = nullptr;
};

}  // namespace gpurun::rt
