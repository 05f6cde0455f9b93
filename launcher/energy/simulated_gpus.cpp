#include "energy/simulated_gpus.hpp"

#include <cstdlib>
#include <stdexcept>

#include <fmt/format.h>

#include "gpurun/env_names.hpp"
#include "gpurun/error.hpp"
#include "gpurun/regular_file.hpp"

namespace gpurun::energy {

namespace {
constexpr unsigned kMaxSimulated = 64;
}  // namespace

simulated_nvml::State simulated_gpus(const std::string& spec) {
  const bool digits = !spec.empty() && spec.find_first_not_of("0123456789") == std::string::npos;
  if (digits) {
    const unsigned long n = spec.size() > 3 ? kMaxSimulated + 1 : std::stoul(spec);
    if (n < 1 || n > kMaxSimulated)
      throw UsageError(
          fmt::format("invalid value '{}' for --simulate-gpus: give 1 to {} GPUs, or a state file",
                      spec, kMaxSimulated));
    simulated_nvml::State s = simulated_nvml::h200s(static_cast<unsigned>(n));
    for (simulated_nvml::Gpu& g : s.gpus) g.name = "Simulated H200";
    return s;
  }
  std::string text;
  try {
    text = read_regular_file(spec, 1 << 20, "the --simulate-gpus state file").bytes;
  } catch (const Error& e) {  // "cannot read the --simulate-gpus state file F: it does not exist"
    throw UsageError(
        fmt::format("{} (give 1 to {} GPUs, or a state file)", e.what(), kMaxSimulated));
  }
  simulated_nvml::State s;
  try {
    s = simulated_nvml::parse(text);
  } catch (const std::exception& e) {
    throw UsageError(fmt::format("--simulate-gpus {}: {} (format: docs/energy.md#simulated-gpus)",
                                 spec, e.what()));
  }
  if (s.gpus.empty() || s.gpus.size() > kMaxSimulated)
    throw UsageError(fmt::format("--simulate-gpus {}: {} 'gpu' lines; give 1 to {}", spec,
                                 s.gpus.size(), kMaxSimulated));
  return s;
}

std::string install_simulated_gpus(const simulated_nvml::State& gpus, const std::string& run_dir,
                                   const std::string& library) {
  if (library.empty())
    throw Error(
        "--simulate-gpus: libgpurun_simulated_nvml.so is not next to the gpurun binary (or in "
        "its ../lib); reinstall gpurun");
  const std::string state = run_dir + "/simulated-gpus.txt";
  simulated_nvml::State s = gpus;
  if (!s.t0) s.t0 = simulated_nvml::unix_now();  // the draw schedules start now
  try {
    simulated_nvml::write_state(state, s);
  } catch (const std::exception& e) {
    throw Error(fmt::format("--simulate-gpus: cannot write {}: {}", state, e.what()));
  }
  ::setenv(env::kNvmlLibrary, library.c_str(), 1);
  ::setenv(env::kCudaLibrary, library.c_str(), 1);
  ::setenv("GPURUN_FAKE_NVML_STATE", state.c_str(), 1);
  ::setenv("GPURUN_POWER_JOURNAL", (run_dir + "/power-journal.json").c_str(), 1);
  return state;
}

}  // namespace gpurun::energy
