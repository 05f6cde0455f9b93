// gpurun::CudaAutocast — mixed precision for a training step on CUDA, the same on every
// LibTorch version gpurun builds against (1.13 and 2.x name the autocast switches differently).
#pragma once

#include <c10/core/ScalarType.h>

namespace gpurun {

/// RAII scope of LibTorch's CUDA autocast, the C++ counterpart of Python's
/// `with torch.autocast("cuda", dtype=torch.bfloat16):`. Inside the scope, CUDA ops on the
/// autocast lists (matmul, linear, conv, attention...) run in `dtype` on float32 inputs;
/// the others stay float32. Put the forward pass and the loss inside the scope and the
/// backward pass outside, as in Python.
///
/// On destruction the previous autocast state (enabled flag and dtype) is restored, and when
/// the outermost scope ends the cache of cast weights is cleared — without that, a weight
/// updated in place by the optimizer would be served from its stale low-precision copy at the
/// next step. Scopes nest; they are per thread (autocast state is thread-local).
///
/// `enabled = false` makes the scope a no-op, so a flag (`--bf16`) can decide at run time.
/// CPU tensors are unaffected (CPU autocast is not switched on). Never throws.
class CudaAutocast {
 public:
  explicit CudaAutocast(bool enabled = true, c10::ScalarType dtype = c10::ScalarType::BFloat16);
  ~CudaAutocast();
  CudaAutocast(const CudaAutocast&) = delete;
  CudaAutocast& operator=(const CudaAutocast&) = delete;

 private:
  bool active_ = false;           ///< this scope switched autocast on
  bool prev_enabled_ = false;     ///< CUDA autocast flag before the scope
  c10::ScalarType prev_dtype_{};  ///< CUDA autocast dtype before the scope
};

}  // namespace gpurun
