#include "energy/monitor.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <set>

#include <fmt/format.h>
#include <boost/asio/post.hpp>

#include "supervisor/asio_clock.hpp"

namespace gpurun::energy {

namespace {

// How old (s) a window may be and still take a new active set instead of being closed: the
// decision that changes the set follows the boundary that opened the window within ms.
constexpr double kFreshWindowS = 0.25;

}  // namespace

double EnergyMonitor::now_s() {
  timespec ts{};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

EnergyMonitor::EnergyMonitor(boost::asio::io_context& io, supervisor::EventLog& events,
                             std::function<void(const std::string&)> say,
                             std::unique_ptr<Nvml> nvml, std::vector<MonitoredGpu> gpus,
                             MonitorOptions options, const control::ProgressFile* progress)
    : io_(io),
      events_(events),
      say_(std::move(say)),
      nvml_(std::move(nvml)),
      gpus_(std::move(gpus)),
      opt_(std::move(options)),
      progress_(progress),
      own_clock_(opt_.clock ? nullptr : std::make_unique<supervisor::AsioClock>(io)),
      clock_(opt_.clock ? *opt_.clock : *own_clock_) {
  std::string gpus_json = "[";
  for (const MonitoredGpu& g : gpus_) {
    series_[g.slot];
    max_limit_w_[g.slot] = g.max_limit_mw / 1000.0;
    unsigned limit_mw = 0;
    try {
      limit_mw = nvml_->power_limit_mw(g.device);
    } catch (const NvmlError&) {
    }
    gpus_json += fmt::format(
        R"({}{{"slot":{},"uuid":{},"name":{},"min_limit_w":{},"max_limit_w":{},"power_limit_w":{}}})",
        gpus_json.size() > 1 ? "," : "", g.slot, detail::json_string(g.uuid),
        detail::json_string(g.name), detail::json_number(g.min_limit_mw / 1000.0),
        detail::json_number(g.max_limit_mw / 1000.0), detail::json_number(limit_mw / 1000.0));
  }
  gpus_json += "]";
  emit_json("energy_monitor", fmt::format(R"({{"gpus":{},"period_s":{},"library":{}}})", gpus_json,
                                          detail::json_number(opt_.period.count() / 1000.0),
                                          detail::json_string(nvml_->library())));
  window_t0_ = opt_.start_s > 0 ? std::min(opt_.start_s, clock_s()) : clock_s();
  attempt_start_s_ = window_t0_;

  // Power limits: fixed, from the cache, or profiled. Each needs the guard first.
  if (opt_.fixed_limit_w) {
    apply_limit(*opt_.fixed_limit_w, "fixed");
  } else if (opt_.auto_limit && !gpus_.empty()) {
    ProfileKey key{opt_.program, opt_.job, gpus_.front().name, static_cast<int>(gpus_.size()),
                   opt_.eta};
    std::optional<unsigned> cached;
    if (!opt_.profile_cache.empty()) {
      try {
        cached = cached_limit(opt_.profile_cache, key);
      } catch (const Error& e) {
        say_(fmt::format("warning: the power-limit cache cannot be read, profiling again: {}",
                         e.what()));
      }
    }
    if (cached) {
      say_(fmt::format("power limit {} W from the cache {} (no profiling)", *cached,
                       opt_.profile_cache));
      apply_limit(*cached, "cache");
    } else if (!progress_) {
      say_(
          "power_limit_watts = \"auto\" needs the workers' step progress (the worker "
          "runtime): the limits stay as they are");
    } else {
      ProfilerOptions po;
      unsigned lo = 0, hi = UINT32_MAX;
      double max_power = 0;
      for (const MonitoredGpu& g : gpus_) {
        lo = std::max(lo, g.min_limit_mw / 1000);
        hi = std::min(hi, g.max_limit_mw / 1000);
        max_power += g.max_limit_mw / 1000.0;
      }
      po.max_w = hi;
      po.min_w = lo;
      po.warmup_steps = opt_.warmup_steps;
      po.measure_steps = opt_.measure_steps;
      po.eta = opt_.eta;
      po.max_power_w = max_power;
      po.cooldown_max_s = opt_.cooldown_max_s;
      po.settle_window_s = opt_.settle_window_s;
      profiler_ = std::make_unique<PowerProfiler>(po);
      bool sensor = false;  // a cool-down needs one GPU that reports its temperature
      for (const MonitoredGpu& g : gpus_) {
        try {
          nvml_->temperature_c(g.device);
          sensor = true;
          break;
        } catch (const NvmlError&) {
        }
      }
      say_(fmt::format(
          "profiling power limits from {} W down to {} W in 25 W steps ({} warm-up + {} "
          "measured steps each{})",
          hi, lo, opt_.warmup_steps, opt_.measure_steps,
          po.cooldown_max_s <= 0 ? std::string()
          : sensor ? fmt::format("; a measurement starts once the hottest GPU's temperature stayed "
                                 "within {} °C for {} s, at most {} s after the limit changed",
                                 po.settle_c, po.settle_window_s, po.cooldown_max_s)
                   : std::string("; no GPU here reports its temperature, so a measurement starts "
                                 "without a cool-down")));
      apply_limit(profiler_->limit_w(), "profiling");
      if (limits_denied_) profiler_.reset();
    }
  }
  if (opt_.locked_clocks_mhz)
    lock_clocks(opt_.locked_clocks_mhz->first, opt_.locked_clocks_mhz->second);
  arm_time_window();
  thread_ = std::thread([this] { run(); });
}

EnergyMonitor::~EnergyMonitor() {
  {
    std::lock_guard<std::mutex> lock(stop_mu_);
    stop_ = true;
  }
  stop_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  restore_limits(/*from_destructor=*/true);
  guard_.reset();  // the helper exits; nothing is left for it to restore
}

// ---- sampling thread ---------------------------------------------------------------------

void EnergyMonitor::run() {
  auto next = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lock(stop_mu_);
  int since_check = 0;
  while (!stop_) {
    lock.unlock();
    sample_once();
    follow_active();
    if (++since_check * opt_.period >= std::chrono::seconds(1)) {
      since_check = 0;
      check_guard();
      list_processes();
    }
    lock.lock();
    next += opt_.period;
    const auto now = std::chrono::steady_clock::now();
    if (next < now) next = now;  // a slow read: do not try to catch up
    stop_cv_.wait_until(lock, next, [this] { return stop_; });
  }
}

void EnergyMonitor::set_process_hook(ProcessHook hook) {
  std::lock_guard<std::mutex> lock(mu_);
  process_hook_ = std::move(hook);
}

void EnergyMonitor::list_processes() {
  ProcessHook hook;
  {
    std::lock_guard<std::mutex> lock(mu_);
    hook = process_hook_;
  }
  if (!hook) return;
  std::map<int, std::vector<Nvml::Process>> found;
  for (const MonitoredGpu& g : gpus_) {
    try {
      found[g.slot] = nvml_->compute_processes(g.device);
    } catch (const NvmlError& e) {
      report_read_failure(g, "process list", e.what(), "[policy] yield_to_foreign cannot see it");
    }
  }
  boost::asio::post(io_, [hook = std::move(hook), found = std::move(found),
                          alive = std::weak_ptr<int>(alive_)]() mutable {
    if (!alive.expired()) hook(std::move(found));
  });
}

void EnergyMonitor::sample_once(bool drive_profiler_too) {
  std::vector<std::pair<int, Sample>> taken;
  for (const MonitoredGpu& g : gpus_) {
    std::optional<uint64_t> mj;
    std::optional<unsigned> mw;
    // The counter's time is the middle of its read: a thread descheduled around the read
    // (a busy machine) then misplaces the reading by half the delay, not all of it.
    const double before = clock_s();
    double counter_t = before;
    try {
      mj = nvml_->total_energy_mj(g.device);
      counter_t = (before + clock_s()) / 2;
    } catch (const NvmlError& e) {
      report_read_failure(g, "energy counter", e.what(),
                          "its energy is integrated from the power readings instead");
    }
    try {
      mw = nvml_->power_mw(g.device);
    } catch (const NvmlError& e) {
      report_read_failure(g, "power", e.what(), "");
    }
    const double t = clock_s();
    Reading& r = readings_[g.slot];
    if (mj && !r.counter_failed) {
      taken.push_back(
          {g.slot, Sample{counter_t, *mj / 1000.0, mw ? *mw / 1000.0 : r.last_power_w}});
    } else if (mw) {
      // No counter (ever, or since it failed): a counter of our own, the trapezoid integral
      // of the power readings. Switching to it looks like a counter reset, which the series
      // bridges (energy_series.hpp).
      r.counter_failed = r.counter_failed || !mj;
      const double w = *mw / 1000.0;
      if (r.last_t > 0) r.integrated_j += (r.last_power_w + w) / 2 * (t - r.last_t);
      taken.push_back({g.slot, Sample{t, r.integrated_j, w}});
    }
    if (mw) {
      r.last_power_w = *mw / 1000.0;
      r.last_t = t;
    }
  }
  double t = taken.empty() ? clock_s() : taken.back().second.t_s;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [slot, s] : taken) {
      series_[slot].add(s);
      last_power_w_[slot] = s.power_w;
      // Keep what the open window (and a margin) needs.
      series_[slot].drop_before(std::min(window_t0_, s.t_s) - 10.0);
    }
  }
  samples_ += taken.size();
  if (progress_) {
    bool known = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      known = first_step_s_.has_value();
    }
    if (!known && first_step_s()) {
      boost::asio::post(io_, [this, alive = std::weak_ptr<int>(alive_)] {
        if (!alive.expired()) end_startup();
      });
    }
  }
  if (drive_profiler_too) drive_profiler(t);
}

