// snapshot::plan_device_reserve: how much device memory a resume reserves ahead of its first
// step from the pause writer's hint (the executors allocate it; this is the rule).
#include <doctest/doctest.h>

#include <cstdint>
#include <string>

#include "gpurun/snapshot/snapshot_store.hpp"

namespace {

using gpurun::snapshot::plan_device_reserve;
constexpr uint64_t kGiB = uint64_t{1} << 30, kMiB = uint64_t{1} << 20;

struct Case {
  const char* what;
  uint64_t hint, reserved, free;
  const char* conf;
  const char* no_caching;
  uint64_t bytes;
  const char* note;  ///< a substring of the note; "" = no note
};

}  // namespace

TEST_CASE("device reserve: what is missing of the writer's memory, within the free memory") {
  const Case cases[] = {
      {"no hint (CPU state, an older file)", 0, 0, 80 * kGiB, nullptr, nullptr, 0, ""},
      {"the state alone already holds as much", 8 * kGiB, 9 * kGiB, 60 * kGiB, nullptr, nullptr, 0,
       ""},
      {"the missing part, all of it", 29 * kGiB, 8 * kGiB, 70 * kGiB, nullptr, nullptr, 21 * kGiB,
       ""},
      {"capped at the free memory less 1 GiB", 29 * kGiB, 8 * kGiB, 5 * kGiB, nullptr, nullptr,
       4 * kGiB, "5368709120 bytes free on the device: 4294967296 of the 22548578304 missing"},
      {"a cap under 64 MiB reserves nothing, and says so", 29 * kGiB, 8 * kGiB, kGiB + 10 * kMiB,
       nullptr, nullptr, 0, "bytes free on the device: 0 of the"},
      {"less than 64 MiB missing: not worth an allocation", 8 * kGiB + 32 * kMiB, 8 * kGiB,
       70 * kGiB, nullptr, nullptr, 0, ""},
      {"other allocator settings do not matter", 29 * kGiB, 8 * kGiB, 70 * kGiB,
       "expandable_segments:True,garbage_collection_threshold:0.8", nullptr, 21 * kGiB, ""},
      {"max_split_size_mb: one large segment would not be split", 29 * kGiB, 8 * kGiB, 70 * kGiB,
       "expandable_segments:False,max_split_size_mb:512", nullptr, 0, "max_split_size_mb"},
      {"no caching: nothing would stay reserved", 29 * kGiB, 8 * kGiB, 70 * kGiB, nullptr, "1", 0,
       "PYTORCH_NO_CUDA_MEMORY_CACHING"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.what);
    const auto p = plan_device_reserve(c.hint, c.reserved, c.free, c.conf, c.no_caching);
    CHECK(p.bytes == c.bytes);
    if (std::string(c.note).empty()) {
      CHECK(p.note.empty());
    } else {
      CHECK(p.note.find(c.note) != std::string::npos);
    }
  }
}
