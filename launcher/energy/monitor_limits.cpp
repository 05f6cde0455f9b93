// EnergyMonitor's power limits and locked clocks (docs/energy.md#power-limits): the profile
// driven from the sampling thread, the limits and clocks set through the guard, restored when
// a GPU leaves the job, when the guard dies and at the end. The sampling, windows and cost are
// in monitor.cpp.
#include <algorithm>
#include <filesystem>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <boost/asio/post.hpp>

#include "energy/monitor.hpp"
#include "energy/power_journal.hpp"

namespace gpurun::energy {

std::optional<double> EnergyMonitor::hottest_c(const std::vector<int>& active) {
  std::optional<double> hottest;
  for (const MonitoredGpu& g : gpus_) {
    if (std::find(active.begin(), active.end(), g.slot) == active.end()) continue;
    try {
      const double c = nvml_->temperature_c(g.device);
      hottest = std::max(hottest.value_or(c), c);
    } catch (const NvmlError& e) {
      // No sensor to read is the GPU's nature, not a failure: the profile goes without.
      if (!e.not_supported())
        report_read_failure(
            g, "temperature", e.what(),
            "the power-limit profile's cool-down goes by the other GPUs' temperatures (none: no "
            "wait)");
    }
  }
  return hottest;
}

void EnergyMonitor::drive_profiler(double t) {
  if (!profiler_ || !progress_) return;
  std::vector<int> active;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (profiler_->done()) return;
    active = active_for_thread_;
  }
  if (active.empty()) return;
  // The most advanced rank's step count, observed at the end of that step (the worker's
  // clock, which is this one): steps are timed exactly, not to the sampling period.
  control::Progress latest;
  for (int slot : active) {
    const control::Progress p = progress_->read(slot);
    if (p.steps > latest.steps) latest = p;
  }
  const uint64_t steps = latest.steps;
  if (steps == 0) return;  // training has not started: nothing to measure yet
  if (latest.time_ns > 0) t = std::min(t, static_cast<double>(latest.time_ns) * 1e-9);
  const std::optional<double> temp_c = hottest_c(active);
  // The profiler is shared with set_active() (interrupt): every use under mu_.
  std::vector<ProfileRow> finished, all;
  unsigned before = 0, now_w = 0;
  bool done = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    double energy = 0;
    for (int slot : active) {
      auto it = series_.find(slot);
      if (it != series_.end() && !it->second.empty()) energy += it->second.energy_at(t);
    }
    before = profiler_->limit_w();
    profiler_->observe(t, static_cast<int64_t>(steps), energy, temp_c);
    while (std::optional<ProfileRow> row = profiler_->take_finished_row()) finished.push_back(*row);
    done = profiler_->done();
    now_w = done ? profiler_->chosen_w() : profiler_->limit_w();
    if (done) all = profiler_->rows();
  }
  for (const ProfileRow& row : finished) post_event("power_profile", row.to_json_fields());
  if (done) {
    say_later(fmt::format("power-limit profile done: {} W has the lowest cost per step (η = {})",
                          now_w, opt_.eta));
    apply_limit(now_w, "profile");
    if (!opt_.profile_cache.empty() && !gpus_.empty()) {
      try {
        store_limit(opt_.profile_cache,
                    ProfileKey{opt_.program, opt_.job, gpus_.front().name,
                               static_cast<int>(gpus_.size()), opt_.eta},
                    now_w, all);
      } catch (const Error& e) {
        post_event("energy_error", fmt::format(R"({{"error":{}}})", detail::json_string(e.what())));
      }
    }
  } else if (now_w != before) {
    apply_limit(now_w, "profiling");
  }
}

// ---- power limits --------------------------------------------------------------------------

void EnergyMonitor::check_guard() {
  if (!guard_ || (originals_mw_.empty() && clocks_locked_.empty()) || guard_->alive()) return;
  // Without its guard a kill -9 of gpurun would leave the limits changed: restore them now.
  const int64_t dead = guard_->pid();
  std::string msg = fmt::format(
      "the power-limit guard (pid {}) died: original limits and clocks restored now, monitoring "
      "only",
      dead);
  limits_denied_ = true;
  guard_.reset();  // reaps it; restore_limits() then has no guard to tell
  // What is back leaves the power journal here (the dead guard cannot drop it): else the next
  // gpurun would "restore" GPUs that nothing left changed. A GPU not restored keeps its entry.
  const std::filesystem::path journal = journal_path();
  for (const std::string& uuid : restore_limits()) {
    JournalEntry e;
    e.host = host_name();
    e.uuid = uuid;
    e.guard_pid = dead;
    try {
      update_journal(journal, e, /*remove=*/true);
    } catch (const Error& ex) {
      msg += fmt::format(" ({}: the next gpurun restores {} again, harmlessly)", ex.what(), uuid);
    }
  }
  fail_later(msg);
}

