// gpurun::energy::Nvml against the fake NVML library (launcher/energy/simulated_nvml/).
#include "energy/nvml.hpp"

#include <doctest/doctest.h>

#include <dlfcn.h>
#include <stdlib.h>

#include <chrono>
#include <cmath>
#include <set>

#include "energy/simulated_nvml/simulated_nvml_state.hpp"
#include "gpurun_process.hpp"

namespace fake = gpurun::energy::simulated_nvml;
using gpurun::energy::Nvml;
using gpurun::energy::NvmlError;
using gpurun::testing::TempDir;

namespace {

/// A state file in a scratch directory, named by GPURUN_FAKE_NVML_STATE, with the fake as
/// GPURUN_NVML_LIBRARY.
struct FakeGpus {
  TempDir dir{"gpurun-nvml"};
  std::string path = (dir.path / "state").string();
  explicit FakeGpus(const fake::State& s) {
    fake::write_state(path, s);
    ::setenv("GPURUN_NVML_LIBRARY", GPURUN_FAKE_NVML, 1);
    ::setenv("GPURUN_FAKE_NVML_STATE", path.c_str(), 1);
  }
  std::unique_ptr<Nvml> open() {
    std::string why_not;
    auto nvml = Nvml::open(why_not);
    REQUIRE_MESSAGE(nvml != nullptr, why_not);
    CHECK(why_not.empty());
    return nvml;
  }
};

}  // namespace

TEST_CASE("nvml: a missing library gives nullptr and one sentence naming it") {
  ::setenv("GPURUN_NVML_LIBRARY", "/nonexistent/libnvidia-ml.so.1", 1);
  std::string why_not;
  auto nvml = Nvml::open(why_not);
  CHECK(nvml == nullptr);
  CHECK(why_not.find("/nonexistent/libnvidia-ml.so.1") != std::string::npos);
  CHECK(why_not.find("could not be loaded") != std::string::npos);
  CHECK(why_not.find('\n') == std::string::npos);
}

TEST_CASE("nvml: nvmlInit_v2 failing (no state file) gives nullptr and the NVML reason") {
  ::setenv("GPURUN_NVML_LIBRARY", GPURUN_FAKE_NVML, 1);
  ::setenv("GPURUN_FAKE_NVML_STATE", "/nonexistent/fake-nvml-state", 1);
  std::string why_not;
  auto nvml = Nvml::open(why_not);
  CHECK(nvml == nullptr);
  CHECK(why_not.find("nvmlInit_v2") != std::string::npos);
  CHECK(why_not.find("Driver Not Loaded (code 9)") != std::string::npos);
}

TEST_CASE("nvml: devices, names, UUIDs and limits as the state file says") {
  fake::State s = fake::h200s(2, fake::unix_now());
  s.gpus[1].name = "NVIDIA H100 80GB HBM3";
  s.gpus[1].min_w = 150;
  s.gpus[1].max_w = 650.5;
  s.gpus[1].default_w = 640;
  s.gpus[1].limit_w = 500;
  FakeGpus gpus(s);
  auto nvml = gpus.open();
  CHECK(nvml->library() == GPURUN_FAKE_NVML);
  REQUIRE(nvml->device_count() == 2);
  auto d1 = nvml->device_by_index(1);
  CHECK(nvml->uuid(d1) == fake::test_uuid(1));
  CHECK(nvml->name(d1) == "NVIDIA H100 80GB HBM3");
  CHECK(nvml->device_by_uuid(fake::test_uuid(1)) == d1);
  CHECK(nvml->device_by_uuid(fake::test_uuid(0)) != d1);
  CHECK(nvml->power_limit_constraints_mw(d1) == std::pair<unsigned, unsigned>{150000, 650500});
  CHECK(nvml->default_power_limit_mw(d1) == 640000);
  CHECK(nvml->power_limit_mw(d1) == 500000);
  CHECK(nvml->power_limit_mw(nvml->device_by_index(0)) == 700000);
}

