// gpurun::energy::EnergyMonitor — the supervisor's GPU energy monitor (the Zeus multi-GPU
// design with gpurun's supervisor as the master process): one sampling thread reads every
// job GPU's NVML energy counter and power each period; the io thread turns boundaries into
// windows, epochs, Zeus' cost and the early-stop decision; power limits (fixed, or Zeus'
// just-in-time profile) are set by this object only and restored through a PowerGuard.
// docs/energy.md.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio/io_context.hpp>

#include "energy/cost.hpp"
#include "energy/early_stop.hpp"
#include "energy/energy_series.hpp"
#include "energy/gpu_map.hpp"
#include "energy/nvml.hpp"
#include "energy/power_guard.hpp"
#include "energy/power_profiler.hpp"
#include "gpurun/clock.hpp"
#include "gpurun/control/progress.hpp"
#include "supervisor/event_log.hpp"

namespace gpurun::energy {

/// Everything the monitor is told at start (docs/energy.md has the matching [energy] keys).
struct MonitorOptions {
  std::chrono::milliseconds period{100};  ///< sampling period per GPU
  /// A window also ends every `window` unless a boundary ended it sooner (kind "time"): the
  /// only windows of workers that report no boundaries.
  std::chrono::milliseconds window{std::chrono::seconds(60)};
  double eta = 0.5;                        ///< Zeus' η
  std::optional<CostThreshold> threshold;  ///< early stop; nullopt = none
  std::string history;                     ///< history file to append to at exit ("" = none)
  std::string job;                         ///< key in history and the power-limit cache
  std::optional<unsigned> fixed_limit_w;   ///< [energy] power_limit_watts = N
  bool auto_limit = false;                 ///< power_limit_watts = "auto"
  /// [energy] locked_clocks_mhz: every job GPU's clock locked in [first, second] MHz.
  std::optional<std::pair<unsigned, unsigned>> locked_clocks_mhz;
  int64_t warmup_steps = 10, measure_steps = 40;  ///< per profiled limit
  /// [energy] profile_cooldown_s / profile_settle_s (ProfilerOptions::cooldown_max_s,
  /// settle_window_s), s.
  double cooldown_max_s = 60, settle_window_s = 5;
  std::string profile_cache;                 ///< "" = no cache
  std::string program;                       ///< the worker executable (cache key)
  std::string summary_path;                  ///< --energy-summary FILE ("" = none)
  std::string guard_exe = "/proc/self/exe";  ///< the binary run as `__power-guard`
  double start_s = 0;  ///< Unix s the first window starts at (the job's start); 0 = now
  /// The time of samples and windows (wall_now) and the `window` timer (run on the io
  /// thread); tests pass a FakeClock. The sampling thread's pace stays real time. Must outlive
  /// the monitor. nullptr: a supervisor::AsioClock on the monitor's io_context.
  gpurun::Clock* clock = nullptr;
};

/// What `gpurun status` shows per slot.
struct SlotEnergy {
  double power_w = 0;         ///< last reading, W
  double epoch_energy_j = 0;  ///< since the current epoch began (charged time only), J
  double job_energy_j = 0;    ///< since the job began (charged time only: every window), J
  std::optional<unsigned> power_limit_w;
};

/// Life: construct on the io thread after the GPUs are mapped; every public method runs on
/// the io thread except status(), which any thread may call. Events go to `events` on the io
/// thread; `say` prints a "gpurun: energy: …" line. The destructor stops the sampling thread
/// and restores every power limit it changed (the guard covers a kill -9).
class EnergyMonitor {
 public:
  EnergyMonitor(boost::asio::io_context& io, supervisor::EventLog& events,
                std::function<void(const std::string&)> say, std::unique_ptr<Nvml> nvml,
                std::vector<MonitoredGpu> gpus, MonitorOptions options,
                const control::ProgressFile* progress);
  ~EnergyMonitor();
  EnergyMonitor(const EnergyMonitor&) = delete;
  EnergyMonitor& operator=(const EnergyMonitor&) = delete;

