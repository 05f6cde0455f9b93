// gpurun::rt::MappedFile — a whole file mapped into memory (RAII: unmapped and closed on
// destruction). Used for state snapshots: tensors are copied straight between the mapping and
// their device. Internal header.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace gpurun::rt {

class MappedFile {
 public:
  /// Creates `path` (must not exist; mode 0600, close-on-exec) with `bytes` bytes, reserves
  /// the space (posix_fallocate: a full /dev/shm fails here with ENOSPC instead of SIGBUS on
  /// a later write) and maps it read-write, shared. Throws gpurun::Error naming the path and
  /// the errno text.
  static MappedFile create(const std::string& path, size_t bytes);

  /// Opens `path` and maps it whole, read-only (private). Throws gpurun::Error naming the
  /// path on I/O errors. size() is the file's size at open time.
  static MappedFile open_read_only(const std::string& path);

  MappedFile() = default;
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  uint8_t* data() const noexcept { return data_; }
  size_t size() const noexcept { return size_; }
  const std::string& path() const noexcept { return path_; }

  /// Writes the mapping back and fsyncs the file (blocks; cheap on tmpfs). Throws
  /// gpurun::Error naming the path.
  void sync();

  /// Unmaps and closes now (idempotent); close() errors are reported as gpurun::Error.
  void close();

 private:
  MappedFile(std::string path, int fd, uint8_t* data, size_t size)
      : path_(std::move(path)), fd_(fd), data_(data), size_(size) {}
  void reset() noexcept;

  std::string path_;
  int fd_ = -1;
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace gpurun::rt
