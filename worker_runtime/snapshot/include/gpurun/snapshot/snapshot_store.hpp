// gpurun::snapshot — the host side of a run's pause snapshots, written once for both
// runtimes: which of the run's paths holds the snapshot, creating, reusing or replacing its
// file, the crash-safe write (void the others, begin, fill, hash, commit, remove the others),
// which file a resume reads, and preparing a file ahead. The caller only fills the tensor
// bytes (the C++ runtime with LibTorch copies, the Python package with torch copies through
// libgpurun_worker.so) and applies the manifest it reads. Layout: gpurun/snapshot/format.hpp.
// No torch. docs/worker-runtime.md#snapshot-files.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gpurun/snapshot/format.hpp"
#include "gpurun/snapshot/snapshot_file.hpp"

namespace gpurun::snapshot {

/// Where the pause snapshot of a run may live, in order of preference: `primary`
/// (GPURUN_SNAPSHOT_PATH, normally /dev/shm) and, when not empty, `fallback`
/// (GPURUN_SNAPSHOT_FALLBACK_PATH, the run directory), used when the primary cannot hold it
/// (full: ENOSPC, EDQUOT, EFBIG; or any other I/O error there). A writer and a reader of one
/// run pass the same pair. At most one of the two files holds a snapshot: the writer removes
/// the other one (docs/worker-runtime.md, "Snapshot files").
struct SnapshotPaths {
  std::string primary;
  std::string fallback;  ///< empty: none

  /// The non-empty, distinct paths in order.
  std::vector<std::string> list() const;
};

/// What the last snapshot write / read / preparation did and how long its parts took
/// (seconds, steady clock). Zero-initialised before the first one.
struct SnapshotStats {
  int64_t tensor_bytes = 0;     ///< tensor bytes copied (0 for a preparation)
  int64_t file_bytes = 0;       ///< size of the snapshot file
  bool created = false;         ///< this call created (and reserved) the file
  bool mapped = false;          ///< this call mapped an existing file (not kept from before)
  bool pinned = false;          ///< the mapping is page-locked (device state, a pinner installed)
  bool locked = false;          ///< the mapping is mlock-ed (CPU state, prepared ahead)
  double setup_seconds = 0;     ///< create + posix_fallocate + mmap, or open + mmap
  double pin_seconds = 0;       ///< page-locking the mapping (cudaHostRegister)
  double copy_seconds = 0;      ///< tensor copies, the final synchronise included
  double total_seconds = 0;     ///< the whole call (manifest, checks, msync, commit, ...)
  double checksum_seconds = 0;  ///< payload checksum, from the copies' start: it runs
                                ///< while they land (read: verification; write: hashing
                                ///< each 64 MiB chunk once the copies passed it)
  std::string path;             ///< the file the snapshot is in (or was prepared at)
  /// The header's device_reserved_bytes: write, recorded (the writer's CUDA caching allocator,
  /// bytes); read, found.
  uint64_t device_reserved_hint = 0;
  uint64_t reserved_ahead_bytes = 0;  ///< read: device memory reserved ahead from that hint
  double reserve_seconds = 0;         ///< read: that reservation (before the copies)
  std::string reserve_note;           ///< read: why less than the hint was reserved
  /// Paths that failed before `path` was used (write/prepare), one "'<path>': <error>" each:
  /// a non-empty list means the snapshot fell back (worth a warning in the event log).
  std::vector<std::string> failed_attempts;
};

/// The CUDA caching allocator's settings that decide whether reserving ahead helps: the
/// environment's values, nullptr when unset.
struct DeviceAllocatorEnv {
  const char* alloc_conf = nullptr;       ///< PYTORCH_ALLOC_CONF (torch >= 2.8's name)
  const char* cuda_alloc_conf = nullptr;  ///< PYTORCH_CUDA_ALLOC_CONF (the older name)
  const char* no_caching = nullptr;       ///< PYTORCH_NO_CUDA_MEMORY_CACHING
  /// Reads the three variables (std::getenv). Never throws.
  static DeviceAllocatorEnv from_environment();
};

/// How much device memory a resume reserves ahead of its first step, from the pause writer's
/// SnapshotHeader::device_reserved_bytes (`hint`: the writer's large pool): what its CUDA caching
/// allocator's large pool lacks of it beyond `reserved_now` (once the state's tensors are
/// allocated), capped at `free_now`
/// (the device's free bytes, cudaMemGetInfo) less kDeviceReserveMargin (the hint may come from
/// a bigger GPU or a GPU shared with others); nothing below kDeviceReserveSmallest. Nothing at
/// all, with a note, when the allocator would not serve the first step from one large cached
/// segment: PYTORCH_NO_CUDA_MEMORY_CACHING set to any value (nothing is cached; torch up to 2.6
/// reads any value so), or either allocator-settings variable naming max_split_size_mb (such
/// a segment is not split), roundup_power2_divisions (the request would be rounded up past the
/// cap) or the cudaMallocAsync backend (no segments of its own). Settings changed at run time
/// (torch.cuda.memory._set_allocator_settings) are not seen. The executors (the C++ runtime's
/// compat::reserve_device_memory, the Python package through libgpurun_worker.so) allocate
/// `bytes` on the training stream through the caching allocator and free them at once. Pure;
/// never throws except std::bad_alloc.
struct DeviceReservePlan {
  uint64_t bytes = 0;  ///< to allocate and free at once (0: nothing)
  std::string note;    ///< why less than what is missing ("" when all of it, or none is)
};
inline constexpr uint64_t kDeviceReserveMargin = uint64_t{1} << 30;     ///< 1 GiB
inline constexpr uint64_t kDeviceReserveSmallest = uint64_t{64} << 20;  ///< 64 MiB
DeviceReservePlan plan_device_reserve(uint64_t hint, uint64_t reserved_now, uint64_t free_now,
                                      const DeviceAllocatorEnv& env);

/// One snapshot's layout: its manifest (UTF-8), its tensors' sizes in bytes (canonical order)
/// and, from SnapshotHeader::plan, each tensor's file offset.
struct SnapshotLayout {
  SnapshotLayout(std::string manifest_text, std::vector<uint64_t> sizes, bool device);

