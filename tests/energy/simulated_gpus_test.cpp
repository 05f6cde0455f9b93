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
  const std::string a = "uuid=GPU-a0000000-0000-0000-0000-000000000000";
  const std::string b = "uuid=GPU-b0000000-0000-0000-0000-000000000001";
  std::ofstream(file) << "# two\ngpu 1 " << b << " name=\"B\" full_w=300\ngpu 0 " << a << "\n";
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

TEST_CASE("simulated GPUs: a state file with values no GPU has is refused, naming gpu and value") {
  gpurun::testing::TempDir dir("gpurun-sim");
  const std::string file = dir.str() + "/gpus.txt";
  const std::string ok0 = "gpu 0 uuid=GPU-a0000000-0000-0000-0000-000000000000\n";
  const auto refused = [&](const std::string& gpu1) {
    std::ofstream(file) << ok0 << "gpu 1 " << gpu1 << "\n";
    return error_of(file);
  };
  const std::string u1 = "uuid=GPU-a1000000-0000-0000-0000-000000000001 ";
  CHECK(refused(u1 + "full_w=300").find("<no error>") == 0);  // the rows below differ by one value
  const std::string head = "--simulate-gpus " + file + ": gpu 1: ";
  const std::string tail = " (format: docs/energy.md#simulated-gpus)";
  struct Row {
    std::string line, says;
  };
  for (const Row& r : std::vector<Row>{
           {u1 + "full_w=-50", "full_w=-50 is negative; give watts >= 0"},
           {u1 + "draw=0:300,5:-100", "draw 5:-100 is negative; give watts >= 0"},
           {u1 + "full_w=nan", "full_w=nan is not finite"},
           {u1 + "draw=inf:300", "draw inf:300 is not finite"},
           {u1 + "min_w=-1", "min_w=-1 is negative; give watts >= 0"},
           {u1 + "limits=1:-5", "limits 1:-5 is negative; give watts >= 0"},
           {u1 + "min_w=500 max_w=400", "min_w=500 is above max_w=400"},
           {u1 + "limit_w=900", "limit_w=900 is outside min_w..max_w (200..700)"},
           {u1 + "default_w=100", "default_w=100 is outside min_w..max_w (200..700)"},
           {u1 + "limits=1:800", "limits 1:800 is outside min_w..max_w (200..700)"},
           {"uuid=GPU-c",
            "uuid=GPU-c is not GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx (32 "
            "lower-case hex digits, as nvidia-smi -L prints them)"},
           {"uuid=GPU-A1000000-0000-0000-0000-000000000001",
            "uuid=GPU-A1000000-0000-0000-0000-000000000001 is not GPU-"},
           {"uuid=GPU-a10000000000-0000-0000-000000000001",
            "uuid=GPU-a10000000000-0000-0000-000000000001 is not GPU-"},
           {"uuid=GPU-a0000000-0000-0000-0000-000000000000",
            "uuid=GPU-a0000000-0000-0000-0000-000000000000 is also gpu 0's; each GPU needs its "
            "own"},
       }) {
    CAPTURE(r.line);
    const std::string err = refused(r.line);
    CHECK(err.find(head + r.says) == 0);
    CHECK(err.size() >= tail.size());
    CHECK(err.compare(err.size() - tail.size(), tail.size(), tail) == 0);
  }
  std::ofstream(file) << "now=nan\n" << ok0;
  CHECK(error_of(file) == "--simulate-gpus " + file + ": now=nan is not finite" + tail);
}
