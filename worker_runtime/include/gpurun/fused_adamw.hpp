// gpurun::FusedAdamW — one AdamW step of a torch::optim::AdamW through PyTorch's fused
// multi-tensor CUDA kernel (the kernel behind Python's torch.optim.AdamW(fused=True)).
#pragma once

#include <cstdint>
#include <unordered_map>

#include <torch/torch.h>

namespace gpurun {

/// Steps a `torch::optim::AdamW` with `at::_fused_adamw_`: one kernel launch per parameter
/// group instead of LibTorch's ~8 element-wise kernels per parameter (AdamW::step()), which
/// on a ViT-H (630 M parameters, 390 tensors) costs several milliseconds of launches and extra
/// memory traffic per step. The optimizer object stays the source of truth: its per-parameter
/// state (exp_avg, exp_avg_sq, step) is created and updated exactly as AdamW::step() does, so
/// gpurun's state tracking, handoffs and pause snapshots see an ordinary AdamW.
///
/// Math (Loshchilov & Hutter 2019, Algorithm 2, as in torch.optim.AdamW): for each parameter p
/// with gradient g, step t: p ← p·(1 − lr·wd); m ← β1·m + (1−β1)·g; v ← β2·v + (1−β2)·g²;
/// p ← p − lr/(1−β1^t) · m / (√v/√(1−β2^t) + eps). Results equal AdamW::step() up to float
/// rounding (the fused kernel evaluates the same formula in one pass).
///
/// Falls back to `AdamW::step()` (same result, no fusion) when the kernel does not apply: a
/// LibTorch without it (1.13), a parameter not on a CUDA device, a group mixing devices or
/// dtypes, or amsgrad. `fused()` says which path the last step() took.
///
/// step() blocks only as long as AdamW::step() does (kernel launches are asynchronous on the
/// current CUDA stream). Not thread-safe; one FusedAdamW per optimizer. Throws what the
/// underlying kernel or AdamW::step() throws (c10::Error).
class FusedAdamW {
 public:
  /// `opt` must outlive this object.
  explicit FusedAdamW(torch::optim::AdamW& opt) : opt_(opt) {}

  /// One optimizer step over every parameter with a defined gradient.
  void step();

  /// True when the last step() used the fused kernel for every parameter group.
  bool fused() const noexcept { return fused_; }

 private:
  struct StepCounter {
    torch::Tensor value;  ///< float32 scalar on the parameter's device, as the kernel wants
    int64_t mirrors = 0;  ///< the AdamWParamState::step() that `value` holds
  };
  torch::optim::AdamW& opt_;
  std::unordered_map<const void*, StepCounter> steps_;  ///< by the parameter's TensorImpl
  bool fused_ = false;
};

}  // namespace gpurun
