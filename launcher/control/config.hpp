// gpurun::control::Config — the declarative control file (config.toml): what the
// user wants the job to look like. Reference with every key and error text:
// docs/config.md.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gpurun/control/park_mode.hpp"
#include "gpurun/error.hpp"

namespace gpurun::control {

/// Where resize decisions may take effect (`[boundary] every`).
struct BoundarySpec {
  /// true: at the end of every epoch (`every = "epoch"`).
  bool every_epoch = true;
  /// > 0 when `every = N`: every N optimizer steps (every_epoch is then false); 0 otherwise.
  int64_t every_steps = 0;

  friend bool operator==(const BoundarySpec&, const BoundarySpec&) = default;
};

/// `[energy]`: the supervisor's GPU energy monitor, Zeus' cost, early stop and power limits
/// (docs/energy.md). Read when the job starts; later edits of this table take effect at the
/// next run (the reload says so).
struct EnergyConfig {
  bool present = false;  ///< an [energy] table was given
  bool monitor = true;   ///< `monitor`: false turns the monitor off
  /// `period_s` (default 0.1): how often each GPU's energy counter and power are read. The
  /// H200's counter changes every 100 ms, and one read costs ~4 ms, so faster buys nothing.
  std::chrono::milliseconds period{100};
  /// `window_s` (default 60): the length of a time window for workers that report no
  /// boundaries (workers without the runtime).
  std::chrono::milliseconds window{std::chrono::seconds(60)};
  /// `eta_knob` η in [0, 1] (default 0.5): cost = η·E + (1−η)·MaxPower·T (Zeus, NSDI'23).
  double eta = 0.5;
  /// `cost_threshold` (J): stop at the epoch boundary where the predicted total cost after one
  /// more epoch would exceed it. Wins over cost_threshold_factor.
  std::optional<double> cost_threshold_j;
  /// `cost_threshold_factor` β (default 2.0): threshold = β × the best total cost of earlier
  /// completed runs of the same job in `history`.
  double cost_threshold_factor = 2.0;
  /// `history` (path, relative to the config file's directory): JSON lines, one per run.
  std::string history;
  /// `job` (default: the worker command line): the key of this job in history and the power-
  /// limit cache.
  std::string job;
  /// `power_limit_watts`: a fixed limit for every active GPU (W), or "auto" (auto_limit).
  std::optional<unsigned> power_limit_w;
  bool auto_limit = false;
  int64_t profile_warmup_steps = 10;   ///< `profile_warmup_steps`, per limit tried
  int64_t profile_measure_steps = 40;  ///< `profile_measure_steps`, per limit tried
  /// `profile_cooldown_s` (0–3600, default 60; 0: no cool-down): the longest a profiled limit's
  /// warm-up waits for the hottest GPU's temperature to settle, s.
  double profile_cooldown_s = 60;
  /// `profile_settle_s` (default 5): settled = its readings stayed within 1 °C this long, s.
  double profile_settle_s = 5;
  /// `profile_cache` (path, relative to the config file): chosen limits per
  /// (program, job, GPU model, GPU count); default `<config dir>/.gpurun-power-cache.json`.
  std::string profile_cache;
  /// `locked_clocks_mhz = [min, max]` (or one number N = [N, N]): every job GPU's clock locked
  /// in that range while the job runs (nvmlDeviceSetGpuLockedClocks; needs root), reset at exit.
  std::optional<std::pair<unsigned, unsigned>> locked_clocks_mhz;
  /// `scale = "auto"` (default "off"): gpurun chooses the job's GPU count for the least Zeus
  /// cost per epoch by live resizes (docs/energy.md#scale). Needs elastic mode and NVML.
  bool auto_scale = false;
  /// `allowed_gpus`: the GPUs scale = "auto" chooses among (it trains on the first n of
  /// them); default: the declared active set when the job starts.
  std::optional<std::vector<int>> allowed_gpus;
  int64_t scale_warmup_epochs = 1;   ///< `scale_warmup_epochs` (≥ 0), per count tried
  int64_t scale_measure_epochs = 1;  ///< `scale_measure_epochs` (≥ 1), per count tried
  int64_t scale_recheck_epochs = 0;  ///< `scale_recheck_epochs`: search again every K (0: never)

  friend bool operator==(const EnergyConfig&, const EnergyConfig&) = default;
};

/// `[policy]`: bounds on what leases (`gpurun lend`) may do to the job (docs/sharing.md).
struct PolicyConfig {
  /// `min_gpus` (default 0): a lease never makes the job train on fewer GPUs than this (nor
  /// than the declared set holds); the lowest-numbered lent GPUs stay in.
  int min_gpus = 0;
  /// `yield_to_foreign` (default false): a job GPU on which NVML lists a compute process that
  /// is not gpurun's (nor a descendant's) is given up at the next boundary.
  bool yield_to_foreign = false;
  /// `reclaim_after_s` (default 60): a yielded GPU is taken back once no foreign process was
  /// seen on it for this long.
  std::chrono::milliseconds reclaim_after{std::chrono::seconds(60)};

