// StateRegistry's snapshot files: write, read, prepare, adopt and close (the format and the
// file's life: worker_runtime/snapshot); the page-locking seam they use.
#include <algorithm>
#include <chrono>
#include <exception>
#include <mutex>
#include <optional>
#include <thread>

#include <c10/core/impl/DeviceGuardImplInterface.h>

#include "gpurun/check.hpp"
#include "gpurun/snapshot/snapshot_store.hpp"
#include "state/state_registry_impl.hpp"

namespace gpurun::rt {
namespace detail {
namespace {

// snapshot::SnapshotFile::pin() through this build's LibTorch seam (cudaHostRegister in CUDA
// builds with a device; nothing on the CPU).
class RegisteredPin final : public snapshot::HostPin {
 public:
  explicit RegisteredPin(compat::HostRegistration r) : r_(std::move(r)) {}
  void leave_to_exit() noexcept override { r_.leave_to_exit(); }

 private:
  compat::HostRegistration r_;
};

}  // namespace

void install_host_pinner() {
  static std::once_flag once;
  std::call_once(once, [] {
    snapshot::set_host_pinner(
        [](uint8_t* data, size_t bytes, bool read_only) -> std::unique_ptr<snapshot::HostPin> {
          compat::HostRegistration r(data, bytes, read_only);
          if (!r.pinned()) return nullptr;
          return std::make_unique<RegisteredPin>(std::move(r));
        });
  });
}

}  // namespace detail

// ---- snapshots -----------------------------------------------------------------------------

namespace {

using SteadyClock = std::chrono::steady_clock;

double seconds_since(SteadyClock::time_point t0) {
  return std::chrono::duration<double>(SteadyClock::now() - t0).count();
}

bool any_on_device(const std::vector<at::Tensor>& tensors) {
  return std::any_of(tensors.begin(), tensors.end(),
                     [](const at::Tensor& t) { return !t.is_cpu(); });
}

// The device of the first CUDA tensor (the one whose allocator a snapshot's device-memory hint
// describes), or none.
std::optional<at::Device> cuda_device_of(const std::vector<at::Tensor>& tensors) {
  const auto it =
      std::find_if(tensors.begin(), tensors.end(), [](const at::Tensor& t) { return t.is_cuda(); });
  if (it == tensors.end()) return std::nullopt;
  return it->device();
}

// One snapshot's layout (snapshot::SnapshotLayout) with its tensors (canonical order).
struct SnapshotPlan : snapshot::SnapshotLayout {
  std::vector<at::Tensor> tensors;

  SnapshotPlan(std::string manifest_text, std::vector<at::Tensor> ts)
      : SnapshotLayout(std::move(manifest_text), sizes_of(ts), any_on_device(ts)),
        tensors(std::move(ts)) {}

  static std::vector<uint64_t> sizes_of(const std::vector<at::Tensor>& ts) {
    std::vector<uint64_t> sizes;
    for (const at::Tensor& t : ts) sizes.push_back(t.nbytes());
    return sizes;
  }

