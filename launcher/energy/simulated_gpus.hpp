// `gpurun --simulate-gpus N|FILE` (docs/energy.md#simulated-gpus): the energy features on a
// machine without NVIDIA GPUs. gpurun loads libgpurun_simulated_nvml.so (an NVML and CUDA-driver
// subset, simulated_nvml/) in place of libnvidia-ml and libcuda; the GPUs it simulates are a
// text state file (simulated_nvml/simulated_nvml_state.hpp) that gpurun keeps in the run dir,
// with the power-limit journal beside it: nothing is written outside the run dir.
#pragma once

#include <string>

#include "energy/simulated_nvml/simulated_nvml_state.hpp"

namespace gpurun::energy {

/// The GPUs `--simulate-gpus SPEC` asks for: SPEC = N (1 to 64) simulated H200s (200–700 W
/// limits, 700 W limit, 600 W uncapped draw, t0 = when gpurun starts), or the path of a state
/// file in simulated_nvml_state.hpp's format (power curves, limits, errors; the run works on a
/// copy). Throws UsageError naming SPEC (or the file and its line) when it is neither.
simulated_nvml::State simulated_gpus(const std::string& spec);

/// Writes `gpus` to `<run_dir>/simulated-gpus.txt` and points this process, and so every
/// helper and child it starts, at them: GPURUN_NVML_LIBRARY and GPURUN_CUDA_LIBRARY =
/// `library`, GPURUN_FAKE_NVML_STATE = that file, GPURUN_POWER_JOURNAL =
/// `<run_dir>/power-journal.json` (never /var/lib/gpurun or ~/.local/state). Calls setenv: call
/// it before any thread that reads the environment starts. Returns the state file's path.
/// Throws gpurun::Error when the file cannot be written.
std::string install_simulated_gpus(const simulated_nvml::State& gpus, const std::string& run_dir,
                                   const std::string& library);

}  // namespace gpurun::energy
