// gpurun::rt::StateRegistry — the training state that moves at a boundary: a module's
// parameters and buffers, its optimizer's per-parameter state and step counts and the
// param-group options (lr, …), plus user scalars and extensions. It describes the state
// (manifest), lists its tensors in one canonical order (what a handoff broadcasts),
// checksums it, frees and re-creates its device memory, and writes/reads the host snapshot
// used across a pause. Internal header: the public face is gpurun::Runtime::track*.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "gpurun/error.hpp"
#include "gpurun/snapshot/snapshot_store.hpp"
#include "gpurun/state.hpp"

namespace gpurun::rt {

/// Declared in <gpurun/error.hpp> (public: users catch it); named here as before.
using ::gpurun::StateError;

// The host side of snapshots (paths, files, the crash-safe write): gpurun/snapshot/.
using snapshot::PayloadFrontier;
using snapshot::PreparedSnapshot;
using snapshot::snapshot_file_bytes;
using snapshot::SnapshotFile;
using snapshot::SnapshotHeader;
using snapshot::SnapshotPaths;
using snapshot::SnapshotPreparation;
using snapshot::SnapshotStats;

class StateRegistry {
 public:
  StateRegistry();
  ~StateRegistry();
  StateRegistry(const StateRegistry&) = delete;
  StateRegistry& operator=(const StateRegistry&) = delete;

  /// Tracks every parameter and buffer of `module` (recursively, named "<prefix>.<name>").
  /// Throws StateError if called twice with the same prefix.
  void track_module(torch::nn::Module& module, const std::string& prefix = "model");

  /// Tracks `optimizer`: each param group's options (lr, betas, eps, weight_decay, … as
  /// numbers) and each parameter's state (Adam/AdamW: step, exp_avg, exp_avg_sq,
  /// max_exp_avg_sq; SGD: momentum_buffer; RMSprop: step, square_avg, momentum_buffer,
  /// grad_avg; Adagrad: step, sum). Every parameter of the optimizer must belong to a
  /// tracked module (StateError naming it otherwise). An optimizer of another type
  /// (LBFGS, a user subclass) → StateError naming the type: gpurun cannot move its state.
  void track_optimizer(torch::optim::Optimizer& optimizer, const std::string& name = "optimizer");

  /// A plain number that moves with the state (epoch counters, global step, …). The
  /// pointee must outlive the registry. Names are unique across scalars and extensions.
  void track_scalar(const std::string& name, int64_t* value);
  void track_scalar(const std::string& name, double* value);
  void track_extension(const std::string& name, std::shared_ptr<StateExtension> extension);

  /// Everything a receiver needs to give its state the source's layout and values of the
  /// non-tensor parts: tensor names, shapes, dtypes (canonical order); which optimizer
  /// state entries exist and their step counts; param-group options; scalar values;
  /// extension bytes. Deterministic bytes (UTF-8 JSON, one line) for equal states.
  /// Throws StateError after release() (a released rank is never a state source).
  std::string manifest() const;

  /// On a receiver: checks that the tracked modules match the manifest (names, shapes,
  /// dtypes: StateError naming the first mismatch), creates/drops optimizer state entries
  /// so they match, allocates every tensor that has no storage on `device` (uninitialised:
  /// the caller fills them, e.g. by broadcast), sets step counts, param-group options,
  /// scalars, and loads extensions. Afterwards tensors() lists the same shapes and dtypes
  /// as the source's.
  void apply_manifest(const std::string& manifest, const at::Device& device);

  /// A warm joiner's receive buffers, made before its admission (off the job's path): for each
  /// parameter of each tracked optimizer, the state tensors that optimizer's step would create
  /// (OptimizerAdapter::fields_after_step: the parameter's shape and dtype) and that it lacks,
  /// allocated on `device` and written once (zeros). apply_manifest() takes the ones that match
  /// (shape, dtype, device) instead of fresh memory, which the handoff's receive would otherwise
  /// fault in page by page (0.4-0.5 s per GB on the CPU machine, about half a 1 GB handoff:
  /// docs/results.md#elastic-nodes-on-loopback-2026-12-06), and frees the rest. Only for a
  /// CPU `device` (CUDA memory comes from the caching allocator: nothing to fault); 0 otherwise
  /// and after release(). Returns the bytes reserved. Blocks while it writes them (the
  /// memory bandwidth's time: ~0.4 s per GB here). The optimizer's own state is not touched.
  int64_t reserve_receive(const at::Device& device);
  /// Frees reserve_receive()'s buffers (a joiner that received no state). Idempotent.
  void drop_receive_reserve();

