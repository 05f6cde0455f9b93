// CUDA side of the compat seam (compat/torch_compat.hpp): compiled only in CUDA builds
// (this directory is added by CMake when GPURUN_HAVE_NCCL). Checked against LibTorch 2.x
// headers: c10::cuda::CUDACachingAllocator::emptyCache() (2.x adds an optional mempool id
// argument, defaulted) and at::cuda::clearCublasWorkspaces() (ATen/cuda/CUDAContext.h).
#include "compat/torch_compat.hpp"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <cuda_runtime_api.h>

namespace gpurun::rt::compat::detail::cuda {

void release_cached_device_memory() {
  // Workspaces first: they are allocations of the caching allocator, freed into its cache,
  // which emptyCache() then returns to the driver.
  at::cuda::clearCublasWorkspaces();
  c10::cuda::CUDACachingAllocator::emptyCache();
}

bool host_register(void* ptr, size_t bytes, bool read_only) noexcept {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    (void)cudaGetLastError();  // so that the next CUDA call does not report this error
    return false;
  }
  const unsigned int flags = read_only ? cudaHostRegisterReadOnly : cudaHostRegisterDefault;
  if (cudaHostRegister(ptr, bytes, flags) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return true;
}

void host_unregister(void* ptr) noexcept {
  if (cudaHostUnregister(ptr) != cudaSuccess) (void)cudaGetLastError();
}

}  // namespace gpurun::rt::compat::detail::cuda
