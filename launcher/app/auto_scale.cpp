#include "app/auto_scale.hpp"

#include <algorithm>
#include <utility>

#include <fmt/format.h>

#include "gpurun/control/decision.hpp"

namespace gpurun::app {

namespace en = gpurun::energy;

AutoScale::AutoScale(supervisor::EventLog& events, std::function<void(const std::string&)> say,
                     control::ElasticController& elastic, en::ScaleOptions options)
    : events_(events),
      say_(std::move(say)),
      elastic_(elastic),
      allowed_(options.allowed),
      profiler_(std::move(options)) {
  say_(fmt::format("scale: choosing the GPU count among [{}] for the least cost per epoch; {}",
                   fmt::join(allowed_, ", "), profiler_.phase_text()));
  publish();
}

void AutoScale::on_epoch(const en::EpochRecord& rec) {
  const bool changed = profiler_.on_epoch(rec.epoch, rec.steady_active, rec.seconds, rec.energy_j);
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
  const std::string why = profiler_.chosen()
                              ? fmt::format("scale: {} GPUs chosen", profiler_.choice())
                              : fmt::format("scale: measuring {} GPUs", profiler_.count());
  for (int gpu : profiler_.out()) out.emplace_back(gpu, why);
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
  const std::vector<int> declared = elastic->declared_gpus();
  std::vector<int> allowed;
  for (int gpu : ec.allowed_gpus.value_or(declared)) {
    if (std::find(declared.begin(), declared.end(), gpu) != declared.end())
      allowed.push_back(gpu);
    else
      say(
          fmt::format("energy: warning: [energy] allowed_gpus names GPU {}, which active_gpus "
                      "([{}]) does not: scale leaves it out",
                      gpu, fmt::join(declared, ", ")));
  }
  if (allowed.empty()) {
    say("energy: warning: [energy] scale = \"auto\" has no GPU to choose among (allowed_gpus "
        "and active_gpus share none); the job keeps its GPUs");
    return nullptr;
  }
  en::ScaleOptions o;
  o.allowed = allowed;
  o.warmup_epochs = ec.scale_warmup_epochs;
  o.measure_epochs = ec.scale_measure_epochs;
  o.recheck_epochs = ec.scale_recheck_epochs;
  o.eta = ec.eta;
  o.max_power_w = monitor.max_power_w(allowed);
  return std::make_unique<AutoScale>(events, std::move(say), *elastic, std::move(o));
}

}  // namespace gpurun::app
