// `gpurun status`: the supervisor's <run_dir>/status.json, the registry of
// running supervisors, and the command that reads them.
// Reference: docs/control-protocol.md#gpurun-status.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <boost/asio/io_context.hpp>

#include "control/scheduler.hpp"
#include "gpurun/clock.hpp"
#include "gpurun/regular_file.hpp"

namespace gpurun::control {

/// A slot's energy columns (docs/energy.md#status), from the supervisor's energy monitor.
struct SlotEnergyStatus {
  double power_w = 0;                     ///< last reading, W
  double epoch_energy_j = 0;              ///< charged energy since the current epoch began, J
  double job_energy_j = 0;                ///< charged energy since the job began (every window), J
  std::optional<unsigned> power_limit_w;  ///< a limit gpurun set, W; nullopt: unchanged
};

/// The run's energy (docs/energy.md#status).
struct EnergyStatus {
  std::map<int, SlotEnergyStatus> slots;
  int64_t epochs = 0;                 ///< finished epochs
  double cost_total_j = 0;            ///< Zeus cost of the finished epochs, J
  std::optional<double> threshold_j;  ///< early-stop threshold, J
  double predicted_next_cost_j = 0;   ///< Zeus cost the next epoch is predicted to have, J
  bool stopped_early = false;         ///< the monitor stopped the job by its cost threshold
};

/// Facts about the run that the scheduler does not hold.
struct StatusSnapshot {
  std::string run_id;
  std::string run_dir;
  std::string config_path;  ///< empty: a plain run (no --config)
  int supervisor_pid = 0;
  std::vector<std::string> physical_gpus;  ///< per slot; empty with --device cpu
  /// Energy columns and totals; empty function = no energy monitor (fields absent).
  std::function<EnergyStatus()> energy;
  /// The last `resize` event's fields (JSON object text, docs/control-protocol.md#resize-
  /// timings); empty: none yet (status.json says null).
  std::string last_resize;
  /// The "policy" object's text (docs/sharing.md#status): the declared set, leases, and what
  /// they leave out; empty: none (plain runs).
  std::string policy;
  /// Several nodes (node 0): the "nodes" array's text (NodeHub::status_json: node, host, pid,
  /// state, slots, offer); empty: one node (absent).
  std::string nodes;
};

/// One slot as status.json shows it.
struct SlotStatus {
  int gpu = 0;
  SlotState state = SlotState::kStarting;
  int64_t generation = -1;
  int rank = -1;
  int pid = -1;                                              ///< -1: no process
  std::optional<std::pair<int64_t, int64_t>> last_boundary;  ///< (epoch, step)
  std::string reason;
};

/// What the next boundary would decide now (Scheduler::would_decide()), as status.json's
/// "would_decide" object shows it (docs/control-protocol.md#gpurun-status).
struct WouldDecideStatus {
  std::string kind;                  ///< "continue", "snapshot", "resize", or "state_lost"
  std::vector<int> active;           ///< the set trained on after it (the set that pauses: empty)
  std::vector<int> joiners;          ///< slots that join (resize)
  std::vector<int> leavers;          ///< slots that leave (resize)
  std::vector<int> failed;           ///< members that failed
  std::vector<std::string> reasons;  ///< the console's reasons (warm joiner not ready, min_gpus)
  /// One line: "continue with [0, 1]", "pause (gpu 0 writes the pause snapshot first)",
  /// "resize to [0, 1, 2]: [2] joins (warm joiner ready)", "the training state is lost: ...".
  std::string summary;
};

/// `outcome` as status.json shows it; `slots` tells how each joiner comes in.
WouldDecideStatus would_decide_status(const DecisionOutcome& outcome,
                                      const std::map<int, SlotInfo>& slots);

/// What status.json says about the job, elastic or plain.
struct RunStatus {
  bool elastic = false;
  int64_t generation = 0;
  std::optional<int64_t> round;  ///< nullopt for a plain run
  std::vector<int> current_active;
  std::vector<int> desired_active;
  std::optional<ParkMode> park_mode;  ///< nullopt for a plain run
  std::string last_config_error;      ///< empty: none
  std::string pause_refused;          ///< why the wanted pause is refused; empty: none
  std::string state_lost;             ///< set when the training state is lost; empty: none
  std::string last_decision;          ///< JSON object text; empty: none
  /// The open boundary round past its deadline, waiting for running ranks; nullopt: none.
  std::optional<BoundaryWait> late;
  /// What the next boundary would decide now; nullopt: none can be computed (a plain run, no
  /// generation yet, paused, finished or stopping).
  std::optional<WouldDecideStatus> would_decide;
  std::vector<SlotStatus> slots;
};

/// The status of an elastic run, from its scheduler.
RunStatus run_status(const Scheduler& scheduler);

/// status.json text (one JSON object, documented in docs/control-protocol.md).
std::string render_status(const RunStatus& status, const StatusSnapshot& snapshot);
std::string render_status(const Scheduler& scheduler, const StatusSnapshot& snapshot);

/// Writes `<dir>/status.json` atomically (temp file in `dir`, then rename). Returns false
/// and sets `error` (a sentence naming the path) on failure. `written` (optional) gets the
/// identity of the file put in place. Blocks on file I/O.
bool write_status_file(const std::string& dir, const std::string& json, std::string& error,
                       FileIdentity* written = nullptr);

/// Coalesces status.json writes: publish() marks the status dirty and the file is
/// rewritten at most once per `min_interval` (and at once when the last write is
/// older), so a launch of N workers costs O(N) renders, not one full render per
/// spawn and exit. While io runs, the last state is always written (by the timer,
/// or by flush()); the destructor drops a pending write (the run is over). Runs on
/// io's thread; file I/O happens in publish() only when no write was due.
class StatusWriter {
 public:
  using Render = std::function<std::string()>;
  /// The default shortest time between two writes.
  static constexpr std::chrono::milliseconds kMinInterval{100};
  /// `render` returns the status.json text; `on_error` gets a sentence on a failed write,
  /// and once when status.json is found changed or replaced since the last write (another
  /// writer in the run directory, or a hand edit): gpurun goes on writing its status there.
  /// `clock` times the interval and runs the delayed write (on io's thread; tests pass a
  /// gpurun::FakeClock); it must outlive the writer. nullptr: a supervisor::AsioClock on io.
  StatusWriter(boost::asio::io_context& io, std::string dir, Render render,
               std::function<void(const std::string&)> on_error,
               std::chrono::milliseconds min_interval = kMinInterval,
               gpurun::Clock* clock = nullptr);
  ~StatusWriter();
  StatusWriter(const StatusWriter&) = delete;
  StatusWriter& operator=(const StatusWriter&) = delete;