bool EnergyMonitor::ensure_guard() {
  if (guard_) return true;
  try {
    guard_ = std::make_unique<PowerGuard>(opt_.guard_exe);
    return true;
  } catch (const Error& e) {
    limits_denied_ = true;
    post_event("energy_error", fmt::format(R"({{"error":{}}})", detail::json_string(e.what())));
    say_later(
        "the power-limit guard could not start, so no limit or clock is changed "
        "(monitoring only): " +
        std::string(e.what()));
    return false;
  }
}

void EnergyMonitor::lock_clocks(unsigned min_mhz, unsigned max_mhz) {
  if (limits_denied_ || !ensure_guard()) return;
  clocks_mhz_ = std::make_pair(min_mhz, max_mhz);
  for (const MonitoredGpu& g : gpus_) {
    if (!limits_apply(g) || clocks_locked_.count(g.uuid)) continue;
    try {
      guard_->remember_clocks(g.uuid);  // the guard resets them should gpurun die
      nvml_->set_gpu_locked_clocks(g.device, min_mhz, max_mhz);
      clocks_locked_.insert(g.uuid);
    } catch (const Error& e) {
      const auto* nv = dynamic_cast<const NvmlError*>(&e);
      const std::string msg = fmt::format(
          "cannot lock the GPU clocks ({}){}; the clocks stay as the driver sets them", e.what(),
          nv && nv->no_permission() ? ": this needs root or CAP_SYS_ADMIN" : "");
      if (!originals_mw_.count(g.uuid)) try {
          if (guard_ && guard_->alive()) guard_->forget(g.uuid);
        } catch (const Error&) {
        }
      post_event("energy_error", fmt::format(R"({{"error":{}}})", detail::json_string(msg)));
      say_(msg);
      break;
    }
  }
  if (clocks_locked_.empty()) return;
  post_event("clocks_locked", fmt::format(R"({{"min_mhz":{},"max_mhz":{},"gpus":{}}})", min_mhz,
                                          max_mhz, clocks_locked_.size()));
  say_(fmt::format(
      "GPU clocks locked at {} MHz on {} GPU{}",
      min_mhz == max_mhz ? std::to_string(min_mhz) : fmt::format("{}–{}", min_mhz, max_mhz),
      clocks_locked_.size(), clocks_locked_.size() == 1 ? "" : "s"));
}

void EnergyMonitor::apply_limit(unsigned watts, const std::string& source) {
  if (limits_denied_ || !ensure_guard()) return;
  requested_w_ = watts;
  std::optional<unsigned> applied_w;  // what the GPUs got (the request clamped to their range)
  bool clamped = false;
  size_t applied = 0;
  for (const MonitoredGpu& g : gpus_) {
    if (!limits_apply(g)) continue;
    ++applied;
    const unsigned mw =
        std::clamp(watts * 1000u, g.min_limit_mw, std::max(g.min_limit_mw, g.max_limit_mw));
    clamped = clamped || mw != watts * 1000u;
    bool remembered_now = false;
    try {
      if (!originals_mw_.count(g.uuid)) {
        const unsigned orig = nvml_->power_limit_mw(g.device);
        guard_->remember(OriginalLimit{g.uuid, orig});  // safe before anything changes
        originals_mw_[g.uuid] = orig;
        remembered_now = true;
      }
      nvml_->set_power_limit_mw(g.device, mw);
      applied_w = applied_w ? std::min(*applied_w, mw / 1000) : mw / 1000;
    } catch (const NvmlError& e) {
      limits_denied_ = true;
      // This GPU was not changed by us: nothing to restore for it.
      if (remembered_now) {
        originals_mw_.erase(g.uuid);
        try {
          guard_->forget(g.uuid);
        } catch (const Error&) {
        }
      }
      const std::string msg =
          e.no_permission()
              ? fmt::format(
                    "cannot set power limits ({}): this needs root or CAP_SYS_ADMIN; "
                    "monitoring only",
                    e.what())
              : fmt::format("cannot set power limits ({}); monitoring only", e.what());
      fail_later(msg);
      restore_limits();
      return;
    } catch (const Error& e) {  // the guard is gone: change nothing more
      limits_denied_ = true;
      const std::string msg =
          fmt::format("cannot set power limits ({}); monitoring only", e.what());
      fail_later(msg);
      restore_limits();
      return;
    }
  }
  if (!applied_w) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    limit_w_ = *applied_w;
  }
  post_event("power_limit", fmt::format(R"({{"limit_w":{},"requested_w":{},"source":{}}})",
                                        *applied_w, watts, detail::json_string(source)));
  if (source != "profiling") {
    const std::string line =
        clamped ? fmt::format(
                      "power limit {} W on {} GPU{} ({}; {} W asked, outside the GPUs' "
                      "range)",
                      *applied_w, applied, applied == 1 ? "" : "s", source, watts)
                : fmt::format("power limit {} W on {} GPU{} ({})", *applied_w, applied,
                              applied == 1 ? "" : "s", source);
    say_later(line);
  }
}

