// gpurun::energy::CostTracker — Zeus' cost-threshold early stop: the cost of each epoch, the
// cost so far, a prediction of the next epoch's cost, and the stop decision; plus the job
// history (Zeus' β knob: threshold = β × the best cost of earlier runs of the same job).
// Pure logic except best_cost/append_history, which read and append one small file.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "energy/cost.hpp"

namespace gpurun::energy {

/// One finished epoch (the `energy_epoch` event of docs/energy.md#events).
struct EpochRecord {
  int64_t epoch = -1;
  double seconds = 0;                  ///< Σ window seconds, s
  double energy_j = 0;                 ///< Σ window energy over the charged GPUs, J
  std::map<int, double> gpu_energy_j;  ///< slot → J
  double active_gpus = 0;              ///< time-weighted mean number of charged GPUs
  double max_power_w = 0;              ///< time-weighted mean of the windows' max_power_w, W
  double cost = 0;                     ///< Σ window costs (Zeus), J
  double cost_total = 0;               ///< Σ cost of all finished epochs up to this one, J
  double predicted_next_cost = 0;      ///< CostTracker::predicted_next_cost() after it, J
  /// The slots charged through the whole epoch when every window of it had the same active
  /// set and power limit; nullopt when it was mixed (a resize or a limit change inside it) or
  /// charged no time. Not part of the event (active_gpus is its time-weighted mean).
  std::optional<std::vector<int>> steady_active;

  /// The `energy_epoch` event's fields as one JSON object (order of docs/energy.md), with
  /// "threshold" set to `threshold_j` or null. gpu_energy_j keys are slot numbers as strings.
  std::string to_json_fields(std::optional<double> threshold_j) const;
};

/// An early-stop threshold and where it came from, for messages.
struct CostThreshold {
  double cost_j = 0;   ///< J
  std::string origin;  ///< e.g. "2.0 × best 500.0 J from history.jsonl"; empty for a given one
};

/// Totals over every window added (finished epochs and the open one): `energy_summary`.
struct CostSummary {
  double seconds = 0, energy_j = 0, cost = 0;  ///< s, J, J
  int64_t epochs = 0;                          ///< finished epochs
  std::map<int, double> gpu_energy_j;          ///< slot → J
};

/// Accumulates windows into epochs. Not thread-safe; never blocks.
///
/// Predictor (predicted_next_cost): the mean cost of the trailing run of finished epochs that
/// ran in one steady configuration — every window of the epoch had the same active set and
/// the same power limit, and it is the same as the last epoch's — or, when the last epoch was
/// itself mixed (a resize or a power-limit change inside it), that last epoch's cost alone.
/// Why: Zeus (ZeusDataLoader) predicts the next epoch from its profile at the *chosen* power
/// limit — time = samples / throughput(optimal limit), energy = time × power(optimal limit) —
/// i.e. from the configuration the next epoch will run in, not from the history that
/// includes the profiling epoch. gpurun has no per-limit throughput model for an arbitrary
/// worker, so it uses measured epochs in the current configuration instead: the mean of
/// several steady epochs averages out per-epoch noise (evaluation, data loading), and
/// restarting the run at every configuration change (elastic shrink/grow, the end of
/// power-limit profiling) keeps epochs of a different active set or limit from biasing it.
class CostTracker {
 public:
  /// Adds a window to the open epoch (any kind; its epoch/step fields are not used).
  void add_window(const WindowRecord& w);

  /// Closes the open epoch as number `epoch` (possibly with no windows: zero cost), and
  /// returns its record with cost_total and predicted_next_cost filled in.
  EpochRecord end_epoch(int64_t epoch);

  /// Drops the open epoch without recording it (a whole-set restart: the new attempt trains
  /// it again; the workers' start-up, which is no epoch's). Its time, energy and cost stay in
  /// summary() and in cost_total(): they were spent.
  void abandon_epoch();

