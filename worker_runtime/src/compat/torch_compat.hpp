// gpurun::rt::compat — the one place where the worker runtime meets differences between the
// LibTorch versions it builds against (Debian's 1.13 CPU build, 2.11 + CUDA 13 on the GPU
// machine) and between CPU and CUDA builds. Everything else calls these functions and stays
// free of version checks and of CUDA headers. Internal header.
//
// Differences handled here:
//   * Optimizer::state() key: std::string (the TensorImpl address printed by
//     c10::guts::to_string) in 1.13; void* (the TensorImpl address) in 2.x.
//   * CUDA-only calls (caching allocator, cuBLAS workspaces, cudaHostRegister): implemented
//     in comm/nccl/cuda_memory.cpp, compiled only in CUDA builds; torch_compat.cpp picks them
//     or the CPU fallbacks (GPURUN_HAVE_NCCL), so no other file needs a CUDA #if.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <torch/torch.h>

namespace gpurun::rt::compat {

/// The map type of torch::optim::Optimizer::state() in this LibTorch version.
using OptimizerStateMap =
    std::remove_cvref_t<decltype(std::declval<torch::optim::Optimizer&>().state())>;
using OptimizerStateKey = OptimizerStateMap::key_type;

namespace detail {

template <class Key>
Key state_key_of(c10::TensorImpl* impl) {
  if constexpr (std::is_same_v<Key, std::string>) {
    // LibTorch 1.13: c10::guts::to_string(TensorImpl*), which streams the pointer, i.e. the
    // `const void*` overload of operator<< (same text, no dependency on c10::guts).
    std::ostringstream os;
    os << static_cast<const void*>(impl);
    return os.str();
  } else {
    // LibTorch 2.x: the TensorImpl address itself (void*).
    return static_cast<Key>(impl);
  }
}

}  // namespace detail

/// The key under which `optimizer.state()` stores the state of `param` (same TensorImpl as the
/// optimizer's own copy of the parameter). Never throws (1.13: may allocate).
inline OptimizerStateKey optimizer_state_key(const at::Tensor& param) {
  return detail::state_key_of<OptimizerStateKey>(param.unsafeGetTensorImpl());
}

/// True in builds with the CUDA code paths (GPURUN_HAVE_NCCL=1).
bool have_cuda_build() noexcept;

/// Returns the CUDA caching allocator's unused cached blocks to the driver
/// (c10::cuda::CUDACachingAllocator::emptyCache) and drops cuBLAS workspaces
/// (at::cuda::clearCublasWorkspaces), so that freed tensors stop counting in nvidia-smi.
/// Blocks until the allocator is done (it synchronises the devices it frees on).
/// No-op in CPU builds. Throws c10::Error on a CUDA failure.
void release_cached_device_memory();

/// Page-locks a host range for fast device<->host copies (cudaHostRegister; read_only:
/// cudaHostRegisterReadOnly, for mappings opened PROT_READ) and unregisters it on
/// destruction. Best effort: when registration is impossible (CPU build, no device,
/// the driver refuses), pinned() is false and copies still work, only slower. Never throws.
class HostRegistration {
 public:
  HostRegistration() = default;
  HostRegistration(void* ptr, size_t bytes, bool read_only) noexcept;
  ~HostRegistration();
  HostRegistration(const HostRegistration&) = delete;
  HostRegistration& operator=(const HostRegistration&) = delete;
  HostRegistration(HostRegistration&& other) noexcept : ptr_(std::exchange(other.ptr_, nullptr)) {}
  HostRegistration& operator=(HostRegistration&& other) noexcept;

  bool pinned() const noexcept { return ptr_ != nullptr; }
  /// Forgets the registration without undoing it: the CUDA context's teardown at the
  /// process's end unpins the range. For a process about to exit. Never throws.
  void leave_to_exit() noexcept { ptr_ = nullptr; }

