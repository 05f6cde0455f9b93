#include "gpurun/snapshot/mapped_file.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "gpurun/check.hpp"
#include "gpurun/regular_file.hpp"

namespace gpurun::snapshot {
namespace {

[[noreturn]] void throw_io(const std::string& what, const std::string& path, int err) {
  throw Error(fmt::format("state snapshot: {} '{}' failed: {}", what, path, std::strerror(err)));
}

/// A snapshot is mapped: a FIFO or a device named in its place is refused (opened
/// O_NONBLOCK, so a FIFO never hangs the open).
void require_regular(const std::string& path, const struct stat& st) {
  if (!S_ISREG(st.st_mode))
    throw Error(fmt::format("state snapshot: '{}' is {}, not a regular file", path,
                            file_type_name(st.st_mode)));
}

}  // namespace

std::optional<uint64_t> file_size_limit_below(uint64_t bytes) noexcept {
  struct rlimit lim {};
  if (::getrlimit(RLIMIT_FSIZE, &lim) != 0 || lim.rlim_cur == RLIM_INFINITY) return std::nullopt;
  if (static_cast<uint64_t>(lim.rlim_cur) >= bytes) return std::nullopt;
  return static_cast<uint64_t>(lim.rlim_cur);
}

std::string file_size_limit_text(uint64_t limit, uint64_t bytes) {
  return fmt::format(
      "RLIMIT_FSIZE (ulimit -f) is {} KiB, below the pause snapshot's {} KiB (raise it, e.g. "
      "`ulimit -f unlimited` before gpurun in the job script)",
      limit >> 10, (bytes + 1023) >> 10);
}

MappedFile MappedFile::create(const std::string& path, size_t bytes) {
  GPURUN_CHECK(bytes > 0, "mapping an empty file '{}'", path);
  if (const auto limit = file_size_limit_below(bytes))
    throw Error(fmt::format("state snapshot: '{}': {}", path, file_size_limit_text(*limit, bytes)));
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) throw_io("creating", path, errno);
  MappedFile file(path, fd, nullptr, bytes, true);  // closes fd if anything below throws
  try {
    if (const int err = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes)); err != 0) {
      throw Error(fmt::format("state snapshot: reserving {} bytes for '{}' failed: {}", bytes, path,
                              std::strerror(err)));
    }
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (p == MAP_FAILED) throw_io("mapping", path, errno);
    file.data_ = static_cast<uint8_t*>(p);
  } catch (...) {
    ::unlink(path.c_str());  // ours (O_EXCL): a failed reservation leaves no file behind
    throw;
  }
  return file;
}

MappedFile MappedFile::open_read_only(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw_io("opening", path, errno);
  MappedFile file(path, fd, nullptr, 0, false);
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw_io("stat of", path, errno);
  require_regular(path, st);
  file.size_ = static_cast<size_t>(st.st_size);
  if (file.size_ > 0) {
    void* p = ::mmap(nullptr, file.size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) throw_io("mapping", path, errno);
    file.data_ = static_cast<uint8_t*>(p);
  }
  return file;
}

MappedFile MappedFile::open_read_write(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw_io("opening", path, errno);
  MappedFile file(path, fd, nullptr, 0, true);
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw_io("stat of", path, errno);
  require_regular(path, st);
  file.size_ = static_cast<size_t>(st.st_size);
  if (file.size_ > 0) {
    void* p = ::mmap(nullptr, file.size_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (p == MAP_FAILED) throw_io("mapping", path, errno);
    file.data_ = static_cast<uint8_t*>(p);
  }
  return file;
}

bool MappedFile::is_at(const std::string& path) const noexcept {
  if (fd_ < 0) return false;
  struct stat named {
  }, mine{};
  if (::stat(path.c_str(), &named) != 0 || ::fstat(fd_, &mine) != 0) return false;
  return named.st_dev == mine.st_dev && named.st_ino == mine.st_ino &&
         static_cast<size_t>(mine.st_size) == size_;
}

bool MappedFile::move_to(const std::string& path, bool replace) {
  if (replace) {
    if (::rename(path_.c_str(), path.c_str()) != 0) {
      throw Error(fmt::format("state snapshot: renaming '{}' to '{}' failed: {}", path_, path,
                              std::strerror(errno)));
    }
  } else {
    if (::link(path_.c_str(), path.c_str()) != 0) {
      if (errno == EEXIST) return false;
      throw Error(fmt::format("state snapshot: linking '{}' to '{}' failed: {}", path_, path,
                              std::strerror(errno)));
    }
    ::unlink(path_.c_str());
  }
  path_ = path;
  return true;
}

MappedFile::~MappedFile() {
  reset();
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : path_(std::move(other.path_)),
      fd_(std::exchange(other.fd_, -1)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      writable_(std::exchange(other.writable_, false)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    reset();
    path_ = std::move(other.path_);
    fd_ = std::exchange(other.fd_, -1);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    writable_ = std::exchange(other.writable_, false);
  }
  return *this;
}

void MappedFile::sync() {
  if (data_ != nullptr && ::msync(data_, size_, MS_SYNC) != 0) throw_io("msync of", path_, errno);
  if (fd_ >= 0 && ::fsync(fd_) != 0) throw_io("fsync of", path_, errno);
}

void MappedFile::sync_range(size_t offset, size_t bytes) {
  if (data_ == nullptr || bytes == 0) return;
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const size_t begin = offset / page * page;
  if (::msync(data_ + begin, offset + bytes - begin, MS_SYNC) != 0)
    throw_io("msync of", path_, errno);
}

void MappedFile::close() {
  if (data_ != nullptr) ::munmap(data_, size_);
  data_ = nullptr;
  if (fd_ >= 0) {
    const int fd = std::exchange(fd_, -1);
    if (::close(fd) != 0) throw_io("closing", path_, errno);
  }
}

void MappedFile::leave_to_exit() noexcept {
  data_ = nullptr;  // mapped until the process ends
  if (fd_ >= 0) ::close(std::exchange(fd_, -1));
}

void MappedFile::reset() noexcept {
  if (data_ != nullptr) ::munmap(data_, size_);
  data_ = nullptr;
  if (fd_ >= 0) ::close(std::exchange(fd_, -1));
}

}  // namespace gpurun::snapshot