  /// The predicted cost of the next epoch, J (see the class comment); 0 before the first
  /// finished epoch.
  double predicted_next_cost() const;

  /// Σ cost of the finished (and abandoned) epochs, J.
  double cost_total() const { return cost_total_; }
  const std::vector<EpochRecord>& epochs() const { return epochs_; }
  CostSummary summary() const;

  /// Zeus' early stop: a sentence when cost_total() + predicted_next_cost() > threshold
  /// (strictly), e.g. "the predicted total cost after epoch 4 (1234.5 J) would pass the
  /// threshold (1000.0 J = 2.0 × best 500.0 J from history.jsonl)" (joules as
  /// format_joules()); nullopt otherwise and always before the first finished epoch.
  std::optional<std::string> stop_reason(const CostThreshold& threshold) const;
  std::optional<std::string> stop_reason(double threshold_j) const {
    return stop_reason(CostThreshold{threshold_j, {}});
  }

 private:
  struct Config {  // what a window ran in, for the predictor
    std::vector<int> active;
    std::optional<unsigned> power_limit_w;
    bool operator==(const Config&) const = default;
  };
  struct Open {
    double seconds = 0, energy_j = 0, cost = 0, gpu_seconds = 0, max_power_ws = 0;
    std::map<int, double> gpu_energy_j;
    std::vector<Config> configs;  // distinct, in order of appearance
  };
  Open open_;
  std::vector<EpochRecord> epochs_;
  std::vector<std::optional<Config>> epoch_config_;  // per finished epoch; nullopt = mixed
  double cost_total_ = 0;
  CostSummary finished_;  // totals of the finished epochs
};

/// One line of the history file: a finished (or early-stopped) run of a job.
struct HistoryEntry {
  std::string job;      ///< the job's name (the key Zeus' β is applied per)
  double cost = 0;      ///< Zeus cost of the whole run, J
  double energy_j = 0;  ///< J
  double seconds = 0;   ///< s
  int64_t epochs = 0;
  bool completed = false;  ///< false when stopped early or failed: not a candidate for best
};

/// The most of a history file best_cost() reads (16 MiB: ~100 000 runs of ~150 bytes).
inline constexpr std::size_t kMaxHistoryBytes = std::size_t{16} << 20;

/// The lowest cost over the completed entries of `job` in the JSON-lines file `history`
/// (blank lines skipped); nullopt when the file does not exist or has none. Throws
/// gpurun::Error "<file>:<line>: …" for a line that is not a history entry, when the file
/// cannot be read, is not a regular file (a device, a FIFO: never read) or is larger than
/// kMaxHistoryBytes (the message names the file, `[energy] history` and the limit). Blocks on
/// the file read; holds at most kMaxHistoryBytes.
std::optional<double> best_cost(const std::filesystem::path& history, const std::string& job);

/// Appends `entry` to `history` as one JSON line
/// ({"job", "cost", "energy_j", "seconds", "epochs", "completed"}) with a single write() on an
/// O_APPEND descriptor (so concurrent runs do not interleave), creating the file (0644).
/// Throws gpurun::Error naming the file and errno's text, or saying that it is not a regular
/// file (nothing is written to a device or a FIFO). Blocks on the write.
void append_history(const std::filesystem::path& history, const HistoryEntry& entry);

/// Joules for messages: fixed with `decimals` decimals below 1e12 J ("1234.5"), else six
/// significant digits ("1e+308"), so a huge threshold is not printed as 309 digits.
std::string format_joules(double j, int decimals = 1);

/// The early-stop threshold: `absolute_j` when given (origin empty); else factor × best with
/// origin "<factor> × best <best> J from <history_name>" when both factor > 0 and best are
/// given; else nullopt (no early stop).
std::optional<CostThreshold> threshold_from(std::optional<double> absolute_j, double factor,
                                            std::optional<double> best,
                                            const std::string& history_name = "history");

}  // namespace gpurun::energy
