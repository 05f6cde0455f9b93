// Helpers of the snapshot suites: deterministic tensor bytes, a byte changed on disk, a
// directory's entries and a fake HostPinner that records what it is asked to page-lock.
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "gpurun/snapshot/snapshot_file.hpp"

namespace gpurun::testing::snapshot {

/// `n` bytes that differ from one `seed` to another and from one offset to the next.
inline std::vector<uint8_t> pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> out(n);
  for (size_t i = 0; i < n; ++i)
    out[i] = static_cast<uint8_t>((i * 2654435761u >> 7) ^ (seed * 73u) ^ (i >> 12));
  return out;
}

/// Flips every bit of the byte at `offset` of the file `path` (a bad disk, a stray write).
inline void poke(const std::string& path, uint64_t offset) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  REQUIRE(fd >= 0);
  uint8_t b = 0;
  REQUIRE(::pread(fd, &b, 1, static_cast<off_t>(offset)) == 1);
  b = static_cast<uint8_t>(~b);
  REQUIRE(::pwrite(fd, &b, 1, static_cast<off_t>(offset)) == 1);
  ::close(fd);
}

/// The names in the directory `dir` (no "." or ".."), sorted.
inline std::vector<std::string> entries(const std::string& dir) {
  std::vector<std::string> out;
  DIR* d = ::opendir(dir.c_str());
  REQUIRE(d != nullptr);
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") out.push_back(name);
  }
  ::closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

/// A HostPinner installed for its lifetime (set_host_pinner; the empty one again after):
/// records each call and each HostPin's end, and refuses to pin while `refuse`.
struct FakePinner {
  struct Call {
    uint8_t* data;
    size_t bytes;
    bool read_only;
  };
  std::shared_ptr<std::vector<Call>> calls = std::make_shared<std::vector<Call>>();
  std::shared_ptr<int> unpinned = std::make_shared<int>(0);  ///< HostPins destroyed, not left
  std::shared_ptr<int> left = std::make_shared<int>(0);      ///< HostPins left to the exit
  bool refuse = false;

  FakePinner() {
    gpurun::snapshot::set_host_pinner(
        [calls = calls, unpinned = unpinned, left = left, refuse = &refuse](
            uint8_t* data, size_t bytes,
            bool read_only) -> std::unique_ptr<gpurun::snapshot::HostPin> {
          calls->push_back({data, bytes, read_only});
          if (*refuse) return nullptr;
          return std::make_unique<Pin>(unpinned, left);
        });
  }
  ~FakePinner() { gpurun::snapshot::set_host_pinner({}); }
  FakePinner(const FakePinner&) = delete;
  FakePinner& operator=(const FakePinner&) = delete;

 private:
  struct Pin : gpurun::snapshot::HostPin {
    Pin(std::shared_ptr<int> u, std::shared_ptr<int> l)
        : unpinned(std::move(u)), left(std::move(l)) {}
    ~Pin() override {
      if (!forgotten) ++*unpinned;
    }
    void leave_to_exit() noexcept override {
      forgotten = true;
      ++*left;
    }
    std::shared_ptr<int> unpinned, left;
    bool forgotten = false;
  };
};

}  // namespace gpurun::testing::snapshot