 private:
  void* ptr_ = nullptr;  ///< registered base address; nullptr when not pinned
};

namespace detail::cuda {
// Defined in comm/nccl/cuda_memory.cpp, which exists only in CUDA builds: call the
// functions above instead (torch_compat.cpp selects these or the CPU fallbacks).
void release_cached_device_memory();
bool host_register(void* ptr, size_t bytes, bool read_only) noexcept;
void host_unregister(void* ptr) noexcept;
}  // namespace detail::cuda

// ---- host <-> device copies of a state snapshot (StateRegistry::write_snapshot/read_snapshot)

/// One tensor and the host bytes it is copied to or from.
struct HostCopy {
  at::Tensor tensor;        ///< contiguous; any device
  uint8_t* host = nullptr;  ///< tensor.nbytes() bytes (page-locked or not)
};

/// Copies every tensor's bytes to its host range (to_host) or every host range into its
/// tensor (!to_host), and blocks until all of them are done. CUDA tensors (CUDA builds): one
/// cudaMemcpyAsync per tensor on one side stream per device, ordered after the work already
/// queued on that device's current stream, the side streams synchronised at the end (and on
/// an error, before it is thrown: no copy is still running then); fastest when the host
/// ranges are page-locked (HostRegistration). Other tensors: plain copies (at::Tensor::copy_).
/// Throws c10::Error on a CUDA failure, gpurun::InvariantError for a non-contiguous tensor.
///
/// `done` (optional) reports progress on the calling thread while it blocks: done(n) means
/// copies [0, n) are complete; n only grows and the last call is done(copies.size()). CUDA
/// tensors on one device: every copy is queued at once with an event about every
/// kCopyProgressBytes, each waited for in turn (the snapshot write hashes what has landed
/// while the rest copies); tensors on several devices: only the final call.
using CopyProgress = std::function<void(size_t)>;
inline constexpr size_t kCopyProgressBytes = size_t{64} << 20;
void copy_host(const std::vector<HostCopy>& copies, bool to_host, const CopyProgress& done = {});

/// A stream of `device` whose work runs after everything queued so far on the calling
/// thread's current stream of that device, and does not queue behind what that stream gets
/// next: CUDA, a pool stream made to wait on an event recorded now; other devices, the current
/// stream. For work handed to another thread (the pause's state checksum while the snapshot
/// copies run). Throws c10::Error on a CUDA failure.
c10::Stream forked_stream(const at::Device& device);

/// The bytes the CUDA caching allocator holds on `device` in its large pool (segments for
/// blocks over 1 MiB, in use or cached: torch.cuda.memory_stats' reserved_bytes.large_pool;
/// the small pool, other streams' and graphs' blocks cannot use one reserved segment, so they
/// are not counted). 0 for another device, a CPU build or on any error. Never throws.
uint64_t device_reserved_bytes(const at::Device& device) noexcept;

/// What reserve_device_memory() did: `bytes` newly reserved (0: nothing) and, when it reserved
/// less than asked, why (`note`, empty otherwise).
struct DeviceReservation {
  uint64_t bytes = 0;
  double seconds = 0;  ///< the allocation and its release into the cache
  std::string note;
};

/// Grows the CUDA caching allocator's cache on `device` towards `hint` bytes reserved (a pause
/// snapshot's SnapshotHeader::device_reserved_bytes), by as much as
/// snapshot::plan_device_reserve says (its caps and exceptions): one allocation on `stream`,
/// released at once. The segment stays cached for that stream's allocations (pass the
/// program's training stream), so the first training step carves its gradients and
/// activations from it instead of making hundreds of cudaMalloc calls of its own (C++ ViT-H
/// resume, one H100: its first step 639-725 -> 559-622 ms; the 21 GB allocation itself ~1 ms;
/// docs/results.md, eleventh day). Nothing for a non-CUDA device or build. Blocks for the
/// allocation. Never throws: a failed allocation leaves nothing reserved and says so in `note`.
DeviceReservation reserve_device_memory(const at::Device& device, uint64_t hint,
                                        const c10::Stream& stream) noexcept;

namespace detail::cuda {
// Defined in comm/nccl/cuda_memory.cpp (CUDA builds only): the CUDA tensors of `copies`
// (others are skipped), as copy_host describes; `done` as copy_host's, counting every copy.
void copy_host_async(const std::vector<HostCopy>& copies, bool to_host, const CopyProgress& done);
c10::Stream forked_stream(const at::Device& device);
uint64_t device_reserved_bytes(c10::DeviceIndex device);
// Allocates `bytes` on `stream` through the caching allocator and frees them at once.
void reserve_cached(c10::DeviceIndex device, uint64_t bytes, const c10::Stream& stream);
uint64_t device_free_bytes(c10::DeviceIndex device);
}  // namespace detail::cuda

}  // namespace gpurun::rt::compat
