// The C interface of the pause snapshot's host side (gpurun_worker.h, "Snapshots"): the same
// gpurun::snapshot code the C++ runtime runs — paths, files, the crash-safe write with its
// XXH64 payload hash, the checked read and the prepared file — with the tensor copies left to
// the caller (the Python package's torch).
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "capi_util.hpp"
#include "gpurun/env_names.hpp"
#include "gpurun/json_writer.hpp"
#include "gpurun/snapshot/snapshot_store.hpp"
#include "gpurun_worker.h"

namespace snap = gpurun::snapshot;
using gpurun::capi::dup;
using gpurun::capi::guarded;

struct gpurun_snapshots {
  snap::SnapshotPaths paths;
  std::mutex mu;  ///< a preparation on another thread against a write or read
  std::optional<snap::SnapshotFile> kept;
};

namespace gpurun::capi {

std::string& last_error() {
  thread_local std::string error;
  return error;
}
int& last_error_kind() {
  thread_local int kind = 0;
  return kind;
}

}  // namespace gpurun::capi

namespace {

// A u64 of the C API's JSON (int64 there): values of 2^63 and more (only a corrupt hint) read
// as the largest int64, so that every reader sees the same huge value the C++ runtime would.
int64_t json_u64(uint64_t v) {
  return static_cast<int64_t>(std::min<uint64_t>(v, std::numeric_limits<int64_t>::max()));
}

gpurun_host_register_fn g_register = nullptr;
gpurun_host_unregister_fn g_unregister = nullptr;
gpurun_host_last_error_fn g_last_error = nullptr;

class CudartPin final : public snap::HostPin {
 public:
  explicit CudartPin(void* p) : p_(p) {}
  ~CudartPin() override {
    if (p_ && g_unregister) g_unregister(p_);
  }
  CudartPin(const CudartPin&) = delete;
  CudartPin& operator=(const CudartPin&) = delete;
  void leave_to_exit() noexcept override { p_ = nullptr; }

 private:
  void* p_;
};

std::string stats_json(const snap::SnapshotStats& st, gpurun::JsonObject o = {}) {
  o.add("path", st.path)
      .add("tensor_bytes", st.tensor_bytes)
      .add("file_bytes", st.file_bytes)
      .add("created", st.created)
      .add("mapped", st.mapped)
      .add("pinned", st.pinned)
      .add("locked", st.locked)
      .add("setup_s", st.setup_seconds)
      .add("pin_s", st.pin_seconds)
      .add("copy_s", st.copy_seconds)
      .add("checksum_s", st.checksum_seconds)
      .add("total_s", st.total_seconds)
      .add("failed_attempts", st.failed_attempts);
  return o.str();
}

std::vector<uint64_t> sizes_of(const uint64_t* sizes, size_t n) {
  return n ? std::vector<uint64_t>(sizes, sizes + n) : std::vector<uint64_t>{};
}

const char* env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

}  // namespace

