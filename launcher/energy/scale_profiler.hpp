// gpurun::energy::ScaleProfiler — `[energy] scale = "auto"` (docs/energy.md#scale): the job's
// GPU count chosen for the lowest energy-time cost per epoch, by live resizes. A pure state
// machine like PowerProfiler: it is fed finished epochs and says how many GPUs to train on;
// the caller resizes the job (a policy on the effective set, docs/sharing.md) and emits the
// events. No I/O, no clock; never blocks; not thread-safe.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

namespace gpurun::energy {

/// Settings (the [energy] scale_* keys).
struct ScaleOptions {
  std::vector<int> allowed;    ///< slots the job may train on, ascending, at least one
  int64_t warmup_epochs = 1;   ///< steady epochs not measured after each count change (≥ 0)
  int64_t measure_epochs = 1;  ///< steady epochs measured per count (≥ 1)
  int64_t recheck_epochs = 0;  ///< after a choice, search again every this many epochs (0: never)
  double eta = 0.5;            ///< Zeus' η in [0, 1]
  double max_power_w = 0;      ///< Σ of the maximum power limits of `allowed`, W (> 0)
  /// The fewest GPUs tried (`[policy] min_gpus`: the job never trains on fewer), in
  /// [1, allowed.size()].
  int min_count = 1;
};

/// One measured GPU count (the `scale_profile` event of docs/energy.md#events).
struct ScaleRow {
  int gpus = 0;             ///< GPUs trained on
  int64_t epochs = 0;       ///< epochs measured
  double seconds = 0;       ///< per epoch (mean), s
  double energy_j = 0;      ///< per epoch (mean) over the GPUs trained on, J
  double cost = 0;          ///< per epoch: η·energy_j + (1−η)·max_power_w·seconds, J
  int64_t last_epoch = -1;  ///< the last epoch measured

  /// {"gpus", "epochs", "seconds", "energy_j", "cost", "last_epoch"} as one JSON object.
  std::string to_json_fields() const;
};

/// The profiler.
///
/// Search: the job starts on every allowed GPU; each count n is measured over
/// `measure_epochs` epochs that ran steadily on the first n allowed GPUs, after
/// `warmup_epochs` epochs that did or that were mixed (the resize to n inside them); an epoch
/// that ran steadily on another set (a grow's joiner not yet admitted, a lease or a yield
/// took a GPU) counts for nothing. Then n − 1 is tried, until the cost per epoch rises or n
/// reaches `min_count`.
/// The choice is the count of least cost among the search's rows (ties: fewer GPUs). The
/// descent stops at the first rise because the cost per epoch, T(n)·(η·P·n + (1−η)·M) for n
/// GPUs of draw P, has one minimum when T(n) is Amdahl's a + b/n or a power law c·n^−α (its
/// derivative changes sign once): past the minimum, fewer GPUs only cost more.
///
/// Cost per epoch is Zeus' cost (You et al., NSDI 2023: η·E + (1−η)·MaxPower·T) of one epoch
/// with MaxPower = max_power_w of *all* allowed GPUs whatever the count: an epoch is the same
/// samples at every count (the sampler shards it), so per-epoch cost orders counts as
/// per-sample cost does, and a fixed MaxPower prices time equally for every count (the
/// active GPUs' sum would make time cheaper the fewer GPUs train).
///
/// Re-check: `recheck_epochs` steady epochs after a choice, the search runs again from one GPU
/// above the choice (when allowed) down, so a count that became cheaper next to it is found.
class ScaleProfiler {
 public:
  /// Throws gpurun::Error (naming the value) when `allowed` is empty, warmup_epochs < 0,
  /// measure_epochs < 1, recheck_epochs < 0, η is outside [0, 1], max_power_w ≤ 0 or
  /// min_count is outside [1, allowed.size()].
  explicit ScaleProfiler(ScaleOptions options);

  /// A new fewest count (`[policy] min_gpus` reloaded), clamped to [1, allowed.size()].
  /// Above the count trained on now: the search chooses among its rows at or above it (none:
  /// it measures `n` first); a choice below it is measured again from `n`. Returns true when
  /// count() changed.
  bool set_min_count(int n);

  /// GPUs to train on now: the count being measured, or the choice.
  int count() const { return count_; }
  /// The first count() allowed slots.
  std::vector<int> gpus() const;
  /// The allowed slots beyond count(): the ones the job gives back.
  std::vector<int> out() const;

  /// Epoch `epoch` ended: `steady_active` the slots it ran on throughout (nullopt: the set
  /// changed inside it), its length (s) and energy over those slots (J). Returns true when
  /// count() changed.
  bool on_epoch(int64_t epoch, const std::optional<std::vector<int>>& steady_active, double seconds,
                double energy_j);

  /// A choice was made and no re-check is running.
  bool chosen() const { return searching_ == false && chosen_ > 0; }
  /// The last choice (0 before the first).
  int choice() const { return chosen_; }
  /// The current search's rows, in the order measured.
  const std::vector<ScaleRow>& rows() const { return rows_; }
  /// The oldest finished row not taken yet (for `scale_profile` events).
  std::optional<ScaleRow> take_finished_row();
  /// Whether a choice was made since the last call (for the `scale_choice` event).
  bool take_new_choice();
  /// One sentence on what it does now, e.g. "measuring 3 of 4 GPUs (1 of 1 warm-up and 0 of 1
  /// measured epochs)" or "chose 2 of 4 GPUs: cost 1036.0 J per epoch, the least of 4 counts
  /// measured".
  std::string phase_text() const;

 private:
  void start_search(int top);
  void finish_count(const ScaleRow& row);
  void choose();
  bool set_count(int n);

  ScaleOptions opt_;
  int count_ = 0;
  bool searching_ = true;
  int chosen_ = 0;
  bool new_choice_ = false;
  int64_t seen_ = 0;  // steady epochs at count_ since it began
  double sum_s_ = 0, sum_j_ = 0;
  int64_t measured_ = 0;
  int64_t since_choice_ = 0;  // steady epochs at the choice
  std::vector<ScaleRow> rows_;
  std::deque<ScaleRow> unread_;
};

/// What `[energy] scale = "auto"` chooses among, from the declared set (config.toml's
/// active_gpus), `[energy] allowed_gpus` (nullopt: the declared set) and `[policy] min_gpus`.
struct ScalePlan {
  std::vector<int> allowed;  ///< declared GPUs it may train on, ascending (the search's GPUs)
  std::vector<int> outside;  ///< declared GPUs not allowed: given back for the whole run
  int min_count = 1;         ///< the fewest GPUs tried: max(1, min_gpus)
  std::vector<std::string> warnings;  ///< one sentence each, e.g. an allowed GPU not declared
  /// Non-empty: scale cannot run (the sentence says why; the job keeps its GPUs).
  std::string refused;
};

/// The plan; never throws. Refused when no allowed GPU is declared or only one (nothing to
/// search), or when min_gpus is more than the allowed GPUs (the floor would keep a GPU the
/// search does not measure).
ScalePlan plan_scale(const std::vector<int>& declared,
                     const std::optional<std::vector<int>>& allowed_gpus, int min_gpus);

}  // namespace gpurun::energy