std::optional<double> EnergyMonitor::first_step_s() {
  std::vector<int> active;
  double since = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (first_step_s_ || !progress_) return first_step_s_;
    active = active_for_thread_;
    since = attempt_start_s_;
  }
  // Each slot's line holds its latest step: the earliest of them, seen soon after training
  // began, is the first rank's first step to within a sampling period.
  std::optional<double> first;
  for (int slot : active) {
    const control::Progress p = progress_->read(slot);
    const double t = static_cast<double>(p.time_ns) * 1e-9;
    if (p.steps == 0 || p.time_ns == 0 || t < since) continue;  // none yet, or an old attempt's
    if (!first || t < *first) first = t;
  }
  if (!first) return std::nullopt;
  std::lock_guard<std::mutex> lock(mu_);
  if (!first_step_s_) first_step_s_ = first;
  return first_step_s_;
}

void EnergyMonitor::report_read_failure(const MonitoredGpu& g, const std::string& what,
                                        const std::string& error, const std::string& then) {
  if (!read_failed_.insert({g.slot, what}).second) return;  // once per GPU and reading
  post_event("energy_error", fmt::format(R"({{"slot":{},"uuid":{},"reading":{},"error":{}}})",
                                         g.slot, detail::json_string(g.uuid),
                                         detail::json_string(what), detail::json_string(error)));
  const std::string line =
      fmt::format("warning: GPU {} (slot {}): its {} cannot be read ({}){}", g.uuid, g.slot, what,
                  error, then.empty() ? "" : ": " + then);
  say_later(line);
}

