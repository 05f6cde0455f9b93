#include "app/auto_scale.hpp"

#include <algorithm>
#include <utility>

#include <fmt/format.h>

#include "gpurun/control/decision.hpp"

namespace gpurun::app {

namespace en = gpurun::energy;

AutoScale::AutoScale(supervisor::EventLog& events, std::function<void(const std::string&)> say,
                     control::ElasticController& elastic, en::ScaleOptions options,
                     std::vector<int> outside, std::function<bool()> power_profiling)
    : events_(events),
      say_(std::move(say)),
      elastic_(elastic),
      allowed_(options.allowed),
      outside_(std::move(outside)),
      power_profiling_(std::move(power_profiling)),
      profiler_(std::move(options)) {
  say_(fmt::format("scale: choosing the GPU count among [{}] for the least cost per epoch{}{}; {}",
                   fmt::join(allowed_, ", "),
                   outside_.empty() ? std::string()
                                    : fmt::format(" (GPUs [{}] are not in [energy] allowed_gpus: "
                                                  "given back)",
                                                  fmt::join(outside_, ", ")),
                   elastic_.min_gpus() > 1
                       ? fmt::format(", not below {} ([policy] min_gpus)", elastic_.min_gpus())
                       : std::string(),
                   profiler_.phase_text()));
  publish();
}

void AutoScale::on_epoch(const en::EpochRecord& rec) {
  // Both "auto": the GPU count is searched under the limit the profile chose, not under the
  // limits it is still trying (each would make the epochs' cost another's).
  if (power_profiling_ && power_profiling_()) {
    if (!std::exchange(profile_said_, true))
      say_(
          fmt::format("scale: epoch {} ran while the power-limit profile measures: the GPU-count "
                      "search starts after it",
                      rec.epoch));
    return;
  }
  if (profile_said_ && !std::exchange(profile_over_, true)) return;  // the profile ended in it
  // [policy] min_gpus applies from a reload: the search never goes below it.
  const int floor = std::max(1, elastic_.min_gpus());
  if (floor > static_cast<int>(allowed_.size()) && !floor_said_) {
    floor_said_ = true;
    say_(
        fmt::format("energy: warning: [policy] min_gpus = {} is more than the {} GPUs scale "
                    "chooses among ([{}]): it keeps them all",
                    floor, allowed_.size(), fmt::join(allowed_, ", ")));
  }
  if (floor <= static_cast<int>(allowed_.size())) floor_said_ = false;
  bool changed = profiler_.set_min_count(floor);
  changed = profiler_.on_epoch(rec.epoch, rec.steady_active, rec.seconds, rec.energy_j) || changed;
  while (std::optional<en::ScaleRow> row = profiler_.take_finished_row()) {
    events_.emit("scale_profile", supervisor::JsonObject::from_object(row->to_json_fields()));
    say_(fmt::format("scale: {} GPU{}: {:.2f} s, {} J and cost {} J per epoch (epoch {})",
                     row->gpus, row->gpus == 1 ? "" : "s", row->seconds,
                     en::format_joules(row->energy_j), en::format_joules(row->cost),
                     row->last_epoch));
  }
  if (profiler_.take_new_choice()) {
    std::string rows = "[";
    for (const en::ScaleRow& r : profiler_.rows())
      rows += (rows.size() > 1 ? "," : "") + r.to_json_fields();
    rows += "]";
    supervisor::JsonObject f;
    f.add("gpus", profiler_.choice())
        .add_raw("active", control::ids_json(profiler_.gpus()))
        .add_raw("given_back", control::ids_json(profiler_.out()))
        .add("epoch", rec.epoch)
        .add("reason", profiler_.phase_text())
        .add_raw("rows", rows);
    events_.emit("scale_choice", f);
    say_(fmt::format("scale: {}{}", profiler_.phase_text(),
                     profiler_.out().empty() ? std::string()
                                             : fmt::format("; GPUs [{}] are given back",
                                                           fmt::join(profiler_.out(), ", "))));
  }
  if (changed) publish();
}

void AutoScale::finish() {
  if (profiler_.chosen()) return;
  if (profiler_.choice() > 0) {
    say_(fmt::format("scale: the job ended during a re-check ({}); the last choice was {} GPUs",
                     profiler_.phase_text(), profiler_.choice()));
    return;
  }
  std::string rows;
  for (const en::ScaleRow& r : profiler_.rows())
    rows += fmt::format("{}{} GPU{} {} J", rows.empty() ? "" : ", ", r.gpus, r.gpus == 1 ? "" : "s",
                        en::format_joules(r.cost));
  say_(fmt::format(
      "scale: the job ended while {}: no GPU count was chosen ({})", profiler_.phase_text(),
      rows.empty() ? std::string("no count measured") : "cost per epoch measured: " + rows));
}

std::string AutoScale::status_json() const {
  std::string rows = "[";
  for (const en::ScaleRow& r : profiler_.rows())
    rows += (rows.size() > 1 ? "," : "") + r.to_json_fields();
  rows += "]";
  supervisor::JsonObject o;
  o.add_raw("allowed", control::ids_json(allowed_))
      .add("gpus", profiler_.count())
      .add("phase", profiler_.phase_text())
      .add_raw("rows", rows);
  if (profiler_.choice() > 0)
    o.add("choice", profiler_.choice());
  else
    o.add_raw("choice", "null");
  return o.str();
}

void AutoScale::publish() {
  std::vector<std::pair<int, std::string>> out;
  const auto gpus = [](int n) { return fmt::format("{} GPU{}", n, n == 1 ? "" : "s"); };
  const std::string why = profiler_.chosen()
                              ? fmt::format("scale: {} chosen", gpus(profiler_.choice()))
                              : fmt::format("scale: measuring {}", gpus(profiler_.count()));
  for (int gpu : profiler_.out()) out.emplace_back(gpu, why);
  for (int gpu : outside_) out.emplace_back(gpu, "scale: not in [energy] allowed_gpus");
  elastic_.set_scale(std::move(out), status_json());
}

std::unique_ptr<AutoScale> make_auto_scale(supervisor::EventLog& events,
                                           std::function<void(const std::string&)> say,
                                           control::ElasticController* elastic,
                                           const en::EnergyMonitor& monitor,
                                           const control::Config& config) {
  const control::EnergyConfig& ec = config.energy;
  if (!elastic) {
    say("energy: warning: [energy] scale = \"auto\" resizes the job: it needs --config "
        "(elastic mode); the job keeps its GPUs");
    return nullptr;
  }
  en::ScalePlan plan =
      en::plan_scale(elastic->declared_gpus(), ec.allowed_gpus, config.policy.min_gpus);
  for (const std::string& w : plan.warnings) say("energy: warning: " + w);
  if (!plan.refused.empty()) {
    say("energy: warning: " + plan.refused + "; the job keeps its GPUs");
    return nullptr;
  }
  en::ScaleOptions o;
  o.allowed = plan.allowed;
  o.min_count = plan.min_count;
  o.warmup_epochs = ec.scale_warmup_epochs;
  o.measure_epochs = ec.scale_measure_epochs;
  o.recheck_epochs = ec.scale_recheck_epochs;
  o.eta = ec.eta;
  o.max_power_w = monitor.max_power_w(plan.allowed);
  return std::make_unique<AutoScale>(events, std::move(say), *elastic, std::move(o),
                                     std::move(plan.outside),
                                     [&monitor] { return monitor.profiling(); });
}

}  // namespace gpurun::app
