#include "energy/simulated_gpus.hpp"

#include <cmath>
#include <cstdlib>
#include <stdexcept>
#include <string_view>
#include <unordered_map>

#include <fmt/format.h>

#include "gpurun/env_names.hpp"
#include "gpurun/error.hpp"
#include "gpurun/regular_file.hpp"

namespace gpurun::energy {

namespace {
constexpr unsigned kMaxSimulated = 64;

/// Refuses what no GPU reports and the simulation would turn into nonsense (a negative or NaN
/// draw integrates to an energy counter that wraps): names `spec`, the gpu and the value.
void check_state(const simulated_nvml::State& s, const std::string& spec) {
  const auto refuse = [&](const std::string& what) {
    throw UsageError(
        fmt::format("--simulate-gpus {}: {} (format: docs/energy.md#simulated-gpus)", spec, what));
  };
  for (const auto& [name, v] : {std::pair{"t0", s.t0}, std::pair{"now", s.now}})
    if (v && !std::isfinite(*v)) refuse(fmt::format("{}={} is not finite", name, *v));
  std::unordered_map<std::string, unsigned> uuids;
  for (const simulated_nvml::Gpu& g : s.gpus) {
    const auto bad = [&](const std::string& what) {
      refuse(fmt::format("gpu {}: {}", g.index, what));
    };
    // `what`: "full_w=-50", or a schedule's item "draw 5:-100".
    const auto finite = [&](const std::string& what, double v) {
      if (!std::isfinite(v)) bad(fmt::format("{} is not finite", what));
    };
    const auto watts = [&](const std::string& what, double v) {
      finite(what, v);
      if (v < 0) bad(fmt::format("{} is negative; give watts >= 0", what));
    };
    const auto key = [](const char* k, double v) { return fmt::format("{}={}", k, v); };
    if (!simulated_nvml::uuid_bytes(g.uuid))
      bad(
          fmt::format("uuid={} is not GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx (32 lower-case hex "
                      "digits, as nvidia-smi -L prints them)",
                      g.uuid));
    if (const auto [it, fresh] = uuids.emplace(g.uuid, g.index); !fresh)
      bad(fmt::format("uuid={} is also gpu {}'s; each GPU needs its own", g.uuid, it->second));
    watts(key("min_w", g.min_w), g.min_w);
    watts(key("max_w", g.max_w), g.max_w);
    watts(key("default_w", g.default_w), g.default_w);
    watts(key("limit_w", g.limit_w), g.limit_w);
    watts(key("full_w", g.full_w), g.full_w);
    finite(key("speed_exp", g.speed_exp), g.speed_exp);
    for (const char* k : {"draw", "limits"})
      for (const auto& item : std::string_view(k) == "draw" ? g.draw : g.limits) {
        const std::string what = fmt::format("{} {}:{}", k, item.first, item.second);
        finite(what, item.first);
        watts(what, item.second);
      }
    if (g.temp) {
      const std::string what =
          fmt::format("temp={}:{}:{}", g.temp->ambient_c, g.temp->c_per_w, g.temp->tau_s);
      for (const double v : {g.temp->ambient_c, g.temp->c_per_w, g.temp->tau_s}) finite(what, v);
    }
    if (g.min_w > g.max_w) bad(fmt::format("min_w={} is above max_w={}", g.min_w, g.max_w));
    const auto in_range = [&](const std::string& what, double v) {
      if (v < g.min_w || v > g.max_w)
        bad(fmt::format("{} is outside min_w..max_w ({}..{})", what, g.min_w, g.max_w));
    };
    in_range(key("default_w", g.default_w), g.default_w);
    in_range(key("limit_w", g.limit_w), g.limit_w);
    for (const auto& l : g.limits)
      in_range(fmt::format("limits {}:{}", l.first, l.second), l.second);
  }
}
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
  check_state(s, spec);
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
  ::setenv(env::kSimulatedGpusState, state.c_str(), 1);
  ::setenv(env::kPowerJournal, (run_dir + "/power-journal.json").c_str(), 1);
  return state;
}

}  // namespace gpurun::energy