// ---- io thread -----------------------------------------------------------------------------

void EnergyMonitor::post_event(std::string name, std::string fields_json) {
  boost::asio::post(io_, [this, name = std::move(name), f = std::move(fields_json),
                          alive = std::weak_ptr<int>(alive_)] {
    if (!alive.expired()) emit_json(name, f);
  });
}

void EnergyMonitor::fail_later(const std::string& msg) {
  post_event("energy_error", fmt::format(R"({{"error":{}}})", detail::json_string(msg)));
  say_later(msg);
}

void EnergyMonitor::say_later(std::string line) {
  boost::asio::post(io_, [this, line = std::move(line), alive = std::weak_ptr<int>(alive_)] {
    if (!alive.expired()) say_(line);
  });
}

void EnergyMonitor::emit_json(const std::string& name, const std::string& fields_json) {
  // fields_json is one object; the event log puts its members after "event".
  events_.emit(name, supervisor::JsonObject::from_object(fields_json));
}

void EnergyMonitor::set_active(std::vector<int> active, int64_t generation) {
  std::sort(active.begin(), active.end());
  active.erase(std::unique(active.begin(), active.end()), active.end());
  if (active == window_active_) {
    if (generation >= 0) generation_ = generation;
    return;
  }
  const double t = clock_s();
  // A window that just opened (at the boundary whose decision made this change, or at start)
  // takes the new set; an older one is closed first, so no window mixes two sets.
  if (have_active_ && t - window_t0_ > kFreshWindowS)
    close_window(t, window_active_.empty() ? "pause" : "partial", generation_, -1, -1);
  have_active_ = true;  // the first set is charged from the job's start
  if (generation >= 0) generation_ = generation;
  std::lock_guard<std::mutex> lock(mu_);
  window_active_ = active;
  active_for_thread_ = active;
  active_known_ = true;
  // A measurement across a resize would mix two worlds: the profiler measures this limit again.
  if (profiler_ && !profiler_->done()) profiler_->interrupt();
}

