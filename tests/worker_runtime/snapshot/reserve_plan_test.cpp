// snapshot::plan_device_reserve: how much device memory a resume reserves ahead of its first
// step from the pause writer's hint (the executors allocate it; this is the rule).
#include <doctest/doctest.h>

#include <cstdint>
#include <cstdlib>
#include <string>

#include "gpurun/snapshot/snapshot_store.hpp"

namespace {

using gpurun::snapshot::plan_device_reserve;
constexpr uint64_t kGiB = uint64_t{1} << 30, kMiB = uint64_t{1} << 20;

struct Case {
  const char* what;
  uint64_t hint, reserved, free;
  gpurun::snapshot::DeviceAllocatorEnv env;  ///< PYTORCH_ALLOC_CONF, ..._CUDA_..., NO_CACHING
  uint64_t bytes;
  const char* note;  ///< a substring of the note; "" = no note
};

}  // namespace

TEST_CASE("device reserve: what is missing of the writer's memory, within the free memory") {
  constexpr gpurun::snapshot::DeviceAllocatorEnv none{};
  const Case cases[] = {
      {"no hint (CPU state, an older file)", 0, 0, 80 * kGiB, none, 0, ""},
      {"the state alone already holds as much", 8 * kGiB, 9 * kGiB, 60 * kGiB, none, 0, ""},
      {"the missing part, all of it", 29 * kGiB, 8 * kGiB, 70 * kGiB, none, 21 * kGiB, ""},
      {"capped at the free memory less 1 GiB", 29 * kGiB, 8 * kGiB, 5 * kGiB, none, 4 * kGiB,
       "5368709120 bytes free on the device: 4294967296 of the 22548578304 missing"},
      {"a cap under 64 MiB reserves nothing, and says so", 29 * kGiB, 8 * kGiB, kGiB + 10 * kMiB,
       none, 0, "bytes free on the device: 0 of the"},
      {"less free memory than the margin: nothing (no wrap-around)", 29 * kGiB, 8 * kGiB,
       512 * kMiB, none, 0, "536870912 bytes free on the device: 0 of the"},
      {"exactly 64 MiB missing is reserved", 8 * kGiB + 64 * kMiB, 8 * kGiB, 70 * kGiB, none,
       64 * kMiB, ""},
      {"less than 64 MiB missing: not worth an allocation", 8 * kGiB + 63 * kMiB, 8 * kGiB,
       70 * kGiB, none, 0, ""},
      {"other allocator settings do not matter",
       29 * kGiB,
       8 * kGiB,
       70 * kGiB,
       {nullptr, "expandable_segments:True,garbage_collection_threshold:0.8", nullptr},
       21 * kGiB,
       ""},
      {"max_split_size_mb (the older variable): no single segment",
       29 * kGiB,
       8 * kGiB,
       70 * kGiB,
       {nullptr, "expandable_segments:False,max_split_size_mb:512", nullptr},
       0,
       "max_split_size_mb"},
      {"max_split_size_mb in PYTORCH_ALLOC_CONF (torch >= 2.8)",
       29 * kGiB,
       8 * kGiB,
       70 * kGiB,
       {"max_split_size_mb:512", nullptr, nullptr},
       0,
       "max_split_size_mb"},
      {"the cudaMallocAsync backend keeps no segments",
       29 * kGiB,
       8 * kGiB,
       70 * kGiB,
       {"backend:cudaMallocAsync", nullptr, nullptr},
       0,
       "cudaMallocAsync"},
      {"no caching: nothing would stay reserved",
       29 * kGiB,
       8 * kGiB,
       70 * kGiB,
       {nullptr, nullptr, "1"},
       0,
       "PYTORCH_NO_CUDA_MEMORY_CACHING"},
      {"PYTORCH_NO_CUDA_MEMORY_CACHING=0 counts as set (torch <= 2.6 reads any value)",
       29 * kGiB,
       8 * kGiB,
       70 * kGiB,
       {nullptr, nullptr, "0"},
       0,
       "PYTORCH_NO_CUDA_MEMORY_CACHING"},
      {"... and empty",
       29 * kGiB,
       8 * kGiB,
       70 * kGiB,
       {nullptr, nullptr, ""},
       0,
       "PYTORCH_NO_CUDA_MEMORY_CACHING"},
      {"roundup_power2_divisions would round the request past the cap",
       29 * kGiB,
       8 * kGiB,
       70 * kGiB,
       {nullptr, "roundup_power2_divisions:4", nullptr},
       0,
       "roundup_power2_divisions"},
      {"cudaMallocAsync in the older variable too",
       29 * kGiB,
       8 * kGiB,
       70 * kGiB,
       {nullptr, "backend:cudaMallocAsync", nullptr},
       0,
       "cudaMallocAsync"},
      {"missing exactly 64 MiB, 64 MiB + margin free: all of it", 8 * kGiB + 64 * kMiB, 8 * kGiB,
       kGiB + 64 * kMiB, none, 64 * kMiB, ""},
  };
  for (const Case& c : cases) {
    CAPTURE(c.what);
    const auto p = plan_device_reserve(c.hint, c.reserved, c.free, c.env);
    CHECK(p.bytes == c.bytes);
    if (std::string(c.note).empty()) {
      CHECK(p.note.empty());
    } else {
      CHECK(p.note.find(c.note) != std::string::npos);
    }
  }
}

TEST_CASE("device reserve: the allocator's settings are read from their three variables") {
  const char* names[] = {"PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF",
                         "PYTORCH_NO_CUDA_MEMORY_CACHING"};
  for (const char* n : names) ::unsetenv(n);
  auto e = gpurun::snapshot::DeviceAllocatorEnv::from_environment();
  CHECK((e.alloc_conf == nullptr && e.cuda_alloc_conf == nullptr && e.no_caching == nullptr));
  ::setenv("PYTORCH_ALLOC_CONF", "a", 1);
  ::setenv("PYTORCH_CUDA_ALLOC_CONF", "b", 1);
  ::setenv("PYTORCH_NO_CUDA_MEMORY_CACHING", "c", 1);
  e = gpurun::snapshot::DeviceAllocatorEnv::from_environment();
  CHECK(std::string(e.alloc_conf) == "a");
  CHECK(std::string(e.cuda_alloc_conf) == "b");
  CHECK(std::string(e.no_caching) == "c");
  for (const char* n : names) ::unsetenv(n);
}
