// The one translation unit that chooses between the CUDA implementations of the compat seam
// (comm/nccl/cuda_memory.cpp) and their CPU fallbacks.
#include "compat/torch_compat.hpp"

#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <chrono>

#include "gpurun/snapshot/snapshot_store.hpp"

#include "gpurun/check.hpp"

#ifndef GPURUN_HAVE_NCCL
#error "GPURUN_HAVE_NCCL must be 0 or 1 (set by CMake on gpurun_worker_runtime)"
#endif

namespace gpurun::rt::compat {

bool have_cuda_build() noexcept {
  return GPURUN_HAVE_NCCL != 0;
}

#if GPURUN_HAVE_NCCL

void release_cached_device_memory() {
  detail::cuda::release_cached_device_memory();
}

HostRegistration::HostRegistration(void* ptr, size_t bytes, bool read_only) noexcept {
  if (ptr != nullptr && bytes > 0 && detail::cuda::host_register(ptr, bytes, read_only)) {
    ptr_ = ptr;
  }
}

HostRegistration::~HostRegistration() {
  if (ptr_ != nullptr) detail::cuda::host_unregister(ptr_);
}

#else  // CPU build: nothing is cached on a device and nothing needs page-locking.

void release_cached_device_memory() {}

HostRegistration::HostRegistration(void* /*ptr*/, size_t /*bytes*/, bool /*read_only*/) noexcept {}

HostRegistration::~HostRegistration() = default;

#endif

HostRegistration& HostRegistration::operator=(HostRegistration&& other) noexcept {
  if (this != &other) {
    HostRegistration old(std::move(*this));
    ptr_ = std::exchange(other.ptr_, nullptr);
  }
  return *this;
}

// ---- host <-> device copies of a state snapshot

void copy_host(const std::vector<HostCopy>& copies, bool to_host, const CopyProgress& done) {
  at::NoGradGuard no_grad;  // parameters are written in place
  bool any_cuda = false;
  for (const HostCopy& c : copies) {
    GPURUN_CHECK(c.tensor.is_contiguous(), "snapshot copy of a non-contiguous {}-dim tensor",
                 c.tensor.dim());
    if (c.tensor.is_cuda()) {
      any_cuda = true;
      continue;
    }
    if (c.tensor.numel() == 0) continue;
    const at::Tensor host =
        at::from_blob(c.host, c.tensor.sizes(), at::TensorOptions().dtype(c.tensor.scalar_type()));
    if (to_host) {
      host.copy_(c.tensor);
    } else {
      c.tensor.copy_(host);
    }
  }
#if GPURUN_HAVE_NCCL
  if (any_cuda) {
    detail::cuda::copy_host_async(copies, to_host, done);
    return;  // it made the final done() call
  }
#else
  GPURUN_CHECK(!any_cuda, "a CUDA tensor in a build without CUDA");
#endif
  if (done) done(copies.size());
}

c10::Stream forked_stream(const at::Device& device) {
#if GPURUN_HAVE_NCCL
  if (device.is_cuda()) return detail::cuda::forked_stream(device);
#endif
  return c10::impl::getDeviceGuardImpl(device.type())->getStream(device);
}

#if GPURUN_HAVE_NCCL
namespace {
// A CUDA device's index: its own, else the current device's.
c10::DeviceIndex cuda_index(const at::Device& device) {
  return device.has_index() ? device.index()
                            : c10::impl::getDeviceGuardImpl(at::kCUDA)->getDevice().index();
}
}  // namespace
#endif

uint64_t device_reserved_bytes(const at::Device& device) noexcept {
#if GPURUN_HAVE_NCCL
  if (device.is_cuda()) {
    try {
      return detail::cuda::device_reserved_bytes(cuda_index(device));
    } catch (const std::exception&) {
      return 0;
    }
  }
#endif
  (void)device;
  return 0;
}

DeviceReservation reserve_device_memory(const at::Device& device, uint64_t hint,
                                        const c10::Stream& stream) noexcept {
  DeviceReservation r;
#if GPURUN_HAVE_NCCL
  if (!device.is_cuda() || hint == 0) return r;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    const c10::DeviceIndex d = cuda_index(device);
    const snapshot::DeviceReservePlan plan = snapshot::plan_device_reserve(
        hint, detail::cuda::device_reserved_bytes(d), detail::cuda::device_free_bytes(d),
        snapshot::DeviceAllocatorEnv::from_environment());
    r.note = plan.note;
    if (plan.bytes > 0) detail::cuda::reserve_cached(d, plan.bytes, stream);
    r.bytes = plan.bytes;
  } catch (const std::exception& e) {
    r.bytes = 0;
    r.note = e.what();
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
#else
  (void)device, (void)hint, (void)stream;
#endif
  return r;
}

}  // namespace gpurun::rt::compat