extern "C" {

void gpurun_snapshot_set_pinner(gpurun_host_register_fn reg, gpurun_host_unregister_fn unreg,
                                gpurun_host_last_error_fn last_error) {
  g_register = reg;
  g_unregister = unreg;
  g_last_error = last_error;
  if (!reg || !unreg || !last_error) {
    snap::set_host_pinner({});
    return;
  }
  snap::set_host_pinner(
      [](uint8_t* data, size_t bytes, bool read_only) -> std::unique_ptr<snap::HostPin> {
        // cudaHostRegisterPortable (1) | cudaHostRegisterReadOnly (8) when read-only
        const unsigned flags = 1u | (read_only ? 8u : 0u);
        if (g_register(data, bytes, flags) != 0) {
          (void)g_last_error();  // not left for the program's next CUDA check to find
          return nullptr;
        }
        return std::make_unique<CudartPin>(data);
      });
}

uint64_t gpurun_snapshot_plan(uint64_t manifest_bytes, const uint64_t* sizes, size_t n,
                              uint64_t* offsets) {
  std::vector<uint64_t> out;
  const snap::SnapshotHeader h =
      snap::SnapshotHeader::plan(manifest_bytes, sizes_of(sizes, n), out);
  for (size_t i = 0; i < n; ++i) offsets[i] = out[i];
  return h.data_end;
}

uint64_t gpurun_snapshot_file_bytes(uint64_t data_end, uint64_t manifest_bytes) {
  return snap::snapshot_file_bytes(data_end, manifest_bytes);
}

gpurun_snapshots* gpurun_snapshots_open(const char* primary, const char* fallback) {
  return guarded(
      [&]() -> gpurun_snapshots* {
        auto s = std::make_unique<gpurun_snapshots>();
        s->paths.primary = primary ? primary : env_or_empty(gpurun::env::kSnapshotPath);
        s->paths.fallback = fallback ? fallback : env_or_empty(gpurun::env::kSnapshotFallbackPath);
        if (s->paths.list().empty()) return nullptr;
        return s.release();
      },
      static_cast<gpurun_snapshots*>(nullptr));
}

void gpurun_snapshots_close(gpurun_snapshots* s) {
  delete s;
}

void gpurun_snapshots_leave_to_exit(gpurun_snapshots* s) {
  if (!s) return;
  const std::lock_guard lock(s->mu);
  if (s->kept) s->kept->leave_to_exit();
  s->kept.reset();
}

uint8_t* gpurun_snapshots_data(gpurun_snapshots* s) {
  const std::lock_guard lock(s->mu);
  return s->kept ? s->kept->data() : nullptr;
}

char* gpurun_snapshots_prepare(gpurun_snapshots* s, uint64_t manifest_bytes, const uint64_t* sizes,
                               size_t n, int on_device, int lock_host_memory) {
  return guarded(
      [&] {
        const std::lock_guard lock(s->mu);
        snap::SnapshotPreparation plan;
        plan.paths = s->paths.list();
        std::vector<uint64_t> offsets;
        plan.data_end =
            snap::SnapshotHeader::plan(manifest_bytes, sizes_of(sizes, n), offsets).data_end;
        plan.manifest_bytes = manifest_bytes;
        plan.file_bytes = snap::snapshot_file_bytes(plan.data_end, manifest_bytes);
        plan.on_device = on_device != 0;
        plan.lock_host_memory = lock_host_memory != 0 && !plan.on_device;
        gpurun::JsonObject o;
        if (s->kept && snap::kept_fits(*s->kept, plan.paths, plan.data_end, manifest_bytes)) {
          snap::SnapshotStats st;
          st.path = s->kept->path();
          if (plan.on_device) st.pin_seconds = s->kept->pin();
          st.pinned = s->kept->pinned();
          st.file_bytes = static_cast<int64_t>(s->kept->size());
          o.add("done", true).add("error", "").add("lock_error", "");
          return dup(stats_json(st, std::move(o)));
        }
        snap::PreparedSnapshot p = snap::make_prepared_snapshot(plan);
        if (p.file) s->kept = std::move(*p.file);
        o.add("done", false)
            .add("error", p.error)
            .add("lock_error", p.lock_error)
            .add("existing_unfit", p.existing_unfit);
        return dup(stats_json(p.stats, std::move(o)));
      },
      static_cast<char*>(nullptr));
}

char* gpurun_snapshots_premap(gpurun_snapshots* s, int on_device) {
  return guarded(
      [&] {
        const std::lock_guard lock(s->mu);
        snap::SnapshotPreparation plan;
        for (const std::string& p : s->paths.list())
          if (snap::SnapshotHeader::peek_sizes(p, plan.data_end, plan.manifest_bytes)) {
            plan.paths = {p};  // a paused job's snapshot: the one a resume reads
            break;
          }
        gpurun::JsonObject o;
        if (plan.paths.empty()) {
          o.add("done", false).add("error", "no committed snapshot at any path");
          return dup(stats_json({}, std::move(o)));
        }
        plan.file_bytes = snap::snapshot_file_bytes(plan.data_end, plan.manifest_bytes);
        plan.on_device = on_device != 0;
        snap::PreparedSnapshot early;  // a standby's mapping from before its go, if still current
        if (s->kept) {
          early.file = std::make_shared<snap::SnapshotFile>(std::move(*s->kept));
          s->kept.reset();
        }
        snap::PreparedSnapshot p = snap::finish_prepared_snapshot(std::move(early), plan);
        if (p.file) s->kept = std::move(*p.file);
        o.add("done", p.file != nullptr).add("error", p.error);
        return dup(stats_json(p.stats, std::move(o)));
      },
      static_cast<char*>(nullptr));
}

char* gpurun_snapshots_write(gpurun_snapshots* s, const char* manifest, size_t manifest_bytes,
                             const uint64_t* sizes, size_t n, int on_device,
                             uint64_t device_reserved_bytes, gpurun_snapshot_fill_fn fill,
                             void* ctx) {
  return guarded(
      [&] {
        const std::lock_guard lock(s->mu);
        snap::SnapshotLayout layout(std::string(manifest, manifest_bytes), sizes_of(sizes, n),
                                    on_device != 0);
        layout.header.device_reserved_bytes = device_reserved_bytes;
        snap::SnapshotStats st;
        snap::write_snapshot(
            s->kept, s->paths, layout,
            [&](uint8_t* base, const snap::SnapshotLayout& l, snap::PayloadFrontier&) {
              // Not a gpurun::Error: a failed copy is no reason to try the other path.
              if (fill(ctx, base, l.offsets.data(), l.offsets.size()) != 0)
                throw std::runtime_error("the tensor copies into the snapshot failed");
            },
            st);
        return dup(stats_json(st));
      },
      static_cast<char*>(nullptr));
}

char* gpurun_snapshots_read(gpurun_snapshots* s, int verify, int on_device) {
  return guarded(
      [&] {
        const std::lock_guard lock(s->mu);
        snap::SnapshotStats st;
        const snap::OpenedSnapshot opened = snap::open_snapshot(s->kept, s->paths, st);
        if (verify) opened.header.check_payload(s->kept->data(), opened.path);
        if (on_device) st.pin_seconds = s->kept->pin();
        st.path = opened.path;
        st.pinned = s->kept->pinned();
        st.file_bytes = static_cast<int64_t>(s->kept->size());
        gpurun::JsonObject o;
        o.add("manifest", opened.manifest)
            .add("tensor_count", static_cast<int64_t>(opened.header.tensor_count))
            .add("data_offset", static_cast<int64_t>(opened.header.data_offset))
            .add("data_end", static_cast<int64_t>(opened.header.data_end))
            .add("sequence", static_cast<int64_t>(opened.header.sequence))
            .add("writer_pid", static_cast<int64_t>(opened.header.writer_pid))
            .add("device_reserved_bytes", json_u64(opened.header.device_reserved_bytes));
        return dup(stats_json(st, std::move(o)));
      },
      static_cast<char*>(nullptr));
}

char* gpurun_snapshot_plan_reserve(uint64_t hint, uint64_t reserved_now, uint64_t free_now) {
  return guarded(
      [&] {
        const snap::DeviceReservePlan p = snap::plan_device_reserve(
            hint, reserved_now, free_now, snap::DeviceAllocatorEnv::from_environment());
        gpurun::JsonObject o;
        o.add("bytes", json_u64(p.bytes)).add("note", p.note);
        return dup(o.str());
      },
      static_cast<char*>(nullptr));
}

}  // extern "C"