  std::string manifest;
  std::vector<uint64_t> tensor_bytes;
  std::vector<uint64_t> offsets;
  SnapshotHeader header;
  bool on_device = false;    ///< some tensor is on a device: the file is page-locked
  uint64_t total_bytes = 0;  ///< sum of tensor_bytes
};

/// Fills the tensors of `layout` into the mapping at `base` (after begin(); the padding is
/// already zero): tensor i's bytes at base + layout.offsets[i]. It may advance `written` as
/// payload bytes become final so that the hash follows the copies (payload_digest's
/// frontier); what it leaves is advanced to the end when it returns. Returns normally when
/// every byte is in place (device copies synchronised); throws to fail the attempt.
using PayloadFill =
    std::function<void(uint8_t* base, const SnapshotLayout& layout, PayloadFrontier& written)>;

/// Writes the snapshot of `layout` to the first of `paths` that can hold it and returns that
/// path; `kept` is the process's mapped snapshot file, reused in place when it still fits
/// (else, per path in order: the existing file there if it fits, else a new one renamed over
/// it). Before a path is tried every other path's snapshot is voided (its commit word
/// cleared); a path that fails loses its file (a partial or stale snapshot never stays) and
/// the next is tried; after success every other path's file is removed. Done means: payload
/// checksum recorded, file written back (msync + fsync), commit word set, header read back and
/// verified (SnapshotFile::commit). Blocks. `st` gets what was done. Throws StateError
/// "cannot write the state snapshot (N tensor bytes, a file of M bytes): every path failed:
/// (1) '<path>': <what>; (2) ..." when no path can hold it — then no file remains at any of
/// `paths` and `kept` is empty; an exception of `fill` other than gpurun::Error propagates
/// after the file at that path is removed.
std::string write_snapshot(std::optional<SnapshotFile>& kept, const SnapshotPaths& paths,
                           const SnapshotLayout& layout, const PayloadFill& fill,
                           SnapshotStats& st);

/// The snapshot a resume reads, mapped (in `kept`, reused when it is the file at that path)
/// and its header decoded (not its payload: SnapshotHeader::check_payload). Of several paths
/// with a file (a crash between writing one and removing the other) the one whose header says
/// it was written last; an undecodable one among several fails the read rather than guess.
struct OpenedSnapshot {
  std::string path;
  SnapshotHeader header;
  std::string manifest;  ///< the manifest bytes (UTF-8)
};
/// Throws StateError naming each path and its errno text when none has a file, or the path
/// and what is wrong with its header; gpurun::Error (I/O) naming the path.
OpenedSnapshot open_snapshot(std::optional<SnapshotFile>& kept, const SnapshotPaths& paths,
                             SnapshotStats& st);

/// Whether `kept` is the file at one of `paths` and can take a snapshot ending at `data_end`
/// with a manifest of `manifest_bytes` bytes (writable, SnapshotHeader fits).
bool kept_fits(const SnapshotFile& kept, const std::vector<std::string>& paths, uint64_t data_end,
               uint64_t manifest_bytes);

/// Preparing the snapshot file ahead, so that the first pause only copies: what the state
/// needs (the caller computes it from its tensors) ...
struct SnapshotPreparation {
  std::vector<std::string> paths;  ///< SnapshotPaths::list()
  uint64_t data_end = 0, manifest_bytes = 0;
  uint64_t file_bytes = 0;        ///< the file a new snapshot file would get
  bool on_device = false;         ///< page-lock it for device copies (cudaHostRegister)
  bool lock_host_memory = false;  ///< CPU state: mlock the mapping (resident, never swapped)
  bool done = false;              ///< the process already maps a file that fits: nothing to do
};
/// ... and the file it made.
struct PreparedSnapshot {
  std::shared_ptr<SnapshotFile> file;  ///< null when no path could be prepared (`error`)
  SnapshotStats stats;
  std::string error;  ///< why there is no file
  /// No file because one exists at the path and does not fit the state (it is never
  /// replaced: the first write does that).
  bool existing_unfit = false;
  std::string lock_error;  ///< why the file is not locked in memory (lock_host_memory); "": it is
};
/// Maps the file at the first path that has one if it fits (it is not changed: it may hold a
/// snapshot to resume from; one that does not fit is left alone); where no path has a file,
/// creates one of plan.file_bytes at the first path where that succeeds (never replacing one,
/// so ranks preparing one path share one file); page-locks it (on_device) or mlocks it
/// (lock_host_memory). Runs on any thread (seconds for GBs: posix_fallocate, MAP_POPULATE,
/// cudaHostRegister). Never throws: failures are in `error` / `lock_error`.
PreparedSnapshot make_prepared_snapshot(const SnapshotPreparation& plan);

/// Finishes a preparation made in two steps: `mapped` is an earlier make_prepared_snapshot()
/// of the same plan without page-locking (a standby maps the snapshot it will read while it
/// waits, before it may touch its device). When `mapped` still maps the file at the first of
/// plan.paths that has one (same inode and size: MappedFile::is_at), it is page-locked
/// (plan.on_device) and returned, its stats' pin_seconds and total_seconds being this step's
/// alone; otherwise (no mapping, the file replaced or gone) this is make_prepared_snapshot(plan).
/// Runs on any thread (the pin: ~0.3 s for 7.5 GB). Never throws.
PreparedSnapshot finish_prepared_snapshot(PreparedSnapshot mapped, const SnapshotPreparation& plan);

}  // namespace gpurun::snapshot
