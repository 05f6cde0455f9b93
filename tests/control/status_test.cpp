#include "control/status.hpp"

#include <doctest/doctest.h>

#include <unistd.h>

#include <filesystem>
#include <string>

#include "gpurun_process.hpp"

namespace gpurun::control {
namespace {

namespace fs = std::filesystem;

TEST_CASE("write_status_file: a failed write leaves no .status.json.<pid> behind") {
  gpurun::testing::TempDir dir("gpurun-status-test");
  const fs::path tmp = dir.path / (".status.json." + std::to_string(::getpid()));

  SUBCASE("the rename fails (status.json is a non-empty directory)") {
    fs::create_directories(dir.path / "status.json" / "x");
    std::string error;
    CHECK_FALSE(write_status_file(dir.str(), "{}", error));
    CHECK(error.find("cannot rename '" + tmp.string() + "' to '") == 0);
    CHECK_FALSE(fs::exists(tmp));
  }
  SUBCASE("a good write replaces status.json and leaves no temp file") {
    std::string error;
    CHECK(write_status_file(dir.str(), R"({"a": 1})", error));
    CHECK(error.empty());
    CHECK(gpurun::testing::slurp(dir.path / "status.json") == "{\"a\": 1}\n");
    CHECK_FALSE(fs::exists(tmp));
  }
}

}  // namespace
}  // namespace gpurun::control