  // Every tensor with its range of the mapping at `base`.
  std::vector<compat::HostCopy> copies(uint8_t* base) const {
    std::vector<compat::HostCopy> out;
    for (size_t i = 0; i < tensors.size(); ++i) out.push_back({tensors[i], base + offsets[i]});
    return out;
  }
};

// The payload fill of `plan` (snapshot::PayloadFill): copies every host tensor in file order,
// then the device tensors (compat::copy_host: side stream, every copy queued at once, big
// tensors in kCopyProgressBytes slices) while `written` follows the copies' progress, so that
// the payload's chunks are hashed behind them and the hash ends soon after the last copy.
void fill_payload(const SnapshotPlan& plan, uint8_t* base, PayloadFrontier& written) {
  const uint8_t* const payload = base + SnapshotHeader::kBytes;
  const uint64_t payload_bytes = plan.header.data_end - SnapshotHeader::kBytes;
  for (size_t i = 0; i < plan.tensors.size(); ++i) {
    const at::Tensor& t = plan.tensors[i];
    if (t.is_cpu() && t.nbytes() > 0) std::memcpy(base + plan.offsets[i], t.data_ptr(), t.nbytes());
  }
  std::vector<compat::HostCopy> device;
  for (size_t i = 0; i < plan.tensors.size(); ++i) {
    const at::Tensor& t = plan.tensors[i];
    if (t.is_cpu()) continue;
    uint8_t* const host = base + plan.offsets[i];
    const int64_t per = static_cast<int64_t>(compat::kCopyProgressBytes / t.element_size());
    if (!t.is_contiguous() || t.numel() <= per) {  // (copy_host refuses a non-contiguous one)
      device.push_back({t, host});
      continue;
    }
    const at::Tensor flat = t.view({-1});
    for (int64_t e = 0; e < flat.numel(); e += per)
      device.push_back({flat.narrow(0, e, std::min(per, flat.numel() - e)),
                        host + static_cast<uint64_t>(e) * t.element_size()});
  }
  // Everything before the first device tensor is final now; after copies [0, k) everything
  // before copy k's first byte.
  const auto final_before = [&](size_t k) -> uint64_t {
    return k < device.size() ? static_cast<uint64_t>(device[k].host - payload) : payload_bytes;
  };
  written.advance(final_before(0));
  if (!device.empty())
    compat::copy_host(device, /*to_host=*/true,
                      [&](size_t n) { written.advance(final_before(n)); });
}

}  // namespace

std::string StateRegistry::write_snapshot(const std::string& path) const {
  return write_snapshot(SnapshotPaths{path, {}});
}

std::string StateRegistry::write_snapshot(const SnapshotPaths& paths) const {
  Impl& m = *impl_;
  m.check_not_released("write_snapshot()");
  SnapshotPlan plan(manifest(), tensors());
  // The device memory this process's allocator holds (state, gradients, cached activations):
  // the reader reserves as much ahead of its first step (read_snapshot).
  if (const auto dev = cuda_device_of(plan.tensors))
    plan.header.device_reserved_bytes = compat::device_reserved_bytes(*dev);
  SnapshotStats st;
  const std::string path = snapshot::write_snapshot(
      m.snapshot, paths, plan,
      [&](uint8_t* base, const snapshot::SnapshotLayout&, PayloadFrontier& written) {
        fill_payload(plan, base, written);
      },
      st);
  st.device_reserved_hint = plan.header.device_reserved_bytes;
  m.stats = st;
  return path;
}

void StateRegistry::read_snapshot(const std::string& path, const at::Device& device) {
  read_snapshot(SnapshotPaths{path, {}}, device, Verify::kBeforeCopy);
}

std::string StateRegistry::read_snapshot(const SnapshotPaths& paths, const at::Device& device,
                                         Verify verify, bool reserve_ahead) {
  const auto t0 = SteadyClock::now();
  Impl& m = *impl_;
  SnapshotStats st;
  const snapshot::OpenedSnapshot opened = snapshot::open_snapshot(m.snapshot, paths, st);
  const std::string& path = opened.path;
  const SnapshotHeader& header = opened.header;
  SnapshotFile& file = *m.snapshot;
  const auto t_hash = SteadyClock::now();
  if (verify == Verify::kBeforeCopy) {
    header.check_payload(file.data(), path);  // before anything of the state changes
    st.checksum_seconds = seconds_since(t_hash);
  }
  const std::string& manifest_text = opened.manifest;
  try {
    apply_manifest(manifest_text, device);
  } catch (const StateError& e) {
    throw StateError(fmt::format("state snapshot '{}': {}", path, e.what()));
  }

  const SnapshotPlan plan(manifest_text, tensors());
  if (plan.header.tensor_count != header.tensor_count || plan.header.data_end != header.data_end) {
    throw StateError(fmt::format(
        "state snapshot '{}' is corrupt: its manifest describes {} tensors ending at byte {}, "
        "its header {} tensors ending at byte {}",
        path, plan.header.tensor_count, plan.header.data_end, header.tensor_count,
        header.data_end));
  }
  if (plan.on_device) st.pin_seconds = file.pin();
  // The writer's device memory (~1 ms for 21 GB): the state's tensors exist now, so what is
  // missing is its gradients' and activations' share; the first step then allocates from the
  // cache. For the calling thread's current stream on that device: the one it trains on.
  st.device_reserved_hint = header.device_reserved_bytes;
  const std::optional<at::Device> dev = reserve_ahead && header.device_reserved_bytes > 0
                                            ? cuda_device_of(plan.tensors)
                                            : std::nullopt;
  if (dev) {
    const compat::DeviceReservation r =
        compat::reserve_device_memory(*dev, header.device_reserved_bytes,
                                      c10::impl::getDeviceGuardImpl(dev->type())->getStream(*dev));
    st.reserved_ahead_bytes = r.bytes;
    st.reserve_seconds = r.seconds;
    st.reserve_note = r.note;
  }
  const auto t_copy = SteadyClock::now();
  if (verify == Verify::kBeforeCopy) {
    compat::copy_host(plan.copies(file.data()), /*to_host=*/false);
    st.copy_seconds = seconds_since(t_copy);
  } else {
    // The payload hash (its own worker threads) over the same bytes the copies read; the
    // tensors are released again when it finds the file corrupt (the caller held no state).
    std::exception_ptr hash_error;
    std::thread hasher([&] {
      try {
        header.check_payload(file.data(), path);
      } catch (...) {
        hash_error = std::current_exception();
      }
      st.checksum_seconds = seconds_since(t_copy);
    });
    std::exception_ptr copy_error;
    try {
      compat::copy_host(plan.copies(file.data()), /*to_host=*/false);
    } catch (...) {
      copy_error = std::current_exception();
    }
    st.copy_seconds = seconds_since(t_copy);
    hasher.join();
    if (hash_error || copy_error) {
      release();
      std::rethrow_exception(hash_error ? hash_error : copy_error);
    }
  }
  st.tensor_bytes = static_cast<int64_t>(plan.total_bytes);
  st.file_bytes = static_cast<int64_t>(file.size());
  st.pinned = file.pinned();
  st.path = path;
  st.total_seconds = seconds_since(t0);
  m.stats = st;
  return path;
}

void StateRegistry::prepare_snapshot(const std::string& path) {
  prepare_snapshot(SnapshotPaths{path, {}});
}

void StateRegistry::prepare_snapshot(const SnapshotPaths& paths) {
  SnapshotPreparation plan = plan_snapshot_preparation(paths);
  if (plan.done) return;
  PreparedSnapshot prepared = make_prepared_snapshot(plan);
  if (prepared.existing_unfit) {  // left alone, as documented: the first write replaces it
    impl_->stats = prepared.stats;
    return;
  }
  adopt_prepared_snapshot(std::move(prepared));
}

StateRegistry::SnapshotPreparation StateRegistry::plan_snapshot_preparation(
    const SnapshotPaths& paths, bool lock_host_memory) {
  Impl& m = *impl_;
  m.check_not_released("prepare_snapshot()");
  SnapshotPreparation plan;
  plan.paths = paths.list();
  GPURUN_CHECK(!plan.paths.empty(), "prepare_snapshot() without a path");
  const SnapshotPlan sp(manifest(), tensors());
  plan.data_end = sp.header.data_end;
  plan.manifest_bytes = sp.manifest.size();
  plan.file_bytes = snapshot_file_bytes(plan.data_end, plan.manifest_bytes);
  plan.on_device = sp.on_device;
  plan.lock_host_memory = lock_host_memory && !plan.on_device;
  if (m.snapshot) {
    if (snapshot::kept_fits(*m.snapshot, plan.paths, plan.data_end, plan.manifest_bytes)) {
      // Already mapped (a resume read it, or an earlier preparation): page-lock it if needed.
      if (plan.on_device) m.stats.pin_seconds = m.snapshot->pin();
      plan.done = true;
    } else {
      m.snapshot.reset();
    }
  }
  return plan;
}

StateRegistry::PreparedSnapshot StateRegistry::make_prepared_snapshot(
    const SnapshotPreparation& plan) {
  return snapshot::make_prepared_snapshot(plan);
}

void StateRegistry::adopt_prepared_snapshot(PreparedSnapshot prepared) {
  Impl& m = *impl_;
  m.stats = prepared.stats;
  if (!prepared.file) throw StateError(prepared.error);
  if (prepared.file.use_count() != 1)  // never: one owner per preparation
    throw StateError("adopt_prepared_snapshot(): the prepared file is shared");
  m.snapshot = std::move(*prepared.file);
}

const StateRegistry::SnapshotStats& StateRegistry::last_snapshot_stats() const {
  return impl_->stats;
}

void StateRegistry::leave_snapshot_to_exit() noexcept {
  if (!impl_->snapshot) return;
  impl_->snapshot->leave_to_exit();
  impl_->snapshot.reset();
}

StateRegistry::CloseTimes StateRegistry::close_snapshot() noexcept {
  CloseTimes t;
  if (!impl_->snapshot) return t;
  t.unpin_seconds = impl_->snapshot->unpin();
  const auto t0 = SteadyClock::now();
  impl_->snapshot.reset();
  t.unmap_seconds = seconds_since(t0);
  return t;
}

}  // namespace gpurun::rt