  /// Every tracked tensor in canonical order: module parameters and buffers (tracking
  /// order, then name order), then optimizer state tensors per parameter in parameter
  /// order (fixed field order per optimizer type). References, not copies: writing into
  /// them (broadcast, copy_) changes the training state. Contiguous.
  std::vector<at::Tensor> tensors() const;

  /// Total bytes of tensors().
  int64_t nbytes() const;

  /// 64-bit checksum of the state: bitwise over every tensor of tensors() (computed on the
  /// tensors' device: integer sums of the raw 32-bit words, plain and position-weighted,
  /// per tensor, mixed with splitmix64), plus step counts, param-group options and
  /// scalars. Equal states give equal checksums on any device type; blocks until the
  /// device work is done. Extensions are not included (their bytes need not be canonical).
  /// Throws StateError after release().
  uint64_t checksum() const;

  /// Frees the state's device memory (OFFLOADING for a rank that keeps its process): every
  /// parameter and buffer gets an empty tensor (its shape is remembered), gradients and
  /// optimizer state entries are dropped. The module objects stay valid; tensors() is empty
  /// until apply_manifest() or materialize() (so nothing of it pins device memory).
  void release();

  /// After release(): parameters and buffers get uninitialised storage of their
  /// remembered shapes on `device` (the caller fills them). Optimizer state stays empty
  /// until apply_manifest() (which also allocates by itself, so materialize() is optional
  /// before a handoff); Adagrad cannot step without it.
  void materialize(const at::Device& device);

  /// Writes manifest + tensor bytes to the first of `paths` that can hold them (layout:
  /// gpurun/snapshot/format.hpp; the host side, shared with the Python package:
  /// snapshot::write_snapshot in gpurun/snapshot/snapshot_store.hpp) and returns that path. The
  /// file is mapped (and page-locked when the state is on a device) once and kept: a later snapshot
  /// is written in place into the kept file (wherever it is) when it still fits, copying only (host
  /// tensors and padding first; then every device tensor, in 64 MiB slices, queued at once on a
  /// side stream, while the payload hash follows the copies chunk by chunk: fill_payload).
  /// Otherwise, per path in order: the existing file there if it fits, else a new one (reserved
  /// with posix_fallocate, renamed over the old); a path that fails (ENOSPC, EDQUOT, EFBIG at the
  /// reservation, or any other I/O error, also in msync/fsync or the read-back) loses its file (a
  /// partial or stale snapshot never stays) and the next path is tried. Done means: payload
  /// checksum (XXH64 of the file's bytes as written) recorded, file written back (msync + fsync),
  /// commit word set, header read back and verified (SnapshotFile::commit). Then every other path's
  /// file is removed, so the returned path is the only one holding a snapshot. Crash-safe: the file
  /// is marked incomplete before it changes and committed last.
  ///
  /// Blocks until the bytes are in the file (and on disk for a disk path). Throws:
  /// StateError after release(); StateError "cannot write the state snapshot (N bytes): every
  /// path failed: (1) '<path>': <what, with bytes and errno text>; (2) ..." when no path can
  /// hold it — then no file (and no temporary) remains at any of `paths`, the kept mapping is
  /// dropped, and the tracked tensors (device memory included) are untouched: training can
  /// go on; c10::Error for a failed device copy (the file at that path is removed as well).
  std::string write_snapshot(const SnapshotPaths& paths) const;
  /// write_snapshot({path, ""}).
  std::string write_snapshot(const std::string& path) const;