  /// The GPUs charged from now on change to `active` (slots; [] while paused) in `generation`
  /// (-1: unchanged). The open window is closed first when it has charged any time (kind
  /// "partial", or "pause" when it had no GPU), so windows never straddle two active sets.
  void set_active(std::vector<int> active, int64_t generation = -1);
  /// A whole-set restart begins: the open window ends as kind "restart"; its time and energy
  /// count in the totals (and the cost so far) but in no epoch, since the new attempt trains
  /// its epochs again.
  void restart(int attempt);
  /// Closes the open window at Unix time `t_s` as `kind` ("epoch" | "steps" | "time" |
  /// "exit") ending at boundary (generation, epoch, step), emits its `energy` event, adds it to
  /// the current epoch and opens the next window at t_s with the same active set. While the
  /// attempt is still in its start-up and a step was published, the start-up is first ended
  /// as a window of kind "startup" at that step (in the totals, in no epoch).
  WindowRecord close_window(double t_s, const std::string& kind, int64_t generation, int64_t epoch,
                            int64_t step);
  /// Ends epoch `epoch` (after close_window of its last window): `energy_epoch` event, and —
  /// when `may_stop` (a boundary the job can still stop at) — the early-stop check. Returns the
  /// reason (also an `early_stop` event) when the job must stop.
  std::optional<std::string> end_epoch(int64_t epoch, bool may_stop = true);
  /// Stops sampling after one last reading, closes what is open, emits `energy_summary`,
  /// writes --energy-summary, appends to the history (completed = !stopped_early && exit code
  /// 0). `exit_code` is the supervisor's; an early stop reports gpurun's 3. Idempotent.
  void finish(int exit_code);
  /// gpurun's exit status for an early stop (docs/cli.md#exit-status).
  static constexpr int kExitEarlyStop = 3;
  bool stopped_early() const { return stopped_early_; }

  /// Finished epochs, their Zeus cost (J) and the threshold (J), for `gpurun status`. Io thread.
  int64_t epochs_finished() const { return static_cast<int64_t>(tracker_.epochs().size()); }
  double cost_total_j() const { return tracker_.cost_total(); }
  std::optional<double> threshold_j() const {
    return opt_.threshold ? std::optional<double>(opt_.threshold->cost_j) : std::nullopt;
  }
  /// Zeus cost the next epoch is predicted to have, J (CostTracker). Io thread.
  double predicted_next_cost_j() const { return tracker_.predicted_next_cost(); }
  /// Per slot, for `gpurun status`. Thread-safe.
  std::map<int, SlotEnergy> status() const;
  /// Each GPU's continuous energy counter at Unix time t_s (J; only differences mean
  /// anything), interpolated between readings; nullopt while a GPU that has readings has none
  /// at or after t_s yet. The program's energy windows (energy_answers.hpp). Thread-safe.
  std::optional<std::map<int, double>> counters_at(double t_s) const;
  /// The slots charged now, ascending. Io thread.
  const std::vector<int>& active_slots() const { return window_active_; }
  /// The finished epochs' records (the `energy_epoch` events). Io thread.
  const std::vector<EpochRecord>& epoch_records() const { return tracker_.epochs(); }
  const std::vector<MonitoredGpu>& gpus() const { return gpus_; }
  /// Samples taken so far over all GPUs (tests, the benchmark).
  uint64_t samples() const { return samples_.load(); }

  /// Every job GPU's compute processes, about once a second, handed to `hook` on the io thread
  /// (slot -> processes; a GPU whose list cannot be read is left out, said once). For
  /// `[policy] yield_to_foreign` (docs/sharing.md#yield). Empty: none listed. Io thread.
  using ProcessHook = std::function<void(std::map<int, std::vector<Nvml::Process>>)>;
  void set_process_hook(ProcessHook hook);
  /// Every finished epoch's record, as end_epoch() emits it (before its early-stop check),
  /// with end_epoch's `may_stop` (false: training is over). `[energy] scale = "auto"`. Io thread.
  using EpochHook = std::function<void(const EpochRecord&, bool may_stop)>;
  void set_epoch_hook(EpochHook hook) { epoch_hook_ = std::move(hook); }
  /// Σ of the maximum power limits of `slots`, W (slots without a GPU count 0).
  double max_power_w(const std::vector<int>& slots) const;
  /// The power-limit profile (`power_limit_watts = "auto"`) is still measuring: epochs now
  /// ran under changing limits. Any thread.
  bool profiling() const;

  /// Current Unix time in seconds (CLOCK_REALTIME), the clock of samples and windows unless
  /// MonitorOptions::clock says otherwise.
  static double now_s();