void EnergyMonitor::restart(int attempt) {
  const double t = clock_s();
  if (t > window_t0_) close_window(t, "restart", generation_, -1, -1);
  tracker_.abandon_epoch();
  {
    std::lock_guard<std::mutex> lock(mu_);
    epoch_energy_j_.clear();
    attempt_start_s_ = t;  // the new attempt starts its workers again: a start-up of its own
    first_step_s_.reset();
  }
  in_startup_ = true;
  attempt_ = attempt;
}

void EnergyMonitor::end_startup() {
  if (!in_startup_) return;
  const std::optional<double> first = first_step_s();
  if (!first) return;
  in_startup_ = false;
  // Process start, CUDA, the model and the data up to the first step: spent (it counts in
  // the totals and the cost so far), but no epoch's, so the prediction never carries it.
  const double t = std::min(*first, clock_s());
  if (t > window_t0_) close_window(t, "startup", generation_, -1, -1);
  tracker_.abandon_epoch();
  std::lock_guard<std::mutex> lock(mu_);
  epoch_energy_j_.clear();
}

WindowRecord EnergyMonitor::close_window(double t_s, const std::string& kind, int64_t generation,
                                         int64_t epoch, int64_t step) {
  if (in_startup_ && kind != "startup" && kind != "restart") {
    end_startup();  // the sampling thread may not have seen the first step yet
    // A boundary with no step published (workers without step progress): epoch 0 keeps
    // its start-up, and no later step may take an epoch's windows for one.
    if (kind == "epoch" || kind == "steps") in_startup_ = false;
  }
  const double t1 = std::max(t_s, window_t0_);
  if (generation < 0) generation = generation_;  // not known to the caller: the last one
  WindowRecord rec;
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::map<int, const EnergySeries*> series;
    for (int slot : window_active_) series[slot] = &series_[slot];
    rec = account_window(kind, generation, epoch, step, window_t0_, t1, window_active_, series,
                         max_limit_w_, opt_.eta, limit_w_);
    for (const GpuWindow& g : rec.gpus) {
      epoch_energy_j_[g.slot] += g.energy_j;
      job_energy_j_[g.slot] += g.energy_j;
    }
    window_t0_ = t1;
  }
  generation_ = generation;
  tracker_.add_window(rec);
  emit_json("energy", rec.to_json_fields());
  return rec;
}

