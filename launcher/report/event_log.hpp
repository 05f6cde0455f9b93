// `gpurun report`'s reading of a JSON-lines event log (schema: docs/energy.md#events) into
// per-epoch rows, the power-limit profile and the GPU-count (scale) profile. Internal to
// gpurun_report.
#pragma once

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace gpurun::report::detail {

/// One row of the table and of the plots: an epoch (`energy_epoch`) or, for a run without
/// them, one `energy` window.
struct Row {
  long epoch = -1;              // -1 for a window
  long attempt = 0;             // epoch rows: the restart attempt it belongs to (0 = first)
  double start_s = 0;           // window: start relative to the first window (s)
  double seconds = 0;           // s
  double energy_j = 0;          // J, all GPUs
  double active = 0;            // (time-weighted mean) number of active GPUs
  double avg_power_w = 0;       // W, all GPUs
  double cost = 0;              // Zeus cost (J)
  double cost_total = 0;        // Zeus cost of all rows so far (J)
  std::map<int, double> gpu_j;  // slot -> J
};

/// An epoch row's name: its epoch, prefixed "r<attempt>:" after a restart (epochs repeat).
inline std::string epoch_label(const Row& r) {
  return r.attempt > 0 ? fmt::format("r{}:{}", r.attempt, r.epoch) : std::to_string(r.epoch);
}

struct ProfilePoint {
  double limit_w, steps_per_s, avg_power_w, cost_per_step;
};

/// One measured GPU count of `[energy] scale = "auto"` (a `scale_profile` event).
struct ScalePoint {
  int gpus;
  double seconds, energy_j, cost;  // per epoch: s, J, J
};

struct Run {
  std::vector<Row> epochs;   // energy_epoch
  std::vector<Row> windows;  // energy
  std::vector<ProfilePoint> profile;
  std::optional<double> chosen_limit_w;
  std::vector<ScalePoint> scale;    // scale_profile, in order (a re-check appends)
  std::optional<int> scale_choice;  // the last scale_choice's GPU count
  std::string chosen_source;
  std::optional<long> stop_epoch;
  std::string stop_reason;
  std::optional<double> threshold;  // J
  int runs = 1;                     // "start" events seen (an appended log holds several)
  size_t run_line = 1;              // line of the last run's "start"
  double first_t0 = 0;              // t0 of the first window (Unix s)

  bool per_epoch() const { return !epochs.empty(); }
  const std::vector<Row>& rows() const { return per_epoch() ? epochs : windows; }
  std::set<int> slots() const {
    std::set<int> s;
    for (const auto& r : rows())
      for (const auto& [slot, j] : r.gpu_j) s.insert(slot);
    return s;
  }
};

/// Reads `path` line by line (the last run of an appended log). A line that is not a JSON
/// object, or an energy event with a wrong field, throws gpurun::Error naming path:line —
/// except an unterminated last line (a killed run), which only warns on stderr. Blocks on I/O.
Run read_log(const std::string& path);

}  // namespace gpurun::report::detail