TEST_CASE("nvml: unknown UUID and index throw NvmlError naming the function and GPU") {
  FakeGpus gpus(fake::h200s(1, fake::unix_now()));
  auto nvml = gpus.open();
  try {
    nvml->device_by_uuid("GPU-ffffffff-0000-0000-0000-000000000000");
    FAIL("no throw");
  } catch (const NvmlError& e) {
    CHECK(e.code() == 6);
    CHECK(std::string(e.what()) ==
          "nvmlDeviceGetHandleByUUID on GPU GPU-ffffffff-0000-0000-0000-000000000000: Not Found "
          "(code 6)");
  }
  try {
    nvml->device_by_index(3);
    FAIL("no throw");
  } catch (const NvmlError& e) {
    CHECK(std::string(e.what()) ==
          "nvmlDeviceGetHandleByIndex_v2 on GPU 3: Invalid Argument (code 2)");
  }
}

TEST_CASE("nvml: the energy counter is the integral of the schedule (hand-computed)") {
  // GPU 0: 100 W for 5 s, 300 W for 3 s, then idle (0 W): 500 J + 900 J = 1400 J.
  // GPU 1: same schedule but capped at 200 W: 500 J + 3 s * 200 W = 1100 J.
  fake::State s = fake::h200s(2, fake::unix_now() - 9.0);  // 9 s ago: all segments are past
  s.gpus[0].draw = {{0, 100}, {5, 300}, {8, 0}};
  s.gpus[1].draw = {{0, 100}, {5, 300}, {8, 0}};
  s.gpus[1].limit_w = 200;
  FakeGpus gpus(s);
  auto nvml = gpus.open();
  CHECK(nvml->total_energy_mj(nvml->device_by_index(0)) == 1400000);
  CHECK(nvml->total_energy_mj(nvml->device_by_index(1)) == 1100000);
  CHECK(nvml->power_mw(nvml->device_by_index(0)) == 0);
  CHECK(fake::read_state(gpus.path).energy_reads == 2);
}

TEST_CASE("nvml: the energy counter only moves every energy_period_ms (100 ms)") {
  // 250 W constant: the counter is 250 W * (a multiple of 0.1 s) = multiples of 25 J.
  // The fake's clock is stopped 1 s after t0 and advanced 5 ms between reads.
  fake::State s = fake::h200s(1, fake::unix_now() - 1.0);
  s.now = *s.t0 + 1.0;
  s.gpus[0].draw = {{0, 250}};
  FakeGpus gpus(s);
  auto nvml = gpus.open();
  auto d = nvml->device_by_index(0);
  std::vector<uint64_t> reads;
  const double start = *s.now;
  double now = start;
  while (now - start < 0.450 - 1e-6) {
    reads.push_back(nvml->total_energy_mj(d));
    now = fake::advance(gpus.path, 0.005);
  }
  const auto elapsed_ms = static_cast<int64_t>(std::lround((now - start) * 1000));
  REQUIRE(reads.size() >= 10);
  // Unquantised, two reads 5 ms apart would differ by 1.25 J; quantised, most are equal.
  size_t equal_pairs = 0;
  for (size_t i = 1; i < reads.size(); ++i) {
    CHECK(reads[i] >= reads[i - 1]);
    if (reads[i] == reads[i - 1]) ++equal_pairs;
  }
  CHECK(equal_pairs * 2 > reads.size());
  std::set<uint64_t> distinct(reads.begin(), reads.end());
  for (uint64_t mj : distinct) CHECK(mj % 25000 == 0);  // 250 W * a multiple of 0.1 s
  CHECK(distinct.size() >= 2);                          // it does move
  CHECK(distinct.size() <= static_cast<size_t>(elapsed_ms / 100 + 2));
  // About 1 s after t0: 250 J, plus what accrued while reading.
  CHECK(*distinct.begin() >= 250000);
  CHECK(*distinct.rbegin() <= 250000 + 250 * static_cast<uint64_t>(elapsed_ms + 200));
}

