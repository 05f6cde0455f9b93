// gpurun::energy::PowerProfiler — Zeus' just-in-time power-limit profiler as a pure state
// machine: during the first steps of a job, try each power limit from the maximum down, measure
// throughput and energy per step after a warm-up, and choose the limit of least Zeus cost per
// step. The caller sets limit_w() on the GPUs and feeds observe() with progress, energy and
// the hottest GPU's temperature; the profiler reads no clock and touches no GPU. Plus the cache of
// chosen limits (one JSON file), so the next run of the same job skips profiling.
#pragma once

#include <cstdint>
#include <deque>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace gpurun::energy {

/// Profiler settings (defaults: Zeus' ZEUS_PROFILE_PARAMS "10,40" and a 25 W step).
struct ProfilerOptions {
  unsigned max_w = 0;          ///< highest limit to try (the GPUs' maximum), W
  unsigned min_w = 0;          ///< lowest limit to try (the GPUs' minimum), W
  unsigned step_w = 25;        ///< distance between tried limits, W
  int64_t warmup_steps = 10;   ///< steps ignored after each limit change
  int64_t measure_steps = 40;  ///< steps measured per limit
  double eta = 0.5;            ///< Zeus' η in [0, 1]
  double max_power_w = 0;      ///< Σ over the active GPUs of their maximum limit, W
  /// Cool-down: the longest a limit's warm-up waits for the temperature to settle, s (0: no
  /// waiting, the warm-up is warmup_steps alone).
  double cooldown_max_s = 60;
  /// The temperature has settled when its readings over the last this many seconds lie within
  /// settle_c of each other, s.
  double settle_window_s = 5;
  double settle_c = 1;  ///< °C (NVML reports whole degrees)
};

/// How a row's warm-up ended (ProfileRow::cooldown).
enum class Cooldown {
  kSettled,        ///< the temperature had settled
  kTimeout,        ///< cooldown_max_s passed first: measured anyway
  kOff,            ///< cooldown_max_s = 0
  kNoTemperature,  ///< no temperature reading in the warm-up (the GPU has no sensor to read)
};
const char* cooldown_name(Cooldown c);  ///< "settled", "timeout", "off", "no temperature"

/// One measured limit (the `power_profile` event of docs/energy.md#events).
struct ProfileRow {
  unsigned limit_w = 0;      ///< W
  int64_t steps = 0;         ///< steps measured (≥ measure_steps)
  double seconds = 0;        ///< s
  double energy_j = 0;       ///< over the active GPUs, J
  double steps_per_s = 0;    ///< steps / seconds
  double avg_power_w = 0;    ///< energy_j / seconds, W
  double cost_per_step = 0;  ///< η·(J/step) + (1−η)·max_power_w·(s/step), J
  double warmup_s = 0;       ///< from the limit's first observation to the measurement's start, s
  std::optional<double> temp_c;  ///< hottest GPU at the measurement's start, °C (none: unknown)
  Cooldown cooldown = Cooldown::kOff;

  /// {"limit_w", "steps", "seconds", "energy_j", "steps_per_s", "avg_power_w",
  /// "cost_per_step", "warmup_s", "temp_c" (null: unknown), "cooldown"} as one JSON object.
  std::string to_json_fields() const;
};

/// The profiler. Limits tried: max_w, max_w − step_w, … while ≥ min_w (in that order).
///
/// For each limit: the first observe() after the change is the warm-up's start; once
/// warmup_steps more steps are done *and* the temperature has settled (its readings over the
/// last settle_window_s within settle_c of each other: a GPU still cooling from a higher limit
/// leaks more power and would bias the lower limits against themselves) or cooldown_max_s has
/// passed, that observation starts the measurement; once
/// measure_steps more are done (and time has advanced), that observation ends it, the row is
/// recorded and the next limit is in force. Cost per step is Zeus' cost of one step —
/// η·E/n + (1−η)·MaxPower·T/n, i.e. Zeus' (η·P + (1−η)·MaxPower) / throughput
/// (ZeusDataLoader._compute_optimal_pl; You et al., NSDI 2023) — and chosen_w() is its argmin,
/// ties (within a relative 1e-9) going to the higher limit.
///
/// A step counter or energy that goes backwards (workers restarted) restarts the current
/// limit's warm-up from that observation. Not thread-safe; never blocks.
class PowerProfiler {
 public:
  /// Throws gpurun::Error (a sentence naming the values) when max_w < min_w, max_w == 0,
  /// step_w == 0, warmup_steps < 0, measure_steps < 1, η outside [0, 1] or max_power_w ≤ 0.
  explicit PowerProfiler(const ProfilerOptions& options);

