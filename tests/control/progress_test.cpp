#include "gpurun/control/progress.hpp"

#include <doctest/doctest.h>

#include <cstdlib>

#include "gpurun_process.hpp"  // TempDir

using namespace gpurun::control;

TEST_CASE("progress: a worker writes its node-local slot's line, not its job slot id's") {
  gpurun::testing::TempDir dir("gpurun-progress");
  const ProgressFile file(dir.str() + "/progress", 2);  // this node's gpurun: two slots
  ::setenv("GPURUN_PROGRESS_FILE", file.path().c_str(), 1);
  ::setenv("GPURUN_SLOT", "1001", 1);  // node 1's local slot 1
  ::setenv("GPURUN_LOCAL_SLOT", "1", 1);
  auto writer = ProgressWriter::from_env();
  REQUIRE(writer != nullptr);
  writer->step(7);
  CHECK(file.read(1).steps == 7);
  CHECK(file.read(0).steps == 0);
  // Without GPURUN_LOCAL_SLOT (an older gpurun, one node) GPURUN_SLOT is the line.
  ::unsetenv("GPURUN_LOCAL_SLOT");
  ::setenv("GPURUN_SLOT", "0", 1);
  writer = ProgressWriter::from_env();
  REQUIRE(writer != nullptr);
  writer->step(3);
  CHECK(file.read(0).steps == 3);
  for (const char* v : {"GPURUN_PROGRESS_FILE", "GPURUN_SLOT"}) ::unsetenv(v);
}
