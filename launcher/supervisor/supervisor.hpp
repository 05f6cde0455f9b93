// gpurun::supervisor::Supervisor — runs one node's worker set: spawn, fan-in
// of output, teardown on the first failure, whole-set restarts, exit status.
#pragma once

#include <chrono>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>

#include "gpurun/unique_fd.hpp"
#include "supervisor/console.hpp"
#include "supervisor/event_log.hpp"
#include "supervisor/line_splitter.hpp"
#include "supervisor/process_spawner.hpp"
#include "supervisor/slot_controller.hpp"
#include "supervisor/worker_env.hpp"

namespace gpurun::supervisor {

/// Everything the supervisor needs; defaults match the CLI's.
struct SupervisorOptions {
  JobPlan plan;                   ///< slots, ranks, store endpoint, run dir
  std::vector<std::string> argv;  ///< worker command; argv[0] is the resolved executable
  std::string display_name;       ///< command name used in the failure summary
  EnvMap inherited;               ///< environment the workers inherit
  std::chrono::milliseconds grace_period{30'000};  ///< SIGTERM -> SIGKILL
  bool keep_logs = false;  ///< --log-dir given: write stdout/stderr files for every rank
  StdSpec redirects;       ///< streams kept off the console (files only)
  StdSpec tee;             ///< streams written to files and console
  std::optional<std::set<int>> ranks_filter;  ///< console shows only these ranks
  std::string prefix_template = "[rank${rank}]: ";
  std::size_t stderr_tail_lines = 10;              ///< lines quoted in the failure summary
  std::chrono::milliseconds drain_timeout{1'000};  ///< wait for pipes after the processes died
  std::chrono::milliseconds kill_timeout{2'000};   ///< wait for groups after SIGKILL
  std::chrono::milliseconds poll_interval{50};     ///< process-group liveness polling
  /// Workers spawned per io_context turn: between batches signals and early exits are
  /// handled, so a SIGINT during a large launch stops spawning within one batch.
  std::size_t spawn_batch = 32;
};

/// Expands ${rank}, ${local_rank} and ${role_name} in a console prefix template.
std::string expand_prefix(const std::string& tmpl, int rank, int local_rank);

/// Runs on one io_context thread; every public method must be called there.
/// Life of an attempt: spawn all slots -> run -> on the first failure (non-zero
/// exit or signal) SIGTERM every worker group, SIGKILL after grace_period ->
/// wait for every group to be empty and pipes to drain -> restart (at most
/// plan.max_restarts times, not after a shutdown signal) or finish.
/// Exit status: 0 if every worker of the last attempt succeeded, else the
/// first failure's shell code (128+signal for a signal), else 128+signal when
/// gpurun was asked to stop by SIGINT/SIGTERM, 1 when a worker could not start.
class Supervisor {
 public:
  Supervisor(boost::asio::io_context& io, SupervisorOptions options, ProcessSpawner& spawner,
             Console& console, EventLog& events);
  ~Supervisor();
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;

  /// Called before attempt n (n >= 1) starts, e.g. to reset the store's keyspace.
  /// An exception here ends the job with the failure that caused the restart.
  std::function<void(int attempt)> on_restart;
  /// Called once when the job has finished, with the exit status.
  std::function<void(int exit_code)> on_done;
  /// Called once just before the job finishes, with the exit status and its reason; may
  /// return a replacement for both (e.g. the energy monitor's early stop: status 3), which the
  /// `shutdown` event, on_done and exit_code() then carry.
  std::function<std::optional<std::pair<int, std::string>>(int exit_code)> final_status;

  /// Spawns attempt 0.
  void start();

  /// Elastic mode: `controller` (outliving the supervisor's run) decides which slots start
  /// and how their exits count. Call before start().
  void set_controller(SlotController* controller) { controller_ = controller; }
  /// Elastic mode: starts a process for slot `local_rank` (which must have none) with the
  /// plan's environment plus `overlay`. Returns its pid, or -1 when it could not start
  /// (reported later as an exit with code 1, on a fresh stack).
  int spawn_slot(int local_rank, const EnvMap& overlay);
  /// Sends SIGKILL to the process group of slot `local_rank` (no-op without a process).
  void kill_slot(int local_rank);

  /// Reacts to a signal gpurun received: SIGINT/SIGTERM/SIGQUIT start a shutdown (the
  /// signal is forwarded to every worker group, SIGKILL after the grace period;
  /// a second one sends SIGKILL at once; exit status 128 + the signal), like torchrun's
  /// agent; while paused (elastic, no member) it also says that the pause snapshot is
  /// deleted. SIGUSR1/SIGUSR2 are forwarded; SIGHUP reloads the config (elastic) or is
  /// only logged.
  void handle_signal(int sig);

  bool done() const { return exit_code_.has_value(); }
  int exit_code() const { return exit_code_.value_or(-1); }
  int attempt() const { return attempt_; }
  /// Pids of the current attempt's workers (-1 for a slot that failed to start).
  std::vector<int> worker_pids() const;

 private:
  struct Stream;
  struct Worker;
  struct Failure;
  enum class Phase { kRunning, kStopping, kDraining, kDone };

  void start_attempt();
  void spawn_from(std::size_t first);
  // Spawns `w` with its rank's environment plus `overlay`; sets proc and pid and logs
  // worker_started. Throws gpurun::Error when the process cannot start.
  void launch(Worker& w, const EnvMap& overlay);
  void open_logs(Worker& w, bool append);
  static Stream& stream(Worker& w, StreamId id);
  void on_output(Worker& w, StreamId stream, std::string_view bytes);
  void on_piece(Worker& w, StreamId stream, std::string_view text, Piece piece);
  void on_stream_closed(Worker& w, StreamId stream);
  // Writes `bytes` to the stream's log file; on a failure warns once, closes the file and
  // returns how many bytes it took (the caller sends the rest to the console).
  size_t write_log(Worker& w, StreamId stream, std::string_view bytes);
  void on_exit(Worker& w, ExitStatus status);
  void record_failure(Worker& w, ExitStatus status, std::string reason);
  void stop_workers(int sig);
  void signal_all(int sig);
  void check_progress();
  void arm_poll();
  void finish_attempt();
  void print_summary();
  void finish(int code, const std::string& reason);
  void say(const std::string& line);  // "gpurun: ..." on the console's stderr
  void say_paused_snapshot();         // a shutdown signal while paused: the snapshot's fate

  boost::asio::io_context& io_;
  SupervisorOptions opt_;
  ProcessSpawner& spawner_;
  Console& console_;
  EventLog& events_;

  std::vector<std::unique_ptr<Worker>> workers_;
  std::vector<std::unique_ptr<Worker>> retired_;  // earlier processes of respawned slots
  SlotController* controller_ = nullptr;
  std::unique_ptr<Failure> absorbed_failure_;  // first failure elastic mode absorbed
  std::unique_ptr<Failure> failure_;
  Phase phase_ = Phase::kRunning;
  int attempt_ = 0;
  int shutdown_signal_ = 0;  // SIGINT/SIGTERM/SIGQUIT received
  bool grace_armed_ = false;
  bool killed_ = false;
  bool drain_expired_ = false;
  bool kill_expired_ = false;
  bool poll_armed_ = false;
  std::optional<int> exit_code_;
  boost::asio::steady_timer grace_timer_;
  boost::asio::steady_timer kill_timer_;
  boost::asio::steady_timer poll_timer_;
  boost::asio::steady_timer drain_timer_;
  std::shared_ptr<int> alive_ = std::make_shared<int>(0);  // handlers check it via weak_ptr
};

}  // namespace gpurun::supervisor
