// Slot -> GPU mapping (energy/gpu_map.hpp) against the fake NVML + CUDA library.
#include "energy/gpu_map.hpp"

#include <doctest/doctest.h>

#include <stdlib.h>

#include "energy/simulated_nvml/simulated_nvml_state.hpp"
#include "gpurun/error.hpp"
#include "gpurun_process.hpp"

namespace fake = gpurun::energy::simulated_nvml;
using namespace gpurun::energy;
using gpurun::testing::TempDir;

namespace {

using Entries = std::optional<std::vector<std::string>>;

/// Three fake GPUs whose CUDA order (2, 0, 1) differs from NVML's (0, 1, 2): CUDA device 0 is
/// NVML GPU 2. The fake is both GPURUN_NVML_LIBRARY and GPURUN_CUDA_LIBRARY.
struct ThreeGpus {
  TempDir dir{"gpurun-gpumap"};
  std::string path = (dir.path / "state").string();
  std::unique_ptr<Nvml> nvml;
  ThreeGpus() {
    fake::State s = fake::h200s(3, fake::unix_now());
    s.cuda_order = {2, 0, 1};
    s.gpus[2].min_w = 100;
    fake::write_state(path, s);
    ::setenv("GPURUN_NVML_LIBRARY", GPURUN_FAKE_NVML, 1);
    ::setenv("GPURUN_CUDA_LIBRARY", GPURUN_FAKE_NVML, 1);
    ::setenv("GPURUN_FAKE_NVML_STATE", path.c_str(), 1);
    ::unsetenv("CUDA_VISIBLE_DEVICES");
    ::unsetenv("CUDA_DEVICE_ORDER");
    std::string why_not;
    nvml = Nvml::open(why_not);
    REQUIRE_MESSAGE(nvml != nullptr, why_not);
  }
  ~ThreeGpus() { ::unsetenv("CUDA_VISIBLE_DEVICES"); }

  /// What gpurun does: CUDA's UUIDs under `cvd` (nullopt: unset), then map_slots.
  std::vector<MonitoredGpu> map(const Entries& cvd, std::vector<int> slots, std::string& warning) {
    if (cvd) {
      std::string v;
      for (size_t i = 0; i < cvd->size(); ++i) v += (i ? "," : "") + (*cvd)[i];
      ::setenv("CUDA_VISIBLE_DEVICES", v.c_str(), 1);
    } else {
      ::unsetenv("CUDA_VISIBLE_DEVICES");
    }
    std::string why_not;
    const auto cuda = cuda_visible_uuids(why_not);
    REQUIRE_MESSAGE(cuda.has_value(), why_not);
    return map_slots(*nvml, slots, cvd, cuda, warning);
  }
};

std::vector<std::string> uuids(const std::vector<MonitoredGpu>& gpus) {
  std::vector<std::string> out;
  for (const auto& g : gpus) out.push_back(g.uuid);
  return out;
}

}  // namespace

TEST_CASE("gpu map: cuda_visible_uuids formats CUDA's 16 bytes exactly as NVML prints them") {
  ThreeGpus gpus;
  ::unsetenv("CUDA_VISIBLE_DEVICES");
  std::string why_not;
  const auto cuda = cuda_visible_uuids(why_not);
  REQUIRE_MESSAGE(cuda.has_value(), why_not);
  // CUDA's order: NVML 2, 0, 1.
  CHECK(*cuda ==
        std::vector<std::string>{fake::test_uuid(2), fake::test_uuid(0), fake::test_uuid(1)});
  CHECK((*cuda)[0].substr(0, 13) == "GPU-a2020202-");
  CHECK((*cuda)[0].substr(22) == "-3333-000000000002");
}

TEST_CASE("gpu map: cuda_visible_uuids honours CUDA_DEVICE_ORDER=PCI_BUS_ID") {
  ThreeGpus gpus;
  ::setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID", 1);
  std::string why_not;
  const auto cuda = cuda_visible_uuids(why_not);
  ::unsetenv("CUDA_DEVICE_ORDER");
  REQUIRE(cuda.has_value());
  CHECK(*cuda ==
        std::vector<std::string>{fake::test_uuid(0), fake::test_uuid(1), fake::test_uuid(2)});
}

