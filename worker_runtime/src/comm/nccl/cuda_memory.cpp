// CUDA side of the compat seam (compat/torch_compat.hpp): compiled only in CUDA builds
// (this directory is added by CMake when GPURUN_HAVE_NCCL). Checked against LibTorch 2.x
// headers: c10::cuda::CUDACachingAllocator::emptyCache() (2.x adds an optional mempool id
// argument, defaulted), at::cuda::clearCublasWorkspaces() (ATen/cuda/CUDAContext.h),
// c10::cuda::getStreamFromPool(bool, DeviceIndex), at::cuda::CUDAEvent::record/block.
#include "compat/torch_compat.hpp"

#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <memory>
#include <utility>

namespace gpurun::rt::compat::detail::cuda {

void release_cached_device_memory() {
  // Workspaces first: they are allocations of the caching allocator, freed into its cache,
  // which emptyCache() then returns to the driver.
  at::cuda::clearCublasWorkspaces();
  c10::cuda::CUDACachingAllocator::emptyCache();
}

uint64_t device_reserved_bytes(c10::DeviceIndex device) {
  // Index 2 of the stat arrays is StatType::LARGE_POOL (blocks over 1 MiB: what one large
  // segment can serve), in 1.13 and 2.x alike (0 AGGREGATE, 1 SMALL_POOL).
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device);
  return static_cast<uint64_t>(stats.reserved_bytes[2].current);
}

uint64_t device_free_bytes(c10::DeviceIndex device) {
  const c10::cuda::CUDAGuard guard(device);
  size_t free = 0, total = 0;
  C10_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  return free;
}

void reserve_cached(c10::DeviceIndex device, uint64_t bytes, const c10::Stream& stream) {
  const c10::cuda::CUDAGuard guard(device);
  const c10::cuda::CUDAStream on(c10::cuda::CUDAStream::UNCHECKED, stream);
  void* p = c10::cuda::CUDACachingAllocator::raw_alloc_with_stream(bytes, on.stream());
  c10::cuda::CUDACachingAllocator::raw_delete(p);  // the segment stays cached for `stream`
}

bool host_register(void* ptr, size_t bytes, bool read_only) noexcept {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    (void)cudaGetLastError();  // so that the next CUDA call does not report this error
    return false;
  }
  // Portable: page-locked for every device's context, not only the current one.
  const unsigned int flags =
      cudaHostRegisterPortable | (read_only ? cudaHostRegisterReadOnly : cudaHostRegisterDefault);
  if (cudaHostRegister(ptr, bytes, flags) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return true;
}

void host_unregister(void* ptr) noexcept {
  if (cudaHostUnregister(ptr) != cudaSuccess) (void)cudaGetLastError();
}

c10::Stream forked_stream(const at::Device& device) {
  const c10::DeviceIndex d = device.has_index() ? device.index() : c10::cuda::current_device();
  c10::cuda::CUDAGuard guard(d);
  c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, d);
  at::cuda::CUDAEvent queued;
  queued.record(c10::cuda::getCurrentCUDAStream(d));
  queued.block(side);
  return side.unwrap();
}

void copy_host_async(const std::vector<HostCopy>& copies, bool to_host, const CopyProgress& done) {
  // One side stream per device the tensors live on (one, in a worker), each made to wait for
  // what that device's current stream has queued (the last optimizer step, or the allocation
  // of freshly materialised tensors).
  std::vector<c10::DeviceIndex> devices;
  std::vector<c10::cuda::CUDAStream> streams;
  for (const HostCopy& c : copies) {
    if (!c.tensor.is_cuda()) continue;
    const c10::DeviceIndex d = c.tensor.device().index();
    if (std::find(devices.begin(), devices.end(), d) != devices.end()) continue;
    c10::cuda::CUDAGuard guard(d);
    c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, d);
    at::cuda::CUDAEvent queued;
    queued.record(c10::cuda::getCurrentCUDAStream(d));
    queued.block(side);
    devices.push_back(d);
    streams.push_back(side);
  }
  // Progress marks (one device only): an event after about every kCopyProgressBytes, with
  // the number of copies complete once it has fired.
  const bool marks = done && devices.size() == 1;
  std::vector<std::pair<std::unique_ptr<at::cuda::CUDAEvent>, size_t>> fired;
  try {
    size_t since_mark = 0;
    for (size_t i = 0; i < copies.size(); ++i) {
      const HostCopy& c = copies[i];
      if (!c.tensor.is_cuda() || c.tensor.numel() == 0) continue;
      const size_t k = static_cast<size_t>(
          std::find(devices.begin(), devices.end(), c.tensor.device().index()) - devices.begin());
      c10::cuda::CUDAGuard guard(devices[k]);
      void* device_ptr = c.tensor.data_ptr();
      C10_CUDA_CHECK(cudaMemcpyAsync(
          to_host ? static_cast<void*>(c.host) : device_ptr,
          to_host ? device_ptr : static_cast<const void*>(c.host), c.tensor.nbytes(),
          to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice, streams[k].stream()));
      since_mark += c.tensor.nbytes();
      if (marks && since_mark >= kCopyProgressBytes) {
        fired.emplace_back(std::make_unique<at::cuda::CUDAEvent>(), i + 1);
        fired.back().first->record(streams[k]);
        since_mark = 0;
      }
    }
    for (auto& [event, n] : fired) {
      event->synchronize();
      done(n);
    }
  } catch (...) {
    // Copies queued before the failure may still be running: they must end before the caller
    // unmaps or unregisters their host ranges.
    for (c10::cuda::CUDAStream& s : streams)
      if (cudaStreamSynchronize(s.stream()) != cudaSuccess) (void)cudaGetLastError();
    throw;
  }
  // The one wait: the host bytes (to_host) or the tensors (!to_host) are complete after it, so
  // the current streams may use the tensors without further ordering.
  for (c10::cuda::CUDAStream& s : streams) s.synchronize();
  if (done) done(copies.size());
}

}  // namespace gpurun::rt::compat::detail::cuda
