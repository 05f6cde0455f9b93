// gpurun::energy — Zeus' energy-time cost and the accounting of one energy window (the
// `energy` event of docs/energy.md#events). Pure functions: no I/O, no clock.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "energy/energy_series.hpp"

namespace gpurun::energy {

/// Zeus' energy-time cost (J. You, J.-W. Chung, M. Chowdhury, "Zeus: Understanding and
/// Optimizing GPU Energy Consumption of DNN Training", NSDI 2023; also zeus.utils.metric):
///
///   cost = η · E + (1 − η) · MaxPower · T
///
/// `energy_j` E in J, `seconds` T in s, `max_power_w` MaxPower in W — the sum of the maximum
/// power limits of the GPUs charged, so that time is priced at the energy the job could burn
/// in it at most — and `eta` η in [0, 1] (1: energy only, 0: time only). Returns J.
/// Throws gpurun::InvariantError when η is outside [0, 1] (the configuration checks it).
double zeus_cost(double energy_j, double seconds, double max_power_w, double eta);

/// One GPU's share of a window.
struct GpuWindow {
  int slot = 0;                 ///< worker slot
  double energy_j = 0;          ///< counter difference over the window, J
  double power_integral_j = 0;  ///< trapezoid integral of the power readings, J (cross-check)
  double avg_power_w = 0;       ///< energy_j / seconds, W (0 for an empty window)
};

/// One accounted window: the fields of the `energy` event (docs/energy.md#events).
struct WindowRecord {
  std::string kind;                                ///< "epoch", "steps" or "time"
  int64_t generation = -1, epoch = -1, step = -1;  ///< the boundary that ended it; -1 unknown
  double t0_s = 0, t1_s = 0;                       ///< Unix s
  std::vector<int> active;                         ///< slots charged, ascending
  std::vector<GpuWindow> gpus;                     ///< one per active slot, same order
  double energy_j = 0;                             ///< Σ gpus[i].energy_j, J
  double avg_power_w = 0;                          ///< energy_j / seconds, W
  double max_power_w = 0;                 ///< Σ of the active GPUs' maximum power limits, W
  double eta = 0.5;                       ///< Zeus' η used for cost
  double cost = 0;                        ///< zeus_cost(energy_j, seconds(), max_power_w, eta), J
  std::optional<unsigned> power_limit_w;  ///< the one limit in force on the active GPUs, W

  /// t1_s − t0_s, s.
  double seconds() const { return t1_s - t0_s; }
  /// The `energy` event's fields as one JSON object, in the order of docs/energy.md:
  /// {"kind", "generation", "epoch", "step", "t0", "t1", "seconds", "active", "gpus":
  /// [{"slot", "energy_j", "power_integral_j", "avg_power_w"}], "energy_j", "avg_power_w",
  /// "max_power_w", "eta", "cost", "power_limit_w" (number or null)}. No "ts"/"event": the
  /// event log adds those. Non-finite numbers are written as null.
  std::string to_json_fields() const;
};

/// Accounts the window [t0_s, t1_s] over `active_slots` (duplicates removed, sorted):
/// each active slot's energy_between / power_integral from `series`, the sum, and Zeus' cost
/// with max_power_w = Σ max_limit_w[slot] over the active slots. Slots not in `active_slots`
/// (parked, paused, left) are not charged, whatever their GPUs drew. An empty active set gives
/// a window of zero energy and zero cost. `power_limit_w` is copied into the record.
/// Throws gpurun::InvariantError when an active slot has no series or no max limit, or when
/// t1_s < t0_s or η is outside [0, 1].
WindowRecord account_window(const std::string& kind, int64_t generation, int64_t epoch,
                            int64_t step, double t0_s, double t1_s,
                            const std::vector<int>& active_slots,
                            const std::map<int, const EnergySeries*>& series,
                            const std::map<int, double>& max_limit_w, double eta,
                            std::optional<unsigned> power_limit_w = std::nullopt);

namespace detail {
/// A JSON number for `v` (shortest round-trip form), or "null" when v is not finite.
std::string json_number(double v);
/// A JSON string literal for `s` (quotes, escapes).
std::string json_string(const std::string& s);
}  // namespace detail

}  // namespace gpurun::energy
