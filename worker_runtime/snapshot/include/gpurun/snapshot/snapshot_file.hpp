// gpurun::snapshot::SnapshotFile — the host side of state snapshots: one file (normally on
// /dev/shm) created, reserved, mapped and page-locked once, then written and read in place by every
// snapshot of the process (hold mode parks many times; a release-mode process that resumed
// from the file writes the next pause into it). Layout and commit protocol:
// snapshot_format.hpp. (worker_runtime/snapshot: no torch, shared by the C++ runtime and
// libgpurun_worker.so.)
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <functional>
#include <memory>

#include "gpurun/snapshot/format.hpp"
#include "gpurun/snapshot/mapped_file.hpp"

namespace gpurun::snapshot {

/// A page-locked host range (cudaHostRegister), unpinned when destroyed. This library has no
/// CUDA: the process installs how to pin (set_host_pinner) — the C++ runtime its LibTorch
/// seam's (compat::HostRegistration), the Python package libcudart's own functions through
/// libgpurun_worker.so's C interface.
class HostPin {
 public:
  virtual ~HostPin() = default;
  /// Forgets the registration without undoing it (the CUDA context's teardown at the
  /// process's end unpins it; destroying this object afterwards does nothing). Never throws.
  virtual void leave_to_exit() noexcept = 0;
};

/// Pins `bytes` bytes at `data` (read_only: the mapping is never written). Returns null when
/// it cannot (no device, the driver refuses): copies then still work, slower. Never throws.
using HostPinner =
    std::function<std::unique_ptr<HostPin>(uint8_t* data, size_t bytes, bool read_only)>;
/// Installs the process's pinner (replacing any before); an empty one: pin() does nothing.
/// Call before SnapshotFile::pin() runs on any thread (it reads the pinner unlocked).
void set_host_pinner(HostPinner pinner);

class SnapshotFile {
 public:
  /// Creates a snapshot file of `file_bytes` bytes named `path`: a temporary file next to it
  /// (mode 0600), reserved with posix_fallocate (a full /dev/shm fails here with ENOSPC),
  /// mapped read-write and shared, stamped with a header that holds no snapshot, then named
  /// `path`. replace = true renames it over any file there (processes that mapped the old
  /// file keep theirs until they see it is gone: is_at); replace = false only links it where
  /// no file exists and returns std::nullopt when one does (the temporary is removed).
  /// Not page-locked yet (pin). Throws gpurun::Error naming the path on I/O errors.
  static std::optional<SnapshotFile> create(const std::string& path, uint64_t file_bytes,
                                            bool replace);

  /// Maps the existing file `path` whole: read-write and shared where the file may be
  /// written, else read-only. Throws gpurun::Error naming the path on I/O errors.
  static SnapshotFile open(const std::string& path);

  SnapshotFile(SnapshotFile&&) noexcept = default;
  SnapshotFile& operator=(SnapshotFile&& other) noexcept;

  uint8_t* data() const noexcept { return file_.data(); }
  const std::string& path() const noexcept { return file_.path(); }
  size_t size() const noexcept { return file_.size(); }
  bool writable() const noexcept { return file_.writable(); }

  /// Whether `path` still names this file with its mapped size (MappedFile::is_at).
  bool is_at(const std::string& path) const noexcept { return file_.is_at(path); }

  /// Page-locks the whole mapping for device copies (the installed HostPinner:
  /// cudaHostRegister; nothing without one). Idempotent; returns the seconds it took (0 when
  /// already done). Never throws: without page-locking copies still work, slower.
  double pin();
  /// Undoes pin() (cudaHostUnregister: the driver unpins every page) and returns the seconds
  /// it took; 0 when not pinned. The mapping stays.
  double unpin() noexcept;
  bool pinned() const noexcept { return pin_ != nullptr; }
  /// Leaves the page-locking and the mapping to the process's end (HostPin and
  /// MappedFile::leave_to_exit): nothing is unpinned or unmapped now. data() is null after.
  void leave_to_exit() noexcept {
    if (pin_) pin_->leave_to_exit();  // forgotten: destroying it now undoes nothing
    pin_.reset();
    file_.leave_to_exit();
  }

  /// Locks the whole mapping in memory (mlock: resident, never swapped out; released with the
  /// mapping) — the CPU counterpart of pin() for a prepared file. Returns "" when locked (or
  /// already), else why not (the errno text, e.g. RLIMIT_MEMLOCK exceeded). Never throws.
  std::string lock_in_memory();
  bool locked() const noexcept { return locked_; }

  /// Starts writing a snapshot: clears the commit word (and syncs that page), so that the file
  /// stops being a valid snapshot before any of it changes, then writes `header` (uncommitted;
  /// file_bytes, manifest_hash, writer_pid, written_unix_ns, payload_bytes and the next
  /// sequence number are filled in here; payload_checksum is 0 until commit) and `manifest`,
  /// and zeroes the padding between the manifest and data_offset. The caller then writes the
  /// tensors at the header's offsets (and zero padding between them) and calls commit().
  /// Requires writable() and header.data_end <= size(). Throws gpurun::Error on I/O errors.
  void begin(SnapshotHeader header, std::string_view manifest);

  /// Ends the snapshot begun by begin(): records `payload_checksum` (payload_digest() of bytes
  /// [128, data_end) as written: the caller computed it from the mapping) in the header,
  /// writes the whole file back (msync + fsync; cheap on tmpfs, the disk's write time
  /// elsewhere), sets the commit word and writes its page back; then verifies: the file is
  /// still named path() with this size (is_at) and its header, read back, decodes as a
  /// committed snapshot (magic, version, header checksum, sizes, manifest hash) recording this
  /// payload checksum. Blocks. Returns the header as read back. Throws gpurun::Error naming
  /// the path on I/O errors, StateError when the read-back check fails.
  SnapshotHeader commit(uint64_t payload_checksum);

 private:
  explicit SnapshotFile(MappedFile file) : file_(std::move(file)) {}

  MappedFile file_;
  SnapshotHeader pending_;        ///< of the snapshot begun, until commit()
  bool locked_ = false;           ///< lock_in_memory() succeeded
  std::unique_ptr<HostPin> pin_;  ///< after file_: unpinned before unmapping
};

}  // namespace gpurun::snapshot