TEST_CASE("gpu map: a missing CUDA library or a failing cuInit gives nullopt and why") {
  ThreeGpus gpus;
  std::string why_not;
  ::setenv("GPURUN_CUDA_LIBRARY", "/nonexistent/libcuda.so.1", 1);
  CHECK_FALSE(cuda_visible_uuids(why_not).has_value());
  CHECK(why_not.find("/nonexistent/libcuda.so.1 could not be loaded") != std::string::npos);
  ::setenv("GPURUN_CUDA_LIBRARY", GPURUN_FAKE_NVML, 1);
  fake::update_state(gpus.path, [](fake::State& s) { s.errors.push_back({"cuInit", 100, {}}); });
  why_not.clear();
  CHECK_FALSE(cuda_visible_uuids(why_not).has_value());
  CHECK(why_not.find("cuInit") != std::string::npos);
  CHECK(why_not.find("CUresult 100") != std::string::npos);
}

TEST_CASE("gpu map: without CUDA_VISIBLE_DEVICES slot i is CUDA device i, found by UUID") {
  ThreeGpus gpus;
  std::string warning = "stale";
  const auto m = gpus.map(std::nullopt, {0, 1, 2}, warning);
  // By position it would be NVML 0, 1, 2; CUDA's order is NVML 2, 0, 1.
  CHECK(uuids(m) ==
        std::vector<std::string>{fake::test_uuid(2), fake::test_uuid(0), fake::test_uuid(1)});
  CHECK(warning.empty());
  REQUIRE(m.size() == 3);
  CHECK(m[0].slot == 0);
  CHECK(m[0].device == gpus.nvml->device_by_index(2));
  CHECK(m[0].name == "NVIDIA H200");
  CHECK(m[0].min_limit_mw == 100000);
  CHECK(m[0].max_limit_mw == 700000);
  CHECK(m[1].min_limit_mw == 200000);
}

TEST_CASE("gpu map: CUDA_VISIBLE_DEVICES as reordered indices maps through CUDA's order") {
  ThreeGpus gpus;
  std::string warning;
  // CUDA devices 2 and 0 are NVML 1 and 2. Mapping by the index as an NVML index would give
  // NVML 2 and 0; mapping slots by position would give NVML 0 and 1.
  const auto m = gpus.map(Entries{{"2", "0"}}, {0, 1}, warning);
  CHECK(uuids(m) == std::vector<std::string>{fake::test_uuid(1), fake::test_uuid(2)});
  REQUIRE(m.size() == 2);
  CHECK(m[0].slot == 0);
  CHECK(m[1].slot == 1);
  CHECK(m[1].device == gpus.nvml->device_by_index(2));
  // The NVML index, not CUDA's: what DCGM exporter's `gpu` label and job files use.
  CHECK(m[0].index == 1);
  CHECK(m[1].index == 2);
  CHECK(warning.empty());
  // Only slot 1 asked for: still CUDA device 1 of the visible list.
  const auto one = gpus.map(Entries{{"2", "0"}}, {1}, warning);
  CHECK(uuids(one) == std::vector<std::string>{fake::test_uuid(2)});
}

TEST_CASE("gpu map: CUDA_VISIBLE_DEVICES as full UUIDs and as unique prefixes") {
  ThreeGpus gpus;
  std::string warning;
  const auto full = gpus.map(Entries{{fake::test_uuid(1), fake::test_uuid(0)}}, {0, 1}, warning);
  CHECK(uuids(full) == std::vector<std::string>{fake::test_uuid(1), fake::test_uuid(0)});
  CHECK(full.at(0).device == gpus.nvml->device_by_index(1));
  const auto prefix = gpus.map(Entries{{"GPU-a2", "GPU-a0000"}}, {0, 1}, warning);
  CHECK(uuids(prefix) == std::vector<std::string>{fake::test_uuid(2), fake::test_uuid(0)});
  CHECK(warning.empty());
}