  /// The limit that should be in force now, W: the one being profiled, or chosen_w() when done.
  unsigned limit_w() const;
  /// One observation at `t_s` (Unix s): cumulative steps done and cumulative energy (J) over
  /// the active GPUs — any origin, only differences are used — and the hottest active GPU's
  /// temperature (°C; nullopt: unknown). Ignored once done().
  void observe(double t_s, int64_t steps_done, double energy_j,
               std::optional<double> temp_c = std::nullopt);
  /// Drops the measurement in progress (e.g. the active set changed); the next observe()
  /// starts the current limit's warm-up again. Finished rows are kept.
  void interrupt();

  bool done() const { return phase_ == Phase::kDone; }
  /// The argmin of cost_per_step. Throws gpurun::InvariantError before done().
  unsigned chosen_w() const;
  /// Every limit to try, in order.
  const std::vector<unsigned>& limits() const { return limits_; }
  /// The rows measured so far, in order.
  const std::vector<ProfileRow>& rows() const { return rows_; }
  /// The oldest measured row not taken yet (to emit `power_profile` events as they finish).
  std::optional<ProfileRow> take_finished_row();

 private:
  enum class Phase { kStart, kWarmup, kMeasure, kDone };
  // The one place the phase changes; rejects moves outside the table.
  void transition(Phase to);
  struct Mark {
    double t_s = 0;
    int64_t steps = 0;
    double energy_j = 0;
    std::optional<double> temp_c;
  };
  void start_warmup(const Mark& now);  // this limit's warm-up starts at `now`
  // Whether the warm-up may end at `now`, and how (nullopt: not yet).
  std::optional<Cooldown> warmup_over(const Mark& now);

  ProfilerOptions opt_;
  std::vector<unsigned> limits_;
  std::size_t index_ = 0;  // limit being profiled
  Phase phase_ = Phase::kStart;
  Mark mark_;                 // warm-up or measurement start
  std::optional<Mark> last_;  // previous observation, to detect a counter going back
  std::deque<std::pair<double, double>> temps_;  // this warm-up's (t_s, °C), the window's
  double warmup_s_ = 0;                          // of the measurement in progress
  std::optional<double> measure_temp_c_;
  Cooldown measure_cooldown_ = Cooldown::kOff;
  std::vector<ProfileRow> rows_;
  std::deque<ProfileRow> unread_;
  unsigned chosen_w_ = 0;
};

/// Which job a cached limit belongs to. Entries match on every field.
struct ProfileKey {
  std::string program;    ///< e.g. the worker binary or script path
  std::string key;        ///< the user's cache key (configuration: batch size, model, …)
  std::string gpu_model;  ///< NVML name, e.g. "NVIDIA H200"
  int gpus = 0;           ///< active GPUs during profiling
  double eta = 0.5;       ///< η the limit was chosen for (a different η chooses differently)
};

/// The limit cached for `key` in the JSON file `path`, W; nullopt when the file does not
/// exist or has no such entry. Throws gpurun::Error naming the file when it cannot be read or
/// is not a profile cache. Blocks on the read.
std::optional<unsigned> cached_limit(const std::filesystem::path& path, const ProfileKey& key);

/// Records `chosen_w` and the measured `rows` for `key` in `path`: reads the whole file
/// (missing: empty), replaces the entry with that key or appends one, writes a temporary file
/// beside it and rename()s it over the old one, so readers see the old or the new file, never
/// half of one. Format: {"version": 1, "entries": [{"program", "key", "gpu_model", "gpus",
/// "eta", "chosen_w", "rows": [ProfileRow…]}]}. Throws gpurun::Error naming the file (a bad
/// existing file is not overwritten). Blocks on the file I/O.
void store_limit(const std::filesystem::path& path, const ProfileKey& key, unsigned chosen_w,
                 const std::vector<ProfileRow>& rows);

}  // namespace gpurun::energy
