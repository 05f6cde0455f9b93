// control::preload_libraries_beside: what a standby opens while it waits (the CUDA math
// libraries' lazily opened parts), with two tiny libraries of the test's own standing in for
// them: one loaded, one beside it that the preload must open, one of another family, one of
// another major version and a .debug file that it must leave alone, and a file that is no
// library.
#include "gpurun/worker/library_preload.hpp"

#include <dlfcn.h>

#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>

#include "gpurun_process.hpp"  // TempDir

namespace fs = std::filesystem;
using gpurun::control::preload_libraries_beside;

namespace {

bool is_loaded(const fs::path& p) {
  void* h = dlopen(p.c_str(), RTLD_NOW | RTLD_NOLOAD);
  if (h) dlclose(h);  // NOLOAD took a reference: give it back
  return h != nullptr;
}

}  // namespace

TEST_CASE("library preload: the family's libraries beside a loaded one are opened, once") {
  gpurun::testing::TempDir dir("gpurun-preload");
  const fs::path a = dir.path / "libgpurunpl_main.so.9", b = dir.path / "libgpurunpl_engines.so.9",
                 other = dir.path / "libgpurunother.so.9", bad = dir.path / "libgpurunpl_bad.so.9",
                 old_major = dir.path / "libgpurunpl_engines.so.8",
                 debug = dir.path / "libgpurunpl_engines.so.9.debug";
  fs::copy_file(GPURUN_PRELOAD_LIB_A, a);
  fs::copy_file(GPURUN_PRELOAD_LIB_B, b);
  fs::copy_file(GPURUN_PRELOAD_LIB_B, other);
  fs::copy_file(GPURUN_PRELOAD_LIB_B, old_major);  // another version of the family: left alone
  fs::copy_file(GPURUN_PRELOAD_LIB_B, debug);      // not a library name: left alone
  std::ofstream(bad) << "not an ELF file";
  fs::create_symlink(b.filename(), dir.path / "libgpurunpl_engines.so");  // a link to b

  void* main_lib = dlopen(a.c_str(), RTLD_NOW | RTLD_LOCAL);  // as libtorch_cuda loads libcudnn
  REQUIRE(main_lib != nullptr);
  REQUIRE_FALSE(is_loaded(b));

  const auto r = preload_libraries_beside({"libgpurunpl"});
  CHECK(r.loaded == 1);  // b, once (its link resolves to it)
  CHECK(is_loaded(b));
  CHECK_FALSE(is_loaded(other));      // another family
  CHECK_FALSE(is_loaded(old_major));  // another major version
  CHECK_FALSE(is_loaded(debug));
  REQUIRE(r.failed.size() == 1);  // the bad file: named, and the rest still opened
  CHECK(r.failed[0].find("libgpurunpl_bad.so.9") != std::string::npos);
  CHECK(r.seconds >= 0);

  const auto again = preload_libraries_beside({"libgpurunpl"});
  CHECK(again.loaded == 0);  // all loaded already
}

TEST_CASE("library preload: a family with no loaded member opens nothing (a CPU-only process)") {
  const auto r = preload_libraries_beside({"libgpurun_no_such_family"});
  CHECK(r.loaded == 0);
  CHECK(r.failed.empty());
  // On the CPU machine no cuDNN is loaded: a CUDA standby's families open nothing there either.
  CHECK(preload_libraries_beside(gpurun::control::cuda_library_families()).failed.empty());
}
