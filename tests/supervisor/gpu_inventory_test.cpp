// GPU inventory (launcher/supervisor/gpu_inventory.hpp): count_physical_gpus asks nvidia-smi
// -L, here a stand-in first on PATH, and falls back to the driver's directory.
#include "supervisor/gpu_inventory.hpp"

#include <doctest/doctest.h>

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "gpurun_process.hpp"

namespace fs = std::filesystem;
using gpurun::testing::TempDir;

namespace {

/// PATH set to `dir` (then the system's) for the test's lifetime.
struct PathFirst {
  std::string old = ::getenv("PATH") ? ::getenv("PATH") : "";
  explicit PathFirst(const fs::path& dir) {
    ::setenv("PATH", (dir.string() + ":/usr/bin:/bin").c_str(), 1);
  }
  ~PathFirst() { ::setenv("PATH", old.c_str(), 1); }
};

void write_script(const fs::path& path, const std::string& body) {
  std::ofstream(path) << "#!/bin/sh\n" << body;
  fs::permissions(path, fs::perms::owner_all);
}

int driver_gpus() {
  std::error_code ec;
  int n = 0;
  for (auto it = fs::directory_iterator("/proc/driver/nvidia/gpus", ec);
       !ec && it != fs::directory_iterator(); it.increment(ec))
    ++n;
  return n;
}

}  // namespace

TEST_CASE("count_physical_gpus: the GPU lines of nvidia-smi -L; its failure falls back") {
  TempDir dir;
  const PathFirst path(dir.path);
  write_script(dir.path / "nvidia-smi",
               "test \"$1\" = -L || exit 2\necho 'GPU 0: NVIDIA H100 (UUID: GPU-a)'\n"
               "echo '  MIG 1g.10gb Device 0: (UUID: MIG-b)'\necho 'GPU 1: NVIDIA H100 (UUID: "
               "GPU-c)'\necho 'a warning' >&2\n");
  CHECK(gpurun::supervisor::count_physical_gpus() == 2);
  // Failing (exit 9) after printing GPU lines: not trusted, the driver's directory counts.
  write_script(dir.path / "nvidia-smi", "echo 'GPU 0: NVIDIA H100'\nexit 9\n");
  CHECK(gpurun::supervisor::count_physical_gpus() == driver_gpus());
}