std::optional<std::string> EnergyMonitor::end_epoch(int64_t epoch, bool may_stop) {
  const EpochRecord rec = tracker_.end_epoch(epoch);
  if (may_stop) saw_boundary_ = true;
  {
    std::lock_guard<std::mutex> lock(mu_);
    epoch_energy_j_.clear();
  }
  std::string fields = rec.to_json_fields(
      opt_.threshold ? std::optional<double>(opt_.threshold->cost_j) : std::nullopt);
  fields.insert(fields.size() - 1, fmt::format(R"(, "attempt": {})", attempt_));
  emit_json("energy_epoch", fields);
  if (epoch_hook_) epoch_hook_(rec, may_stop);
  if (!opt_.threshold || stopped_early_ || !may_stop) return std::nullopt;
  std::optional<std::string> why = tracker_.stop_reason(*opt_.threshold);
  if (!why) return std::nullopt;
  stopped_early_ = true;
  emit_json(
      "early_stop",
      fmt::format(
          R"({{"epoch":{},"reason":{},"cost_total":{},"predicted_next_cost":{},"threshold":{}}})",
          epoch, detail::json_string(*why), detail::json_number(rec.cost_total),
          detail::json_number(rec.predicted_next_cost),
          detail::json_number(opt_.threshold->cost_j)));
  return why;
}

double EnergyMonitor::max_power_w(const std::vector<int>& slots) const {
  double w = 0;
  for (int slot : slots)
    if (auto it = max_limit_w_.find(slot); it != max_limit_w_.end()) w += it->second;
  return w;
}

void EnergyMonitor::arm_time_window() {
  window_timer_ = clock_.schedule_after(opt_.window, [this, alive = std::weak_ptr<int>(alive_)] {
    if (alive.expired() || finished_) return;
    // A window ends every `window` s unless a boundary ended it sooner.
    if (clock_s() - window_t0_ >= opt_.window.count() / 1000.0 - 1e-3)
      close_window(clock_s(), "time", generation_, -1, -1);
    arm_time_window();
  });
}

