#include "gpurun/control/progress.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string_view>

#include <fmt/format.h>

#include "gpurun/env_names.hpp"
#include "gpurun/error.hpp"
#include "gpurun/regular_file.hpp"

namespace gpurun::control {

namespace {

static_assert(sizeof(std::atomic<uint64_t>) == 8 && std::atomic<uint64_t>::is_always_lock_free,
              "the progress file needs lock-free 64-bit atomics");

// Layout of a slot's line: [0] steps, [1] time_ns; the rest is padding.
constexpr int kSteps = 0;
constexpr int kTime = 1;

uint64_t now_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<uint64_t>(ts.tv_nsec);
}

void* map_file(int fd, std::size_t bytes, const std::string& path) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED)
    throw Error(fmt::format("progress file {}: mmap of {} bytes failed: {}", path, bytes,
                            std::strerror(errno)));
  return p;
}

std::atomic<uint64_t>* line_of(void* map, int slot) {
  return reinterpret_cast<std::atomic<uint64_t>*>(
      static_cast<char*>(map) + static_cast<std::size_t>(slot) * kProgressSlotBytes);
}

}  // namespace

std::unique_ptr<ProgressWriter> ProgressWriter::from_env() {
  const char* path = std::getenv(env::kProgressFile);
  // The file is this node's gpurun's, one line per local slot: GPURUN_LOCAL_SLOT (another
  // node's job slot id, k*1000+i, is not a line of it), else GPURUN_SLOT (older launches).
  const char* slot = std::getenv(env::kLocalSlot);
  if (!slot || !*slot) slot = std::getenv(env::kSlot);
  if (!path || !*path || !slot || !*slot) return nullptr;
  int s = -1;
  const std::string_view sv(slot);
  auto [p, ec] = std::from_chars(sv.data(), sv.data() + sv.size(), s);
  if (ec != std::errc{} || p != sv.data() + sv.size() || s < 0) return nullptr;
  try {
    return std::make_unique<ProgressWriter>(path, s);
  } catch (const Error&) {
    return nullptr;
  }
}

ProgressWriter::ProgressWriter(const std::string& path, int slot) {
  // O_NONBLOCK and a regular file only: a FIFO or a device in its place is refused, not mapped.
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0)
    throw Error(fmt::format("progress file {}: open failed: {}", path, std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(fmt::format("progress file {}: it is {}, not a regular file", path,
                            file_type_name(st.st_mode)));
  }
  const off_t size = ::lseek(fd, 0, SEEK_END);
  const auto need = static_cast<off_t>((static_cast<std::size_t>(slot) + 1) * kProgressSlotBytes);
  if (size < need) {
    ::close(fd);
    throw Error(fmt::format("progress file {}: {} bytes, too small for slot {}", path,
                            static_cast<long long>(size), slot));
  }
  // Map only this slot's page.
  const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  const std::size_t offset = static_cast<std::size_t>(slot) * kProgressSlotBytes;
  const std::size_t page_off = offset / page * page;
  void* p =
      ::mmap(nullptr, page, PROT_READ | PROT_WRITE, MAP_SHARED, fd, static_cast<off_t>(page_off));
  const int saved = errno;
  ::close(fd);
  if (p == MAP_FAILED)
    throw Error(fmt::format("progress file {}: mmap failed: {}", path, std::strerror(saved)));
  map_ = p;
  line_ = reinterpret_cast<std::atomic<uint64_t>*>(static_cast<char*>(p) + (offset - page_off));
}

ProgressWriter::~ProgressWriter() {
  if (map_) ::munmap(map_, static_cast<std::size_t>(::sysconf(_SC_PAGESIZE)));
}

void ProgressWriter::step(uint64_t global_step) {
  // time first: a reader that sees the new step count also sees (at least) its time.
  line_[kTime].store(now_ns(), std::memory_order_relaxed);
  line_[kSteps].store(global_step, std::memory_order_release);
}

ProgressFile::ProgressFile(std::string path, int slots) : path_(std::move(path)), slots_(slots) {
  const int fd = ::open(path_.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0)
    throw Error(fmt::format("progress file {}: cannot create it: {}", path_, std::strerror(errno)));
  const std::size_t bytes = static_cast<std::size_t>(std::max(slots_, 1)) * kProgressSlotBytes;
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    const int saved = errno;
    ::close(fd);
    throw Error(fmt::format("progress file {}: cannot size it to {} bytes: {}", path_, bytes,
                            std::strerror(saved)));
  }
  try {
    map_ = map_file(fd, bytes, path_);
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
}

ProgressFile::~ProgressFile() {
  if (map_) ::munmap(map_, static_cast<std::size_t>(std::max(slots_, 1)) * kProgressSlotBytes);
  ::unlink(path_.c_str());
}

Progress ProgressFile::read(int slot) const {
  if (slot < 0 || slot >= slots_) return {};
  std::atomic<uint64_t>* line = line_of(map_, slot);
  Progress p;
  p.steps = line[kSteps].load(std::memory_order_acquire);
  p.time_ns = line[kTime].load(std::memory_order_relaxed);
  return p;
}

void ProgressFile::reset(int slot) {
  if (slot < 0 || slot >= slots_) return;
  std::atomic<uint64_t>* line = line_of(map_, slot);
  line[kSteps].store(0, std::memory_order_relaxed);
  line[kTime].store(0, std::memory_order_relaxed);
}

}  // namespace gpurun::control