  friend bool operator==(const PolicyConfig&, const PolicyConfig&) = default;
};

/// `[notify]`: a command run for each notable event (docs/sharing.md#notifications).
struct NotifyConfig {
  /// `command`: run by /bin/sh -c with the event's JSON record on stdin; empty = none.
  std::string command;
  /// `timeout_s` (default 10): a command still running after this is killed (SIGKILL).
  std::chrono::milliseconds timeout{std::chrono::seconds(10)};

  friend bool operator==(const NotifyConfig&, const NotifyConfig&) = default;
};

/// One parsed and validated config.toml. Defaults = an empty file.
struct Config {
  /// GPU ids to train on, sorted ascending and unique. nullopt (key absent) = the launch set
  /// (the first --nproc slots); empty (`active_gpus = []`) = pause: every worker parked, state
  /// kept in host memory.
  std::optional<std::vector<int>> active_gpus;
  /// `[park] mode`; default release.
  ParkMode park_mode = ParkMode::kRelease;
  /// `[park] standby` (release mode; default true): after a leaver's process exits, start a
  /// standby for its slot (docs/control-protocol.md#standby).
  bool standby = true;
  /// `[boundary] every`; default every epoch.
  BoundarySpec boundary;
  /// `[batch] global`: samples per optimizer step summed over the active GPUs, kept constant
  /// across resizes by gradient accumulation. nullopt = not managed.
  std::optional<int64_t> global_batch;
  /// `[boundary] deadline_s` (seconds in the file, default 300): a worker that has not
  /// reported at a boundary by then is declared stalled. Fractions round up to whole ms.
  std::chrono::milliseconds boundary_deadline{std::chrono::seconds(300)};
  /// `[boundary] setup_deadline_s` (seconds, default 120): a participant of a resize (a member,
  /// a joiner, the leaving state source) that has not finished the new generation's set-up
  /// (its timing record or a report in it) by then is killed; the job goes on without it.
  std::chrono::milliseconds setup_deadline{std::chrono::seconds(120)};
  /// `[energy]` (docs/energy.md).
  EnergyConfig energy;
  /// `[policy]` (docs/sharing.md).
  PolicyConfig policy;
  /// `[notify]` (docs/sharing.md#notifications).
  NotifyConfig notify;
  /// Non-fatal findings in document order, e.g.
  /// "config.toml:7:1: unknown key 'actve_gpus' (ignored); did you mean 'active_gpus'?";
  /// at most kMaxReportedProblems, then "and <K> more warnings in <source> (…)".
  std::vector<std::string> warnings;

  friend bool operator==(const Config&, const Config&) = default;
};

/// How many errors (and, separately, warnings) one file reports at most; more are summed up in
/// one last line, "and <K> more errors in <source> (only the first 20 are reported)".
inline constexpr std::size_t kMaxReportedProblems = 20;

/// A config file that cannot take effect. what() lists the problems found, one per line, in
/// document order: "<source>:<line>:<col>: <key>: <problem>; allowed: <values>" — at most
/// kMaxReportedProblems of them, then the count of the rest.
class ConfigError : public gpurun::Error {
 public:
  using Error::Error;
};

/// One line describing the effective settings (for the console and the event log), e.g.
/// "active_gpus=[0, 1] park=release boundary=epoch deadline_s=300 batch.global=none".
std::string describe(const Config& config);

/// Parses and validates config.toml text. Pure: no I/O, any thread.
/// `source` names the file in messages (e.g. its path). `valid_gpu_ids` = the ids a user may
/// name in active_gpus: the GPU ids of this node as gpurun sees them (after
/// CUDA_VISIBLE_DEVICES), or the slot ids 0..n-1 with --device cpu.
/// Throws ConfigError listing every problem (syntax errors: toml++'s message and position).
Config parse_config(std::string_view text, const std::string& source,
                    const std::vector<int>& valid_gpu_ids);

/// Reads `path` (following symlinks; at most kMaxConfigBytes) and parses it as parse_config
/// does, naming the path in messages. Blocks on file I/O (never on a FIFO or a device: read
/// with gpurun::read_regular_file). Throws ConfigError, also when the file is missing,
/// unreadable, not a regular file or too large:
/// "cannot read the config file <path>: it is a FIFO, not a regular file".
Config load_config(const std::filesystem::path& path, const std::vector<int>& valid_gpu_ids);

/// Largest config file load_config reads, in bytes.
inline constexpr std::size_t kMaxConfigBytes = 1 << 20;

}  // namespace gpurun::control
