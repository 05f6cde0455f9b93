// The energy monitor's set-up for the gpurun executable: whether to monitor, which GPUs the
// slots are (NVML + CUDA), the monitor with [energy]'s settings. Part of the composition root
// (main.cpp); docs/energy.md.
#pragma once

#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <boost/asio/io_context.hpp>

#include "control/config.hpp"
#include "control/status.hpp"
#include "energy/gpu_map.hpp"
#include "energy/monitor.hpp"
#include "energy/nvml.hpp"
#include "gpurun/control/progress.hpp"
#include "supervisor/console_writer.hpp"
#include "supervisor/event_log.hpp"
#include "supervisor/options.hpp"
#include "supervisor/worker_env.hpp"

namespace gpurun::app {

/// "gpurun: <msg>" on stderr: the executable's own lines.
inline void print_err(const std::string& msg) {
  supervisor::console_write(2, "gpurun: " + msg + "\n");
}

/// The monitor's figures for status.json (io thread: the totals are the io thread's).
gpurun::control::EnergyStatus energy_status(const gpurun::energy::EnergyMonitor& m);

/// Paths in [energy] are relative to the config file's directory.
std::string beside_config(const std::optional<std::string>& config, const std::string& path);

/// Where this run's [energy] history and profile cache are ("": none): the config's paths
/// (relative to its directory; the cache defaults to .gpurun-power-cache.json with --config);
/// under --simulate-gpus `<run_dir>/history.jsonl` and `<run_dir>/power-cache.json`, with one
/// console line when the config named them (docs/energy.md#simulated-gpus).
struct EnergyFiles {
  std::string history, profile_cache;
};
EnergyFiles energy_files(const supervisor::Options& opt,
                         const std::optional<gpurun::control::Config>& config,
                         const std::string& run_dir);

/// Whether gpurun should monitor energy at all (cheap; says why not when the user asked).
bool energy_wanted(const supervisor::Options& opt, const supervisor::JobPlan& plan,
                   const std::optional<gpurun::control::Config>& config);

/// NVML opened and the slots' GPUs found.
struct DiscoveredGpus {
  std::unique_ptr<gpurun::energy::Nvml> nvml;
  std::vector<gpurun::energy::MonitoredGpu> gpus;
};

/// Opens NVML and maps `slots` to its devices by UUID (docs/energy.md#which-gpu-is-a-slots).
/// nullopt after a console line saying why monitoring is off. Blocks for NVML's and CUDA's
/// initialisation (up to ~1 s): main runs it on its own thread while the workers start.
std::optional<DiscoveredGpus> discover_gpus(const supervisor::EnvMap& inherited,
                                            const std::vector<int>& slots);

/// The monitor over `found`, with the settings of [energy] (config) and the command line.
/// `start_s`: when the job started (its first window's start); `run_dir`: the run's directory.
std::unique_ptr<gpurun::energy::EnergyMonitor> make_energy_monitor(
    boost::asio::io_context& io, supervisor::EventLog& events, const supervisor::Options& opt,
    const std::optional<gpurun::control::Config>& config, DiscoveredGpus found,
    const std::string& program, const gpurun::control::ProgressFile* progress, double start_s,
    const std::string& run_dir);

}  // namespace gpurun::app
