// `[energy] scale = "auto"` in the gpurun executable (docs/energy.md#scale): the pure
// ScaleProfiler fed by the energy monitor's epochs, its count given to the elastic controller
// as a policy on the effective set (docs/sharing.md), its rows and choice said on the console
// and logged as `scale_profile` / `scale_choice` events. Part of the composition root.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "control/config.hpp"
#include "control/elastic_controller.hpp"
#include "energy/early_stop.hpp"
#include "energy/monitor.hpp"
#include "energy/scale_profiler.hpp"
#include "supervisor/event_log.hpp"

namespace gpurun::app {

/// Io thread only; `events`, `elastic` must outlive it.
class AutoScale {
 public:
  /// `options.allowed`: the slots to choose among (ascending); `outside`: declared slots not
  /// allowed, given back for the whole run. `say` prints one "gpurun: …" line.
  /// Throws gpurun::Error when the options are invalid (ScaleProfiler's messages).
  AutoScale(supervisor::EventLog& events, std::function<void(const std::string&)> say,
            control::ElasticController& elastic, energy::ScaleOptions options,
            std::vector<int> outside, std::function<bool()> power_profiling = {});

  /// A finished epoch (EnergyMonitor's epoch hook): measured, and when the count changes the
  /// controller gets the new set (at this boundary when called inside its energy hook). While
  /// `power_profiling()` (the power-limit profile changes the limits) it counts for nothing.
  void on_epoch(const energy::EpochRecord& rec);

  /// The job ended: a search still running says so (what was measured, no choice made).
  void finish();

  const energy::ScaleProfiler& profiler() const { return profiler_; }

 private:
  void publish();  // the controller's policy + status
  std::string status_json() const;

  supervisor::EventLog& events_;
  std::function<void(const std::string&)> say_;
  control::ElasticController& elastic_;
  std::vector<int> allowed_;
  std::vector<int> outside_;
  bool floor_said_ = false;  // a reloaded min_gpus above the allowed GPUs (said once)
  std::function<bool()> power_profiling_;
  bool profile_said_ = false;  // an epoch ran under the power-limit profile
  bool profile_over_ = false;  // the epoch the profile ended in was skipped too
  energy::ScaleProfiler profiler_;
};

/// The AutoScale for `config`'s [energy] scale = "auto", or nullptr (after a warning through
/// `say`) when it cannot run: no elastic controller, or energy::plan_scale refused (no GPU of
/// allowed_gpus in the declared set, min_gpus above the allowed GPUs). `monitor` gives the
/// GPUs' maximum power.
std::unique_ptr<AutoScale> make_auto_scale(supervisor::EventLog& events,
                                           std::function<void(const std::string&)> say,
                                           control::ElasticController* elastic,
                                           const energy::EnergyMonitor& monitor,
                                           const control::Config& config);

}  // namespace gpurun::app