std::vector<std::string> EnergyMonitor::restore_limits(bool from_destructor) {
  std::vector<std::string> restored;
  for (const MonitoredGpu& g : gpus_) {
    const bool changed = clocks_locked_.count(g.uuid) || originals_mw_.count(g.uuid);
    if (changed && restore_gpu(g, from_destructor)) restored.push_back(g.uuid);
  }
  std::lock_guard<std::mutex> lock(mu_);
  limit_w_.reset();
  return restored;
}

bool EnergyMonitor::restore_gpu(const MonitoredGpu& g, bool from_destructor) {
  bool failed = false;
  if (clocks_locked_.erase(g.uuid)) {
    std::string name = "clocks_reset", fields;
    try {
      nvml_->reset_gpu_locked_clocks(g.device);
      fields = fmt::format(R"({{"slot":{},"uuid":{}}})", g.slot, detail::json_string(g.uuid));
      if (!originals_mw_.count(g.uuid) && guard_) try {
          guard_->forget(g.uuid);
        } catch (const Error&) {
        }
    } catch (const Error& e) {  // left recorded with the guard: it resets them at its exit
      failed = true;
      name = "energy_error";
      fields = fmt::format(R"({{"error":{}}})", detail::json_string(e.what()));
    }
    if (from_destructor)
      emit_json(name, fields);
    else
      post_event(name, fields);
  }
  auto it = originals_mw_.find(g.uuid);
  if (it == originals_mw_.end()) return !failed;
  std::string fields;
  try {
    nvml_->set_power_limit_mw(g.device, it->second);
    try {
      if (guard_) guard_->forget(g.uuid);
    } catch (const Error&) {
      // Restored all the same; a guard that is gone has nothing left to do for it.
    }
    fields =
        fmt::format(R"({{"limit_w":{},"source":"restore","slot":{},"uuid":{}}})",
                    detail::json_number(it->second / 1000.0), g.slot, detail::json_string(g.uuid));
  } catch (const Error& e) {
    // Left recorded with the guard: it tries again when gpurun's pipe closes.
    failed = true;
    fields = fmt::format(R"({{"error":{}}})", detail::json_string(e.what()));
  }
  // The destructor runs after the io loop: write the event at once.
  const std::string name = fields.rfind(R"({"error")", 0) == 0 ? "energy_error" : "power_limit";
  if (from_destructor)
    emit_json(name, fields);
  else
    post_event(name, fields);
  originals_mw_.erase(it);
  return !failed;
}

bool EnergyMonitor::limits_apply(const MonitoredGpu& g) const {
  return !limits_on_ || std::binary_search(limits_on_->begin(), limits_on_->end(), g.slot);
}

void EnergyMonitor::follow_active() {
  std::vector<int> active;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!active_known_) return;
    active = active_for_thread_;
  }
  if (limits_on_ == active) return;
  const std::optional<std::vector<int>> before = std::exchange(limits_on_, active);
  std::vector<int> back, returned;
  for (const MonitoredGpu& g : gpus_) {
    const bool in = limits_apply(g);
    const bool was = !before || std::binary_search(before->begin(), before->end(), g.slot);
    if (!in && (originals_mw_.count(g.uuid) || clocks_locked_.count(g.uuid))) {
      if (restore_gpu(g, false)) back.push_back(g.slot);
    } else if (in && !was) {
      returned.push_back(g.slot);
    }
  }
  if (!back.empty()) {
    const std::string line = fmt::format(
        "GPU{} [{}] left the job: {} original power limit{} and clocks restored (not left capped "
        "for whoever uses {} next)",
        back.size() == 1 ? "" : "s", fmt::join(back, ", "), back.size() == 1 ? "its" : "their",
        back.size() == 1 ? "" : "s", back.size() == 1 ? "it" : "them");
    say_later(line);
  }
  if (returned.empty() || limits_denied_) return;
  if (requested_w_) apply_limit(*requested_w_, "rejoined");
  if (clocks_mhz_) lock_clocks(clocks_mhz_->first, clocks_mhz_->second);
}

bool EnergyMonitor::profiling() const {
  std::lock_guard<std::mutex> lock(mu_);
  return profiler_ && !profiler_->done();
}

std::optional<unsigned> EnergyMonitor::limit_in_force() const {
  std::lock_guard<std::mutex> lock(mu_);
  return limit_w_;
}

}  // namespace gpurun::energy
