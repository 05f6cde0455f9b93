// gpurun::rt::SnapshotFile — the host side of state snapshots: one file (normally on /dev/shm)
// created, reserved, mapped and page-locked once, then written and read in place by every
// snapshot of the process (hold mode parks many times; a release-mode process that resumed
// from the file writes the next pause into it). Layout and commit protocol:
// snapshot_format.hpp. Internal header.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "compat/torch_compat.hpp"
#include "state/mapped_file.hpp"
#include "state/snapshot_format.hpp"

namespace gpurun::rt {

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

  /// Page-locks the whole mapping for device copies (compat::HostRegistration: cudaHostRegister
  /// in CUDA builds with a device, nothing otherwise). Idempotent; returns the seconds it took
  /// (0 when already done). Never throws: without page-locking copies still work, slower.
  double pin();
  /// Undoes pin() (cudaHostUnregister: the driver unpins every page) and returns the seconds
  /// it took; 0 when not pinned. The mapping stays.
  double unpin() noexcept;
  bool pinned() const noexcept { return registration_.pinned(); }
  /// Leaves the page-locking and the mapping to the process's end (HostRegistration and
  /// MappedFile::leave_to_exit): nothing is unpinned or unmapped now. data() is null after.
  void leave_to_exit() noexcept {
    registration_.leave_to_exit();
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
  SnapshotHeader pending_;                 ///< of the snapshot begun, until commit()
  bool locked_ = false;                    ///< lock_in_memory() succeeded
  compat::HostRegistration registration_;  ///< after file_: unregistered before unmapping
};

}  // namespace gpurun::rt