void EnergyMonitor::finish(int exit_code) {
  if (finished_) return;
  finished_ = true;
  window_timer_.cancel();
  // One last reading, so the last window ends on a measurement, not an extrapolation.
  {
    std::lock_guard<std::mutex> lock(stop_mu_);
    stop_ = true;
  }
  stop_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  sample_once(/*drive_profiler_too=*/false);
  std::string unfinished;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (profiler_ && !profiler_->done())
      unfinished = fmt::format(
          "the power-limit profile did not finish: the job ended after {} of {} limits "
          "measured; nothing is cached (the next run profiles again)",
          profiler_->rows().size(), profiler_->limits().size());
  }
  if (!unfinished.empty()) say_(unfinished);
  if (stopped_early_ && exit_code == 0) exit_code = kExitEarlyStop;
  if (opt_.threshold && !saw_boundary_)
    say_(
        "warning: early stop was not possible: the workers reported no epoch boundary (it "
        "needs the worker runtime)");
  const double t = clock_s();
  if (t - window_t0_ > 1e-3) close_window(t, saw_boundary_ ? "exit" : "time", generation_, -1, -1);
  const CostSummary s = tracker_.summary();
  std::string gpu_energy = "{";
  for (const auto& [slot, j] : s.gpu_energy_j)
    gpu_energy +=
        fmt::format("{}\"{}\":{}", gpu_energy.size() > 1 ? "," : "", slot, detail::json_number(j));
  gpu_energy += "}";
  const std::string fields = fmt::format(
      R"({{"seconds":{},"energy_j":{},"cost":{},"eta":{},"epochs":{},"gpu_energy_j":{},"stopped_early":{},"exit_code":{}}})",
      detail::json_number(s.seconds), detail::json_number(s.energy_j), detail::json_number(s.cost),
      detail::json_number(opt_.eta), s.epochs, gpu_energy, stopped_early_ ? "true" : "false",
      exit_code);
  emit_json("energy_summary", fields);
  if (!opt_.summary_path.empty()) {
    std::string epochs = "[";
    for (const EpochRecord& e : tracker_.epochs())
      epochs += (epochs.size() > 1 ? "," : "") +
                e.to_json_fields(opt_.threshold ? std::optional<double>(opt_.threshold->cost_j)
                                                : std::nullopt);
    epochs += "]";
    std::string gpus = "[";
    for (const MonitoredGpu& g : gpus_)
      gpus += fmt::format(R"({}{{"slot":{},"uuid":{},"name":{}}})", gpus.size() > 1 ? "," : "",
                          g.slot, detail::json_string(g.uuid), detail::json_string(g.name));
    gpus += "]";
    const std::string text =
        fmt::format(R"({{"summary":{},"gpus":{},"epochs":{}}})", fields, gpus, epochs) + "\n";
    const std::string tmp = opt_.summary_path + ".tmp";
    std::string failed;  // the step that failed, with its errno text
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
      failed = fmt::format("creating {}: {}", tmp, std::strerror(errno));
    } else {
      if (::write(fd, text.data(), text.size()) != static_cast<ssize_t>(text.size()))
        failed = fmt::format("writing {}: {}", tmp, std::strerror(errno));
      ::close(fd);
      if (failed.empty() && ::rename(tmp.c_str(), opt_.summary_path.c_str()) != 0)
        failed = fmt::format("renaming {} to it: {}", tmp, std::strerror(errno));
      if (!failed.empty()) ::unlink(tmp.c_str());
    }
    if (!failed.empty())
      say_(fmt::format("warning: cannot write the energy summary {} ({})", opt_.summary_path,
                       failed));
  }
  if (!opt_.history.empty()) {
    HistoryEntry h;
    h.job = opt_.job;
    h.cost = s.cost;
    h.energy_j = s.energy_j;
    h.seconds = s.seconds;
    h.epochs = s.epochs;
    h.completed = !stopped_early_ && exit_code == 0;
    try {
      append_history(opt_.history, h);
    } catch (const Error& e) {
      say_(fmt::format("warning: {}", e.what()));
    }
  }
}

std::optional<std::map<int, double>> EnergyMonitor::counters_at(double t_s) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::map<int, double> out;
  for (const auto& [slot, series] : series_) {
    if (series.empty()) continue;  // never read: it has no counter to give
    if (series.last_t() < t_s) return std::nullopt;
    out[slot] = series.energy_at(t_s);
  }
  return out;
}

std::map<int, SlotEnergy> EnergyMonitor::status() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::map<int, SlotEnergy> out;
  const double t = clock_s();
  for (const MonitoredGpu& g : gpus_) {
    SlotEnergy& e = out[g.slot];
    auto p = last_power_w_.find(g.slot);
    e.power_w = p != last_power_w_.end() ? p->second : 0;
    auto it = epoch_energy_j_.find(g.slot);
    e.epoch_energy_j = it != epoch_energy_j_.end() ? it->second : 0;
    auto total = job_energy_j_.find(g.slot);
    e.job_energy_j = total != job_energy_j_.end() ? total->second : 0;
    const bool charged =
        std::find(window_active_.begin(), window_active_.end(), g.slot) != window_active_.end();
    auto s = series_.find(g.slot);
    if (charged && s != series_.end() && !s->second.empty()) {
      e.epoch_energy_j += s->second.energy_between(window_t0_, t);
      e.job_energy_j += s->second.energy_so_far(window_t0_, t);  // a counter: never goes down
    }
    e.power_limit_w = limit_w_;
  }
  return out;
}

}  // namespace gpurun::energy