  void publish();
  /// Writes now if anything is pending.
  void flush();

 private:
  void write_now();

  std::unique_ptr<gpurun::Clock> own_clock_;  // when no clock was given
  gpurun::Clock& clock_;
  gpurun::Clock::Timer timer_;
  std::string dir_;
  Render render_;
  std::function<void(const std::string&)> on_error_;
  std::chrono::milliseconds min_interval_;
  gpurun::Clock::TimePoint last_write_{};
  std::optional<FileIdentity> written_;  ///< the file the last write put in place
  bool crossed_said_ = false;
  bool dirty_ = false;
  bool armed_ = false;
  std::shared_ptr<int> alive_ = std::make_shared<int>(0);
};

/// When process `pid` started: clock ticks since boot (/proc/<pid>/stat field 22), "" if
/// unknown. With the pid it names one process for good: a reused pid has another.
std::string process_start_time(int pid);

/// The directory where running supervisors register: $XDG_RUNTIME_DIR/gpurun, else
/// /tmp/gpurun-<uid>.
std::string registry_dir();

/// RAII registration `<registry_dir>/<run_id>.<pid>` holding the run directory; removed
/// by the destructor. A failure to register is reported in `error()`, never thrown.
class RunRegistration {
 public:
  RunRegistration(const std::string& run_id, const std::string& run_dir);
  ~RunRegistration();
  RunRegistration(const RunRegistration&) = delete;
  RunRegistration& operator=(const RunRegistration&) = delete;
  const std::string& error() const { return error_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::string error_;
};

}  // namespace gpurun::control
