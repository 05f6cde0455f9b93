// gpurun::snapshot::MappedFile — a whole file mapped into memory (RAII: unmapped and closed on
// destruction). Used for state snapshots (SnapshotFile): tensors are copied straight between
// the mapping and their device. (worker_runtime/snapshot: no torch, shared by the C++ runtime and
// libgpurun_worker.so.)
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

namespace gpurun::snapshot {

/// The process's file-size limit (RLIMIT_FSIZE, bytes) when it is below `bytes`, else nullopt.
/// A file grown past it kills the process with SIGXFSZ (Slurm propagates `ulimit -f`), so a
/// snapshot file is never created or written beyond it. Never throws.
std::optional<uint64_t> file_size_limit_below(uint64_t bytes) noexcept;
/// "RLIMIT_FSIZE (ulimit -f) is N KiB, below the pause snapshot's M KiB (raise it, ...)".
std::string file_size_limit_text(uint64_t limit, uint64_t bytes);

class MappedFile {
 public:
  /// Creates `path` (must not exist; mode 0600, close-on-exec) with `bytes` bytes, reserves
  /// the space (posix_fallocate: a full /dev/shm fails here with ENOSPC instead of SIGBUS on
  /// a later write) and maps it read-write, shared, its page tables filled at once
  /// (MAP_POPULATE: one batched pass instead of a page fault per 4 KiB at the first copy).
  /// Throws gpurun::Error naming the path, the bytes and the errno text (ENOSPC, EDQUOT,
  /// EFBIG, ...), or file_size_limit_text() when RLIMIT_FSIZE is below `bytes` (checked
  /// first: no file is made); the file is removed then.
  static MappedFile create(const std::string& path, size_t bytes);

  /// Opens `path` and maps it whole, read-only (private). Throws gpurun::Error naming the
  /// path on I/O errors. size() is the file's size at open time.
  static MappedFile open_read_only(const std::string& path);

  /// Opens the existing file `path` and maps it whole, read-write, shared (writes reach the
  /// file and every other mapping of it), page tables filled at once (MAP_POPULATE). Throws
  /// gpurun::Error naming the path (errno text; EACCES/EROFS when the file cannot be written:
  /// open_read_only() still may).
  static MappedFile open_read_write(const std::string& path);

  MappedFile() = default;
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  uint8_t* data() const noexcept { return data_; }
  size_t size() const noexcept { return size_; }
  const std::string& path() const noexcept { return path_; }
  bool writable() const noexcept { return writable_; }

  /// Whether `path` still names this file (same device and inode) with the size it was
  /// mapped with: false once it was replaced, removed or truncated. Never throws.
  bool is_at(const std::string& path) const noexcept;

  /// Gives the file the name `path` (this object's path() becomes it): replace = true renames
  /// over whatever is there (a mapping of the old file elsewhere keeps the old file);
  /// replace = false links the file there only if `path` does not exist (false then, and
  /// the file keeps its name). Throws gpurun::Error naming both paths on other errors.
  bool move_to(const std::string& path, bool replace);

  /// Writes the mapping back and fsyncs the file (blocks; cheap on tmpfs). Throws
  /// gpurun::Error naming the path.
  void sync();

  /// Writes bytes [offset, offset + bytes) of the mapping back (msync, whole pages; blocks).
  /// Throws gpurun::Error naming the path.
  void sync_range(size_t offset, size_t bytes);

  /// Unmaps and closes now (idempotent); close() errors are reported as gpurun::Error.
  void close();
  /// Closes the file but leaves the mapping to the process's end (it is never unmapped): for
  /// a process about to exit, whose kernel teardown unmaps it with no other thread left to
  /// interrupt (a live munmap of a multi-threaded process's 7.5 GB mapping took ~0.5 s of
  /// TLB shootdowns on the H200 machine). data() is null afterwards. Never throws.
  void leave_to_exit() noexcept;

 private:
  MappedFile(std::string path, int fd, uint8_t* data, size_t size, bool writable)
      : path_(std::move(path)), fd_(fd), data_(data), size_(size), writable_(writable) {}
  void reset() noexcept;

  std::string path_;
  int fd_ = -1;
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
  bool writable_ = false;
};

}  // namespace gpurun::snapshot
