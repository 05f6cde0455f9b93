// The energy monitor's set-up (energy_setup.hpp).
#include "app/energy_setup.hpp"

#include <filesystem>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "energy/early_stop.hpp"
#include "energy/power_journal.hpp"
#include "gpurun/error.hpp"
#include "supervisor/gpu_inventory.hpp"

namespace gpurun::app {

namespace asio = boost::asio;
namespace sv = gpurun::supervisor;

/// The monitor's figures for status.json (io thread: the totals are the io thread's).
gpurun::control::EnergyStatus energy_status(const gpurun::energy::EnergyMonitor& m) {
  gpurun::control::EnergyStatus out;
  for (const auto& [slot, e] : m.status()) {
    gpurun::control::SlotEnergyStatus& s = out.slots[slot];
    s.power_w = e.power_w;
    s.epoch_energy_j = e.epoch_energy_j;
    s.job_energy_j = e.job_energy_j;
    s.power_limit_w = e.power_limit_w;
  }
  out.epochs = m.epochs_finished();
  out.cost_total_j = m.cost_total_j();
  out.threshold_j = m.threshold_j();
  out.predicted_next_cost_j = m.predicted_next_cost_j();
  out.stopped_early = m.stopped_early();
  return out;
}

/// Paths in [energy] are relative to the config file's directory.
std::string beside_config(const std::optional<std::string>& config, const std::string& path) {
  if (path.empty() || !config || std::filesystem::path(path).is_absolute()) return path;
  return (std::filesystem::absolute(*config).parent_path() / path).string();
}

EnergyFiles energy_files(const sv::Options& opt,
                         const std::optional<gpurun::control::Config>& config,
                         const std::string& run_dir) {
  const gpurun::control::EnergyConfig ec =
      config ? config->energy : gpurun::control::EnergyConfig{};
  EnergyFiles out;
  out.history = beside_config(opt.config, ec.history);
  out.profile_cache = beside_config(opt.config, !ec.profile_cache.empty()
                                                    ? ec.profile_cache
                                                    : (config ? ".gpurun-power-cache.json" : ""));
  if (!opt.simulate_gpus) return out;
  // A simulated run's cost must never become the "best earlier run" of a real job's threshold,
  // nor its chosen limits a real job's: both stay in the run dir.
  std::vector<std::string> moved;
  if (!out.history.empty()) {
    moved.push_back(fmt::format("history {} is {}/history.jsonl", out.history, run_dir));
    out.history = run_dir + "/history.jsonl";
  }
  if (!out.profile_cache.empty()) {
    if (!ec.profile_cache.empty() || ec.auto_limit)
      moved.push_back(
          fmt::format("profile_cache {} is {}/power-cache.json", out.profile_cache, run_dir));
    out.profile_cache = run_dir + "/power-cache.json";
  }
  if (!moved.empty())
    print_err(fmt::format(
        "energy: --simulate-gpus: for this run [energy] {}: simulated GPUs' costs and limits "
        "never reach a real job's",
        fmt::join(moved, ", ")));
  return out;
}

/// Whether gpurun should monitor energy at all (cheap; says why not when the user asked).
bool energy_wanted(const sv::Options& opt, const sv::JobPlan& plan,
                   const std::optional<gpurun::control::Config>& config) {
  const gpurun::control::EnergyConfig ec =
      config ? config->energy : gpurun::control::EnergyConfig{};
  if (opt.energy == sv::EnergyMode::kOff || !ec.monitor) {
    if (opt.energy_summary)
      print_err(fmt::format(
          "energy: no summary will be written to {}: monitoring is off ({})", *opt.energy_summary,
          opt.energy == sv::EnergyMode::kOff ? "--energy off" : "[energy] monitor = false"));
    return false;
  }
  const bool asked = opt.energy == sv::EnergyMode::kOn || ec.present || opt.energy_summary;
  if (opt.energy == sv::EnergyMode::kAuto && plan.device != sv::Device::kCuda) {
    if (asked)
      print_err(
          "energy: monitoring off: --device cpu has no GPU (use --energy on to monitor "
          "the visible GPUs anyway, e.g. with a fake NVML)");
    return false;
  }
  return true;
}

/// Opens NVML and maps `slots` to its devices by UUID (docs/energy.md#which-gpu-is-a-slots).
/// nullopt after a console line saying why monitoring is off. Blocks for NVML's and CUDA's
/// initialisation (up to ~1 s): main runs it on its own thread while the workers start.
std::optional<DiscoveredGpus> discover_gpus(const sv::EnvMap& inherited,
                                            const std::vector<int>& slots) {
  namespace en = gpurun::energy;
  std::string why;
  std::unique_ptr<en::Nvml> nvml = en::Nvml::open(why);
  if (!nvml) {
    print_err(fmt::format("energy: monitoring off: {}", why));
    return std::nullopt;
  }
  const auto cvd = inherited.find("CUDA_VISIBLE_DEVICES");
  std::optional<std::vector<std::string>> visible;
  if (cvd != inherited.end()) visible = sv::parse_visible_devices(cvd->second);
  // Index entries (or none) are resolved through CUDA's own order.
  bool need_cuda = !visible;
  if (visible)
    for (const std::string& e : *visible) need_cuda = need_cuda || e.rfind("GPU-", 0) != 0;
  std::optional<std::vector<std::string>> cuda_uuids;
  if (need_cuda) {
    std::string cuda_why;
    cuda_uuids = en::cuda_visible_uuids(cuda_why);
    if (!cuda_uuids && !cuda_why.empty()) print_err(fmt::format("energy: {}", cuda_why));
  }
  DiscoveredGpus d;
  try {
    std::string warning;
    d.gpus = en::map_slots(*nvml, slots, visible, cuda_uuids, warning);
    if (!warning.empty()) print_err(fmt::format("energy: warning: {}", warning));
  } catch (const gpurun::Error& e) {
    print_err(fmt::format("energy: monitoring off: {}", e.what()));
    return std::nullopt;
  }
  if (d.gpus.empty()) {
    print_err("energy: monitoring off: no GPU to monitor");
    return std::nullopt;
  }
  d.nvml = std::move(nvml);
  return d;
}

/// The monitor over `found`, with the settings of [energy] (config) and the command line.
/// `start_s`: when the job started (its first window's start).
std::unique_ptr<gpurun::energy::EnergyMonitor> make_energy_monitor(
    asio::io_context& io, sv::EventLog& events, const sv::Options& opt,
    const std::optional<gpurun::control::Config>& config, DiscoveredGpus found,
    const std::string& program, const gpurun::control::ProgressFile* progress, double start_s,
    const std::string& run_dir) {
  namespace en = gpurun::energy;
  const gpurun::control::EnergyConfig ec =
      config ? config->energy : gpurun::control::EnergyConfig{};
  std::vector<en::MonitoredGpu> gpus = std::move(found.gpus);
  std::unique_ptr<en::Nvml> nvml = std::move(found.nvml);
  en::MonitorOptions mo;
  mo.period = ec.period;
  mo.window = ec.window;
  mo.eta = ec.eta;
  mo.job = !ec.job.empty() ? ec.job : fmt::format("{}", fmt::join(opt.command, " "));
  const EnergyFiles files = energy_files(opt, config, run_dir);
  mo.history = files.history;
  std::optional<double> best;
  if (!mo.history.empty()) {
    // Read even with an absolute threshold: an unusable history (not JSON lines, a device,
    // too large) is said at the start, and then neither read nor appended to.
    try {
      const std::optional<double> b = en::best_cost(mo.history, mo.job);
      if (!ec.cost_threshold_j) best = b;
    } catch (const gpurun::Error& e) {
      print_err(fmt::format(
          "energy: warning: the history is ignored for this run (not read, not appended to): {}",
          e.what()));
      mo.history.clear();
    }
  }
  mo.threshold = en::threshold_from(ec.cost_threshold_j, ec.cost_threshold_factor, best,
                                    mo.history.empty() ? "history" : mo.history);
  if (mo.threshold && !config) {
    print_err(
        "energy: warning: early stop needs epoch boundaries (--config and the worker "
        "runtime); this run is monitored only");
    mo.threshold.reset();
  }
  mo.fixed_limit_w = ec.power_limit_w;
  mo.auto_limit = ec.auto_limit;
  mo.locked_clocks_mhz = ec.locked_clocks_mhz;
  // GPUs a gpurun changed and could not put back (it and its guard were killed, or the machine
  // rebooted): restored now, before this run changes anything (docs/energy.md#power-limits).
  for (const std::string& line : en::recover_journal(*nvml, en::journal_path())) {
    print_err("energy: " + line);
    events.emit("power_journal", sv::JsonObject().add("message", line));
  }
  mo.warmup_steps = ec.profile_warmup_steps;
  mo.measure_steps = ec.profile_measure_steps;
  mo.cooldown_max_s = ec.profile_cooldown_s;
  mo.settle_window_s = ec.profile_settle_s;
  mo.profile_cache = files.profile_cache;
  mo.program = program;
  mo.summary_path = opt.energy_summary.value_or("");
  // The guard runs this binary: its real path (ps shows it), /proc/self/exe as a fallback.
  std::error_code ec_exe;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec_exe);
  if (!ec_exe) mo.guard_exe = self.string();
  mo.start_s = start_s;
  print_err(fmt::format(
      "energy: monitoring {} GPU{} every {} ms through {} (η = {}{})", gpus.size(),
      gpus.size() == 1 ? "" : "s", ec.period.count(), nvml->library(), mo.eta,
      mo.threshold
          ? fmt::format(", early stop above {} J{}", en::format_joules(mo.threshold->cost_j, 0),
                        mo.threshold->origin.empty() ? "" : " = " + mo.threshold->origin)
          : ""));
  return std::make_unique<en::EnergyMonitor>(
      io, events, [](const std::string& line) { print_err("energy: " + line); }, std::move(nvml),
      std::move(gpus), std::move(mo), progress);
}

}  // namespace gpurun::app
