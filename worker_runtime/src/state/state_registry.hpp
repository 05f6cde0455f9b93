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
#include "gpurun/state.hpp"

namespace gpurun::rt {

/// Declared in <gpurun/error.hpp> (public: users catch it); named here as before.
using ::gpurun::StateError;

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

  /// Writes manifest + tensor bytes to `path` (a file, typically on /dev/shm; layout:
  /// state/snapshot_format.hpp). The file is mapped (and page-locked when the state is on a
  /// device) once and kept: later snapshots to the same path are written in place, copying
  /// only (device tensors: asynchronous copies on a side stream, one synchronise). A new file
  /// (reserved with posix_fallocate, renamed over the old one) is made only when none exists
  /// or the state no longer fits the old one (much larger or much smaller: snapshot_fits).
  /// Crash-safe: the file is marked incomplete before it changes and committed last, so an
  /// interrupted write leaves a file read_snapshot refuses, never a half-written state.
  /// Blocks until the bytes are in the file. Throws gpurun::Error naming the path on I/O
  /// errors (a full /dev/shm: at the reservation), StateError after release().
  void write_snapshot(const std::string& path) const;

  /// Reads a snapshot written by write_snapshot: apply_manifest + fills every tensor on
  /// `device` (device tensors: asynchronous copies on a side stream, one synchronise). Keeps
  /// the mapping (page-locked for a device), so that the next write_snapshot to `path` only
  /// copies. Throws StateError (incomplete snapshot, layout mismatch, size mismatch,
  /// truncated or corrupt file) or gpurun::Error (I/O), naming the path.
  void read_snapshot(const std::string& path, const at::Device& device);

  /// Optional: gets `path` ready so that the first write_snapshot(path) only copies. Maps the
  /// file there if it fits the current state (it is not changed: it may hold a snapshot to
  /// resume from); creates one sized for the current state (plus spare room) where none
  /// exists (never replacing one, so ranks that prepare one path share one file); page-locks
  /// the mapping when the state is on a device. Cost: the file takes about nbytes() of host
  /// memory (tmpfs) from now until it is removed, page-locked while this registry maps it,
  /// and the call takes the reservation and registration time a first write would. Size it
  /// after the optimizer's first step (Adam's moments do not exist before): a file too small
  /// for the real state is replaced at the first write. Throws gpurun::Error on I/O errors,
  /// StateError after release().
  void prepare_snapshot(const std::string& path);

  /// What the last write_snapshot / read_snapshot / prepare_snapshot did and how long its
  /// parts took (seconds, steady clock). Zero-initialised before the first one.
  struct SnapshotStats {
    int64_t tensor_bytes = 0;  ///< tensor bytes copied (0 for prepare_snapshot)
    int64_t file_bytes = 0;    ///< size of the snapshot file
    bool created = false;      ///< this call created (and reserved) the file
    bool mapped = false;       ///< this call mapped an existing file (not kept from before)
    bool pinned = false;       ///< the mapping is page-locked (CUDA build, device state)
    double setup_seconds = 0;  ///< create + posix_fallocate + mmap, or open + mmap
    double pin_seconds = 0;    ///< page-locking the mapping (cudaHostRegister)
    double copy_seconds = 0;   ///< tensor copies, the final synchronise included
    double total_seconds = 0;  ///< the whole call (manifest, checks, msync, commit, ...)
  };
  const SnapshotStats& last_snapshot_stats() const;

  /// Unmaps (and unregisters) the kept snapshot file now; the file itself stays. The next
  /// snapshot call maps it again. Never throws.
  void close_snapshot() noexcept;

  bool empty() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gpurun::rt