TEST_CASE("gpu map: unknown or ambiguous UUIDs and out-of-range slots name slot and entry") {
  ThreeGpus gpus;
  std::string warning;
  const Entries unknown{{fake::test_uuid(0), "GPU-deadbeef"}};
  CHECK_THROWS_WITH_AS(map_slots(*gpus.nvml, {0, 1}, unknown, std::nullopt, warning),
                       doctest::Contains("slot 1 (CUDA_VISIBLE_DEVICES entry 'GPU-deadbeef'): no "
                                         "GPU with that UUID"),
                       gpurun::Error);
  const Entries ambiguous{{"GPU-a"}};
  CHECK_THROWS_WITH_AS(map_slots(*gpus.nvml, {0}, ambiguous, std::nullopt, warning),
                       doctest::Contains("slot 0 (CUDA_VISIBLE_DEVICES entry 'GPU-a'): the UUID "
                                         "prefix is ambiguous"),
                       gpurun::Error);
  const Entries two{{"0", "1"}};
  CHECK_THROWS_WITH_AS(map_slots(*gpus.nvml, {2}, two, std::nullopt, warning),
                       doctest::Contains("slot 2 has no CUDA_VISIBLE_DEVICES entry"),
                       gpurun::Error);
  const Entries big{{"7"}};
  CHECK_THROWS_WITH_AS(map_slots(*gpus.nvml, {0}, big, std::nullopt, warning),
                       doctest::Contains("slot 0 (CUDA_VISIBLE_DEVICES entry '7'): GPU index 7 is "
                                         "out of range"),
                       gpurun::Error);
}

TEST_CASE("gpu map: MIG entries are left out with a warning naming them") {
  ThreeGpus gpus;
  std::string warning;
  const Entries mig{{"MIG-11111111-2222-3333-4444-555555555555", fake::test_uuid(0)}};
  const auto m = map_slots(*gpus.nvml, {0, 1}, mig, std::nullopt, warning);
  REQUIRE(m.size() == 1);
  CHECK(m[0].slot == 1);
  CHECK(m[0].uuid == fake::test_uuid(0));
  CHECK(warning.find("slot 0 (CUDA_VISIBLE_DEVICES entry "
                     "'MIG-11111111-2222-3333-4444-555555555555') is a MIG instance") !=
        std::string::npos);
}

TEST_CASE("gpu map: without CUDA's UUIDs an index falls back to the NVML index, with a warning") {
  ThreeGpus gpus;
  std::string warning;
  const auto m = map_slots(*gpus.nvml, {0, 1}, Entries{{"2", "0"}}, std::nullopt, warning);
  CHECK(uuids(m) == std::vector<std::string>{fake::test_uuid(2), fake::test_uuid(0)});
  CHECK(warning.find("CUDA_DEVICE_ORDER=PCI_BUS_ID") != std::string::npos);
}

TEST_CASE("gpu map: a CUDA_VISIBLE_DEVICES list CUDA cut short leaves later slots an error") {
  ThreeGpus gpus;
  std::string warning;
  // CUDA stops at the invalid "9": it sees one device, so slot 1 has none.
  CHECK_THROWS_WITH_AS(gpus.map(Entries{{"1", "9"}}, {0, 1}, warning),
                       doctest::Contains("slot 1 (CUDA_VISIBLE_DEVICES entry '9'): CUDA sees only "
                                         "1 GPU(s)"),
                       gpurun::Error);
}

TEST_CASE("gpu map: one GPU named twice (two slots, one UUID) is an error, not double energy") {
  ThreeGpus gpus;
  std::string warning;
  CHECK_THROWS_WITH_AS(
      gpus.map(Entries{{fake::test_uuid(1), "GPU-a1"}}, {0, 1}, warning),
      doctest::Contains(("slots 0 and 1 both map to GPU " + fake::test_uuid(1)).c_str()),
      gpurun::Error);
}