  /// Reads the snapshot that write_snapshot(paths) wrote and returns its path: the one of
  /// `paths` that has a file (if several do — a crash between writing one and removing the
  /// other — the one whose header says it was written last; an undecodable one among several
  /// makes the read fail rather than guess). Verifies it completely before anything changes:
  /// header (magic, version, header checksum, commit word, file size: "truncated: X of Y
  /// bytes"), manifest hash, then the payload checksum over every byte (one read pass, about
  /// 0.1 s per GB). Then apply_manifest + fills every tensor on `device` (device tensors:
  /// asynchronous copies on a side stream, one synchronise). Keeps the mapping (page-locked for
  /// a device), so that the next write_snapshot only copies. Throws StateError naming the path
  /// and what mismatched (incomplete snapshot, other format version, layout mismatch, size
  /// mismatch, truncated or corrupt file: "payload checksum 0x... != header 0x... (file
  /// corrupt)") — the tracked state is then unchanged — or when no path has a file (listing
  /// each path and its errno text); gpurun::Error (I/O) naming the path.
  ///
  /// `verify`: kBeforeCopy is the above. kWhileCopying is for a caller that holds no state
  /// worth keeping (a rank resuming a paused job: the state is the snapshot's): the payload
  /// checksum runs on other threads while the tensors are filled, so the read costs about the
  /// longer of the two instead of their sum (ViT-H on an H200: ~0.12 s saved); when it finds
  /// the file corrupt, or a copy fails, the tensors are released (release()) before the same
  /// StateError is thrown: nothing of the corrupt bytes stays usable.
  ///
  /// `reserve_ahead`: when the header records the writer's device memory
  /// (SnapshotHeader::device_reserved_bytes) and the state is on a CUDA device, the CUDA
  /// caching allocator is grown towards that size before the tensors are filled
  /// (compat::reserve_device_memory, for the calling thread's current stream; ~1 ms), so that
  /// the first training step allocates its gradients and activations from the cache. Best
  /// effort: what it did, or why not all, is in last_snapshot_stats() (device_reserved_hint,
  /// reserved_ahead_bytes, reserve_seconds, reserve_note).
  enum class Verify { kBeforeCopy, kWhileCopying };
  std::string read_snapshot(const SnapshotPaths& paths, const at::Device& device,
                            Verify verify = Verify::kBeforeCopy, bool reserve_ahead = false);
  /// read_snapshot({path, ""}, device).
  void read_snapshot(const std::string& path, const at::Device& device);

  /// Optional: gets a path of `paths` ready so that the first write_snapshot(paths) only
  /// copies. Maps the file at the first path that has one if it fits the current state (it is
  /// not changed: it may hold a snapshot to resume from; one that does not fit is left alone
  /// and nothing is mapped); where no path has a file, creates one sized for the current
  /// state (plus spare room) at the first path where that succeeds (never replacing one, so
  /// ranks that prepare one path share one file); page-locks the mapping when the state is on
  /// a device. Cost: the file takes about nbytes() of host memory (tmpfs) from now until it
  /// is removed, page-locked while this registry maps it, and the call takes the reservation
  /// and registration time a first write would. Size it after the optimizer's first step
  /// (Adam's moments do not exist before): a file too small for the real state is replaced at
  /// the first write. Throws StateError listing every path's error when no path could be
  /// created (no file remains), StateError after release().
  void prepare_snapshot(const SnapshotPaths& paths);
  /// prepare_snapshot({path, ""}).
  void prepare_snapshot(const std::string& path);

  /// What the last write_snapshot / read_snapshot / prepare_snapshot did and how long its
  /// parts took (seconds, steady clock). Zero-initialised before the first one.
  using SnapshotStats = snapshot::SnapshotStats;
  const SnapshotStats& last_snapshot_stats() const;

  /// prepare_snapshot() in three steps, so that the slow middle one (creating, reserving with
  /// posix_fallocate, mapping, page-locking: seconds for GBs) can run on another thread while
  /// training goes on (the runtime's background preparation, docs/worker-runtime.md).
  using SnapshotPreparation = snapshot::SnapshotPreparation;
  using PreparedSnapshot = snapshot::PreparedSnapshot;
  /// Step 1, on the training thread (cheap: the manifest): the file the current state needs.
  /// `lock_host_memory`: mlock a CPU state's file (SnapshotFile::lock_in_memory). Throws
  /// StateError after release().
  SnapshotPreparation plan_snapshot_preparation(const SnapshotPaths& paths,
                                                bool lock_host_memory = false);
  /// Step 2, on any thread (uses nothing of a registry): the file as prepare_snapshot()
  /// describes. Never throws: failures are in `error` / `lock_error`.
  static PreparedSnapshot make_prepared_snapshot(const SnapshotPreparation& plan);
  /// Step 3, on the training thread: keeps the file for the next write_snapshot; its stats
  /// become last_snapshot_stats(). Throws StateError with `error` when there is no file.
  void adopt_prepared_snapshot(PreparedSnapshot prepared);

  /// Unmaps (and unregisters) the kept snapshot file now; the file itself stays. The next
  /// snapshot call maps it again. Never throws. Returns the seconds of each part.
  struct CloseTimes {
    double unpin_seconds = 0;  ///< cudaHostUnregister of the mapping (0: it was not pinned)
    double unmap_seconds = 0;  ///< munmap + close
  };
  CloseTimes close_snapshot() noexcept;
  /// For a process about to exit (a release-mode leaver): drops the kept snapshot file without
  /// unpinning or unmapping it (SnapshotFile::leave_to_exit), so that the process's own end
  /// does both. Never throws.
  void leave_snapshot_to_exit() noexcept;

  bool empty() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gpurun::rt
