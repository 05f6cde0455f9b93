#include "energy/scale_profiler.hpp"

#include <algorithm>
#include <utility>

#include <fmt/format.h>

#include "energy/cost.hpp"
#include "energy/early_stop.hpp"
#include "gpurun/error.hpp"

namespace gpurun::energy {

std::string ScaleRow::to_json_fields() const {
  return fmt::format(
      R"({{"gpus": {}, "epochs": {}, "seconds": {}, "energy_j": {}, "cost": {}, "last_epoch": {}}})",
      gpus, epochs, detail::json_number(seconds), detail::json_number(energy_j),
      detail::json_number(cost), last_epoch);
}

ScaleProfiler::ScaleProfiler(ScaleOptions options) : opt_(std::move(options)) {
  if (opt_.allowed.empty()) throw Error("[energy] scale = \"auto\" has no GPU to choose from");
  if (opt_.warmup_epochs < 0)
    throw Error(fmt::format("[energy] scale_warmup_epochs = {} is negative", opt_.warmup_epochs));
  if (opt_.measure_epochs < 1)
    throw Error(
        fmt::format("[energy] scale_measure_epochs = {} is not positive", opt_.measure_epochs));
  if (opt_.recheck_epochs < 0)
    throw Error(fmt::format("[energy] scale_recheck_epochs = {} is negative", opt_.recheck_epochs));
  if (!(opt_.eta >= 0 && opt_.eta <= 1))
    throw Error(fmt::format("scale: η = {} is outside [0, 1]", opt_.eta));
  if (!(opt_.max_power_w > 0))
    throw Error(fmt::format("scale: the allowed GPUs' maximum power {} W is not positive",
                            opt_.max_power_w));
  std::sort(opt_.allowed.begin(), opt_.allowed.end());
  opt_.allowed.erase(std::unique(opt_.allowed.begin(), opt_.allowed.end()), opt_.allowed.end());
  if (opt_.min_count < 1 || opt_.min_count > static_cast<int>(opt_.allowed.size()))
    throw Error(
        fmt::format("scale: the fewest GPUs to try, {}, is outside [1, {}] (the allowed "
                    "GPUs)",
                    opt_.min_count, opt_.allowed.size()));
  start_search(static_cast<int>(opt_.allowed.size()));
}

std::vector<int> ScaleProfiler::gpus() const {
  return {opt_.allowed.begin(), opt_.allowed.begin() + count_};
}

std::vector<int> ScaleProfiler::out() const {
  return {opt_.allowed.begin() + count_, opt_.allowed.end()};
}

void ScaleProfiler::start_search(int top) {
  searching_ = true;
  rows_.clear();
  set_count(top);
}

bool ScaleProfiler::set_count(int n) {
  const bool changed = n != count_;
  count_ = n;
  seen_ = 0;
  measured_ = 0;
  sum_s_ = sum_j_ = 0;
  since_choice_ = 0;
  return changed;
}

bool ScaleProfiler::on_epoch(int64_t epoch, const std::optional<std::vector<int>>& steady_active,
                             double seconds, double energy_j) {
  const bool steady = steady_active && *steady_active == gpus() && seconds > 0;
  if (!searching_) {
    if (!steady || opt_.recheck_epochs == 0 || ++since_choice_ < opt_.recheck_epochs) return false;
    const int top = std::min(chosen_ + 1, static_cast<int>(opt_.allowed.size()));
    start_search(top);
    return top != chosen_;
  }
  // A mixed epoch (the resize to this count inside it) is a warm-up; one that ran steadily on
  // another set (a grow's joiner not admitted yet, a lease) is nothing.
  if (steady_active && !steady) return false;
  if (++seen_ <= opt_.warmup_epochs) return false;
  if (!steady) {  // mixed after the warm-up (another change inside it): it is a new warm-up
    seen_ = std::min<int64_t>(1, opt_.warmup_epochs);
    measured_ = 0;
    sum_s_ = sum_j_ = 0;
    return false;
  }
  sum_s_ += seconds;
  sum_j_ += energy_j;
  if (++measured_ < opt_.measure_epochs) return false;
  ScaleRow row;
  row.gpus = count_;
  row.epochs = measured_;
  row.seconds = sum_s_ / static_cast<double>(measured_);
  row.energy_j = sum_j_ / static_cast<double>(measured_);
  row.cost = zeus_cost(row.energy_j, row.seconds, opt_.max_power_w, opt_.eta);
  row.last_epoch = epoch;
  const int before = count_;
  finish_count(row);
  return count_ != before;
}

void ScaleProfiler::finish_count(const ScaleRow& row) {
  const bool rose = !rows_.empty() && row.cost > rows_.back().cost;
  rows_.push_back(row);
  unread_.push_back(row);
  if (!rose && count_ > opt_.min_count) {
    set_count(count_ - 1);
    return;
  }
  choose();
}

void ScaleProfiler::choose() {
  // The least cost among the rows the floor allows; a tie goes to fewer GPUs.
  const ScaleRow* best = nullptr;
  for (const ScaleRow& r : rows_)
    if (r.gpus >= opt_.min_count &&
        (!best || r.cost < best->cost || (r.cost == best->cost && r.gpus < best->gpus)))
      best = &r;
  if (!best) {  // nothing measured at or above the floor yet: measure the floor
    start_search(opt_.min_count);
    return;
  }
  chosen_ = best->gpus;
  searching_ = false;
  new_choice_ = true;
  set_count(chosen_);
}

bool ScaleProfiler::set_min_count(int n) {
  n = std::clamp(n, 1, static_cast<int>(opt_.allowed.size()));
  if (n == opt_.min_count) return false;
  opt_.min_count = n;
  const int before = count_;
  if (searching_ && count_ < n)
    choose();
  else if (!searching_ && chosen_ < n)
    start_search(n);
  return count_ != before;
}

std::optional<ScaleRow> ScaleProfiler::take_finished_row() {
  if (unread_.empty()) return std::nullopt;
  ScaleRow r = unread_.front();
  unread_.pop_front();
  return r;
}

bool ScaleProfiler::take_new_choice() {
  return std::exchange(new_choice_, false);
}

std::string ScaleProfiler::phase_text() const {
  const size_t all = opt_.allowed.size();
  if (searching_)
    return fmt::format("measuring {} of {} GPUs ({} of {} warm-up and {} of {} measured epochs)",
                       count_, all, std::min(seen_, opt_.warmup_epochs), opt_.warmup_epochs,
                       measured_, opt_.measure_epochs);
  const ScaleRow* best = nullptr;
  for (const ScaleRow& r : rows_)
    if (r.gpus == chosen_) best = &r;
  return fmt::format(
      "chose {} of {} GPUs: cost {} J per epoch, the least of {} counts measured{}{}", chosen_, all,
      best ? format_joules(best->cost) : std::string("?"), rows_.size(),
      opt_.min_count > 1 ? fmt::format(" (not below {}: [policy] min_gpus)", opt_.min_count)
                         : std::string(),
      opt_.recheck_epochs > 0 ? fmt::format(" (re-checked every {} epochs)", opt_.recheck_epochs)
                              : std::string());
}

ScalePlan plan_scale(const std::vector<int>& declared,
                     const std::optional<std::vector<int>>& allowed_gpus, int min_gpus) {
  ScalePlan plan;
  std::vector<int> d = declared;
  std::sort(d.begin(), d.end());
  d.erase(std::unique(d.begin(), d.end()), d.end());
  std::vector<int> named = allowed_gpus.value_or(d);
  std::sort(named.begin(), named.end());
  named.erase(std::unique(named.begin(), named.end()), named.end());
  for (int gpu : named) {
    if (std::binary_search(d.begin(), d.end(), gpu))
      plan.allowed.push_back(gpu);
    else
      plan.warnings.push_back(
          fmt::format("[energy] allowed_gpus names GPU {}, which active_gpus ([{}]) does not: "
                      "scale leaves it out",
                      gpu, fmt::join(d, ", ")));
  }
  for (int gpu : d)
    if (!std::binary_search(plan.allowed.begin(), plan.allowed.end(), gpu))
      plan.outside.push_back(gpu);
  plan.min_count = std::max(1, min_gpus);
  if (plan.allowed.empty()) {
    plan.refused = fmt::format(
        "[energy] scale = \"auto\" has no GPU to choose among (allowed_gpus [{}] and "
        "active_gpus [{}] share none)",
        fmt::join(named, ", "), fmt::join(d, ", "));
  } else if (plan.allowed.size() == 1) {
    plan.refused = fmt::format(
        "[energy] scale = \"auto\" has one GPU to choose among ([{}]): nothing to search",
        plan.allowed.front());
  } else if (plan.min_count > static_cast<int>(plan.allowed.size())) {
    plan.refused = fmt::format(
        "[energy] scale = \"auto\" cannot search: [policy] min_gpus = {} is more than the {} "
        "allowed GPU{} ([{}])",
        min_gpus, plan.allowed.size(), plan.allowed.size() == 1 ? "" : "s",
        fmt::join(plan.allowed, ", "));
  }
  return plan;
}

}  // namespace gpurun::energy