TEST_CASE("nvml: the actual draw is capped by a limit set through NVML, and energy follows") {
  fake::State s = fake::h200s(1, fake::unix_now());
  s.now = s.t0;  // a stopped clock, advanced below
  s.gpus[0].draw = {{0, 600}};
  FakeGpus gpus(s);
  auto nvml = gpus.open();
  auto d = nvml->device_by_index(0);
  CHECK(nvml->power_mw(d) == 600000);
  nvml->set_power_limit_mw(d, 400000);
  CHECK(nvml->power_limit_mw(d) == 400000);
  CHECK(nvml->power_mw(d) == 400000);
  CHECK(fake::current_limit_w(gpus.path, 0) == 400.0);
  double speed = 0;
  // The fake's relative speed, as test workers read it: (400/600)^0.5.
  using SpeedFn = int (*)(unsigned, double*);
  void* dl = ::dlopen(GPURUN_FAKE_NVML, RTLD_NOW);
  REQUIRE(dl != nullptr);
  auto relative_speed = reinterpret_cast<SpeedFn>(::dlsym(dl, "gpurunFakeNvmlRelativeSpeed"));
  REQUIRE(reinterpret_cast<void*>(relative_speed) != nullptr);
  CHECK(relative_speed(0, &speed) == 0);
  CHECK(speed == doctest::Approx(std::sqrt(400.0 / 600.0)));
  // The energy since the change accrues at 400 W: the fake's own formula agrees with the
  // counter (same history), and the counter is below the uncapped 600 W integral.
  fake::advance(gpus.path, 0.3);
  const fake::State now = fake::read_state(gpus.path);
  REQUIRE(now.gpus[0].limits.size() == 1);
  const double t_set = now.gpus[0].limits[0].first;
  const uint64_t mj = nvml->total_energy_mj(d);
  const double t = fake::now_s(now) - *now.t0;
  CHECK(mj >= static_cast<uint64_t>((600.0 * t_set + 400.0 * (t - 0.11 - t_set)) * 1000.0 - 1));
  CHECK(mj <= static_cast<uint64_t>((600.0 * t_set + 400.0 * (t - t_set)) * 1000.0 + 1));
  nvml->set_power_limit_mw(d, 700000);
  CHECK(nvml->power_mw(d) == 600000);
  CHECK(relative_speed(0, &speed) == 0);
  CHECK(speed == 1.0);
  ::dlclose(dl);
}

TEST_CASE("nvml: a limit outside the constraints is refused like the driver does") {
  FakeGpus gpus(fake::h200s(1, fake::unix_now()));
  auto nvml = gpus.open();
  auto d = nvml->device_by_index(0);
  CHECK_THROWS_AS(nvml->set_power_limit_mw(d, 150000), NvmlError);
  CHECK_THROWS_AS(nvml->set_power_limit_mw(d, 700001), NvmlError);
  CHECK(nvml->power_limit_mw(d) == 700000);
}

TEST_CASE("nvml: a permission error on demand surfaces as NvmlError with no_permission()") {
  fake::State s = fake::h200s(2, fake::unix_now());
  s.errors.push_back({"nvmlDeviceSetPowerManagementLimit", 4, 1u});  // only GPU 1
  FakeGpus gpus(s);
  auto nvml = gpus.open();
  nvml->set_power_limit_mw(nvml->device_by_index(0), 500000);  // GPU 0 is allowed
  CHECK(fake::current_limit_w(gpus.path, 0) == 500.0);
  try {
    nvml->set_power_limit_mw(nvml->device_by_index(1), 500000);
    FAIL("no throw");
  } catch (const NvmlError& e) {
    CHECK(e.no_permission());
    CHECK_FALSE(e.not_supported());
    CHECK(std::string(e.what()) == "nvmlDeviceSetPowerManagementLimit on GPU " +
                                       fake::test_uuid(1) +
                                       " (to 500000 mW): Insufficient Permissions (code 4)");
  }
  CHECK(fake::current_limit_w(gpus.path, 1) == 700.0);
}

TEST_CASE("nvml: t0 is stamped by the first process that loads a file without it") {
  FakeGpus gpus(fake::h200s(1));  // no t0
  CHECK_FALSE(fake::read_state(gpus.path).t0.has_value());
  const double before = fake::unix_now();
  auto nvml = gpus.open();
  const auto t0 = fake::read_state(gpus.path).t0;
  REQUIRE(t0.has_value());
  CHECK(*t0 >= before - 0.001);
  CHECK(*t0 <= fake::unix_now() + 0.001);
}
