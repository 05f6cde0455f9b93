// gpurun::CudaAutocast over the autocast switches of the LibTorch version at hand: part of the
// compat seam (src/compat/). LibTorch 1.13 has one CUDA switch (at::autocast::set_enabled,
// set_autocast_gpu_dtype); 2.4 and later take the device type (set_autocast_enabled(kCUDA, ..),
// set_autocast_dtype(kCUDA, ..)).
#include "gpurun/autocast.hpp"

#include <ATen/autocast_mode.h>
#include <torch/version.h>

namespace gpurun {
namespace {

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
bool cuda_enabled() {
  return at::autocast::is_autocast_enabled(at::kCUDA);
}
void set_cuda_enabled(bool on) {
  at::autocast::set_autocast_enabled(at::kCUDA, on);
}
c10::ScalarType cuda_dtype() {
  return at::autocast::get_autocast_dtype(at::kCUDA);
}
void set_cuda_dtype(c10::ScalarType t) {
  at::autocast::set_autocast_dtype(at::kCUDA, t);
}
#else
bool cuda_enabled() {
  return at::autocast::is_enabled();
}
void set_cuda_enabled(bool on) {
  at::autocast::set_enabled(on);
}
c10::ScalarType cuda_dtype() {
  return at::autocast::get_autocast_gpu_dtype();
}
void set_cuda_dtype(c10::ScalarType t) {
  at::autocast::set_autocast_gpu_dtype(t);
}
#endif

}  // namespace

CudaAutocast::CudaAutocast(bool enabled, c10::ScalarType dtype) {
  if (!enabled) return;
  active_ = true;
  prev_enabled_ = cuda_enabled();
  prev_dtype_ = cuda_dtype();
  set_cuda_enabled(true);
  set_cuda_dtype(dtype);
  at::autocast::increment_nesting();
}

CudaAutocast::~CudaAutocast() {
  if (!active_) return;
  // The outermost scope drops the cast weights (Python's autocast does the same on exit).
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  set_cuda_enabled(prev_enabled_);
  set_cuda_dtype(prev_dtype_);
}

}  // namespace gpurun