 private:
  void run();                                               // the sampling thread
  double clock_s() const { return clock_.unix_seconds(); }  // Unix s by clock_; any thread
  void sample_once(bool drive_profiler_too = true);
  void report_read_failure(const MonitoredGpu& g, const std::string& what, const std::string& error,
                           const std::string& then);
  void drive_profiler(double t);
  // The hottest of the active slots' GPUs, °C; nullopt when none can be read.
  std::optional<double> hottest_c(const std::vector<int>& active);
  bool ensure_guard();  // starts the PowerGuard once; false (said) when it cannot start
  void apply_limit(unsigned watts, const std::string& source);  // sampling thread or ctor
  void lock_clocks(unsigned min_mhz, unsigned max_mhz);         // ctor
  /// Returns the UUIDs whose limit and clocks are all back (nothing failed).
  std::vector<std::string> restore_limits(bool from_destructor = false);
  /// Puts g's original limit back and resets its locked clocks (the guard forgets it, which
  /// frees its lock). True when nothing failed.
  bool restore_gpu(const MonitoredGpu& g, bool from_destructor);
  /// Whether the limits and clocks apply to g: its slot is in the job (limits_on_).
  bool limits_apply(const MonitoredGpu& g) const;
  /// The job's set changed: a GPU that left gets its original limit and clocks back (a lent,
  /// yielded or given-back GPU is not left capped), one that came back gets the limit and
  /// clocks in force. Sampling thread.
  void follow_active();
  void check_guard();     // sampling thread, about once a second
  void list_processes();  // sampling thread, about once a second
  void post_event(std::string name, std::string fields_json);
  /// say_(line) on the io thread (from the sampling thread), unless the monitor is gone.
  void say_later(std::string line);
  /// An "energy_error" event with `msg` and msg said (say_later): a limit the monitor cannot
  /// set or keep.
  void fail_later(const std::string& msg);
  void emit_json(const std::string& name, const std::string& fields_json);
  void arm_time_window();
  std::optional<unsigned> limit_in_force() const;
  /// When the first rank of this attempt ended its first optimizer step (the progress file),
  /// Unix s; nullopt before that or without progress. Any thread.
  std::optional<double> first_step_s();
  /// The workers started training: the open window (and whatever the open epoch holds) is
  /// the start-up, ended as kind "startup" at the first step. Io thread; once per attempt.
  void end_startup();

  boost::asio::io_context& io_;
  supervisor::EventLog& events_;
  std::function<void(const std::string&)> say_;
  std::unique_ptr<Nvml> nvml_;
  std::vector<MonitoredGpu> gpus_;
  MonitorOptions opt_;
  const control::ProgressFile* progress_;
  std::unique_ptr<gpurun::Clock> own_clock_;  // when opt_.clock is nullptr
  gpurun::Clock& clock_;

  mutable std::mutex mu_;  // series_, last_power_, active_for_thread_, limit_w_, profiler_
  std::map<int, EnergySeries> series_;
  std::map<int, double> last_power_w_;
  std::vector<int> active_for_thread_;
  std::optional<unsigned> limit_w_;  // the limit gpurun set on every job GPU
  std::unique_ptr<PowerProfiler> profiler_;
  bool limits_denied_ = false;
  std::map<std::string, unsigned> originals_mw_;  // uuid -> original limit we changed
  std::set<std::string> clocks_locked_;           // uuids whose clocks we locked
  bool active_known_ = false;                     // under mu_: set_active() was called
  // Ctor, then the sampling thread: the slots the limits apply to (nullopt: every GPU, before
  // the first set), the last limit asked (W) and the clocks asked (MHz).
  std::optional<std::vector<int>> limits_on_;
  std::optional<unsigned> requested_w_;
  std::optional<std::pair<unsigned, unsigned>> clocks_mhz_;
  std::unique_ptr<PowerGuard> guard_;
  ProcessHook process_hook_;  // under mu_

  // io thread only
  double window_t0_ = 0;
  std::vector<int> window_active_;
  bool have_active_ = false;  // set_active() was called (the first set opens the job's window)
  bool in_startup_ = true;    // no step trained yet in this attempt (docs/energy.md#windows)
  int64_t attempt_ = 0;
  bool saw_boundary_ = false;  // a boundary closed a window (early stop was possible)
  int64_t generation_ = 0;
  CostTracker tracker_;
  std::map<int, double> epoch_energy_j_;  // mirrored into status under mu_
  std::map<int, double> job_energy_j_;    // every closed window's, per slot; under mu_
  bool stopped_early_ = false;
  bool finished_ = false;
  std::map<int, double> max_limit_w_;
  EpochHook epoch_hook_;
  gpurun::Clock::Timer window_timer_;
  std::shared_ptr<int> alive_ = std::make_shared<int>(0);

  // Sampling thread: (slot, reading) whose failures were reported; each GPU's last power
  // reading and, when its energy counter cannot be read, the power integral standing in.
  std::set<std::pair<int, std::string>> read_failed_;
  struct Reading {
    bool counter_failed = false;
    double integrated_j = 0, last_power_w = 0, last_t = 0;
  };
  std::map<int, Reading> readings_;
  // When this attempt began (Unix s): progress older than it is a previous attempt's. And
  // the first step seen in it, once seen. Both under mu_.
  double attempt_start_s_ = 0;
  std::optional<double> first_step_s_;
  std::atomic<uint64_t> samples_{0};
  std::mutex stop_mu_;
  std::condition_variable stop_cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace gpurun::energy
