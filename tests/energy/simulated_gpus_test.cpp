// --simulate-gpus' spec (launcher/energy/simulated_gpus.hpp): a count or a state file, and what
// is refused, with the words a user reads.
#include "energy/simulated_gpus.hpp"

#include <doctest/doctest.h>

#include <fstream>
#include <string>

#include "gpurun/error.hpp"
#include "gpurun_process.hpp"  // TempDir

namespace en = gpurun::energy;

namespace {
std::string error_of(const std::string& spec) {
  try {
    en::simulated_gpus(spec);
  } catch (const gpurun::UsageError& e) {
    return e.what();
  }
  return "<no error>";
}
}  // namespace

TEST_CASE("simulated GPUs: N H200s, or a state file's GPUs; anything else says what to give") {
  const auto two = en::simulated_gpus("2");
  REQUIRE(two.gpus.size() == 2);
  CHECK(two.gpus[1].name == "Simulated H200");
  CHECK(two.gpus[1].max_w == 700);
  CHECK(en::simulated_gpus("64").gpus.size() == 64);
  for (const char* n : {"0", "65", "999999999999"})
    CHECK(error_of(n) == std::string("invalid value '") + n +
                             "' for --simulate-gpus: give 1 to 64 GPUs, or a state file");

  gpurun::testing::TempDir dir("gpurun-sim");
  const std::string file = dir.str() + "/gpus.txt";
  std::ofstream(file) << "# two\ngpu 1 uuid=GPU-b name=\"B\" full_w=300\ngpu 0 uuid=GPU-a\n";
  const auto mine = en::simulated_gpus(file);
  REQUIRE(mine.gpus.size() == 2);
  CHECK(mine.gpus[1].name == "B");
  CHECK(mine.gpus[1].full_w == 300);

  CHECK(error_of(dir.str() + "/none.txt") ==
        "cannot read the --simulate-gpus state file " + dir.str() +
            "/none.txt: it does not exist (give 1 to 64 GPUs, or a state file)");
  CHECK(error_of(dir.str()).find("it is a directory") != std::string::npos);
  std::ofstream(dir.str() + "/empty.txt") << "# no gpu lines\n";
  CHECK(error_of(dir.str() + "/empty.txt") ==
        "--simulate-gpus " + dir.str() + "/empty.txt: 0 'gpu' lines; give 1 to 64");
  std::ofstream(dir.str() + "/bad.txt") << "gpu 0 min_w=abc\n";
  const std::string bad = error_of(dir.str() + "/bad.txt");
  CHECK(bad.find("--simulate-gpus " + dir.str() + "/bad.txt: ") == 0);
  CHECK(bad.find("line 1") != std::string::npos);
  CHECK(bad.find("docs/energy.md#simulated-gpus") != std::string::npos);
}
