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
#include <string_view>
#include <utility>
#include <vector>

#include <signal.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>

#include "gpurun/unique_fd.hpp"
#include "supervisor/console.hpp"
#include "supervisor/event_log.hpp"
#include "supervisor/line_splitter.hpp"
#include "supervisor/process_spawner.hpp"
#include "supervisor/root_cause.hpp"
#include "supervisor/slot_controller.hpp"
#include "supervisor/worker_env.hpp"

namespace gpurun::supervisor {

/// Everything the supervisor needs; defaults match the CLI's.
struct SupervisorOptions {
  JobPlan plan;                   ///< slots, ranks, store endpoint, run dir
  std::vector<std::string> argv;  ///< worker command; argv[0] is the resolved executable
  /// Each worker's command gets "<this>=<its LOCAL_RANK>" (torch.distributed.launch's
  /// --local-rank / --local_rank, Options::local_rank_argument) at argv index
  /// `local_rank_argument_at`: right after the script or module, before the script's own
  /// arguments, as torch's launcher put it. Empty: no argument.
  std::string local_rank_argument;
  std::size_t local_rank_argument_at = 0;
  std::string display_name;                        ///< command name used in the failure summary
  EnvMap inherited;                                ///< environment the workers inherit
  std::chrono::milliseconds grace_period{30'000};  ///< SIGTERM -> SIGKILL
  bool keep_logs = false;  ///< --log-dir given: write stdout/stderr files for every rank
  StdSpec redirects;       ///< streams kept off the console (files only)
  StdSpec tee;             ///< streams written to files and console
  std::optional<std::set<int>> ranks_filter;        ///< console shows only these ranks
  std::optional<std::set<int>> local_ranks_filter;  ///< ... and only these local ranks
  std::string prefix_template = "[rank${rank}]: ";
  std::size_t stderr_tail_lines = 10;              ///< lines quoted in the failure summary
  std::chrono::milliseconds drain_timeout{1'000};  ///< wait for pipes after the processes died
  std::chrono::milliseconds kill_timeout{2'000};   ///< wait for groups after SIGKILL
  std::chrono::milliseconds poll_interval{50};     ///< process-group liveness polling
  /// Workers spawned per io_context turn: between batches signals and early exits are
  /// handled, so a SIGINT during a large launch stops spawning within one batch.
  std::size_t spawn_batch = 32;
  // --- preemption (docs/cli.md#preemption) ---------------------------------
  /// The warning signal turned into a checkpoint request (0: none; then SIGUSR1/SIGUSR2 are
  /// only forwarded).
  int preempt_signal = SIGUSR2;
  /// After SIGTERM: how long workers that use the runtime may take to stop at their next
  /// boundary before SIGTERM is forwarded to them (0: forward at once, as before).
  std::chrono::milliseconds stop_timeout{30'000};
  /// --requeue: the preempt signal also stops the job at the workers' next boundary.
  bool stop_on_preempt = false;
  /// The memory cgroup files whose oom_kill count tells an OOM kill from another SIGKILL
  /// (root_cause.hpp). nullopt: gpurun's own cgroup's and each worker's (/proc/<pid>/cgroup);
  /// a test names fake files.
  std::optional<std::vector<std::string>> memory_event_files;
  /// When an attempt's first failure is a connection or teardown error (is_teardown_error:
  /// its error file's last line, else its stderr's), how long the other workers may go on
  /// before the SIGTERM, so that the rank that really failed (it tore its group down first)
  /// can raise and write its error file (docs/errors.md, "The root cause"). It ends early when
  /// another worker fails of something else (exits, or writes such an error file), every other
  /// worker has ended, a peer node failed, or gpurun gets a stop signal. 0: no hold.
  std::chrono::milliseconds teardown_hold{kRootCauseWindow};
};

/// Expands ${rank}, ${local_rank} and ${role_name} (`role`, --role) in a console prefix template.
std::string expand_prefix(const std::string& tmpl, int rank, int local_rank,
                          const std::string& role = "default");
/// Elastic mode: the console prefix of slot `slot` whose rank in the generation in force is
/// `rank` (-1: the slot is in none: parked, a standby, a warm joiner not admitted yet, a
/// leaver's last lines). A member's ${rank} and ${local_rank} are its generation rank (its
/// RANK and LOCAL_RANK), and ${rank} adds the slot where the two differ: "[rank${rank}]: "
/// gives "[rank0]: " for slot 0 and "[rank0 gpu1]: " for slot 1 after active_gpus = [1]. A
/// slot outside the generation shows the slot instead: "rank${rank}", ${rank} and
/// ${local_rank} all become "gpu<slot>" ("[gpu1]: "). "gpu" is the slot's word in gpurun's
/// lines and `gpurun status`, with --device cpu too.
std::string expand_elastic_prefix(const std::string& tmpl, int slot, int rank,
                                  const std::string& role = "default");
/// Terminal columns `text` takes: one per UTF-8 character (`[rank0]: ` = 9).
int display_columns(std::string_view text);

/// Runs on one io_context thread; every public method must be called there.
/// Life of an attempt: spawn all slots -> run -> on the first failure (non-zero
/// exit or signal; a teardown error: after the teardown hold, SupervisorOptions::teardown_hold)
/// SIGTERM every worker group, SIGKILL after grace_period ->
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

  /// Multi-node (docs/cli.md#multi-node): this node's first failure of an attempt, as
  /// `on_failure` receives it (as the other workers are stopped: after a teardown hold, the
  /// worker that ended it by failing of something else, when one did).
  struct LocalFailure {
    int attempt = 0;
    int rank = -1;  ///< global rank
    int local_rank = -1;
    int code = 1;        ///< shell status: the exit code, or 128 + signal
    std::string reason;  ///< e.g. "rank 3 (pid 123) ended with exit code 7"
  };
  /// Called once per attempt at this node's first worker failure (not for stop_for_peer).
  std::function<void(const LocalFailure&)> on_failure;
  /// Called when attempt n's workers are about to start (n = 0 first).
  std::function<void(int attempt)> on_attempt_start;
  /// Continues after an attempt: restart the worker set (attempt + 1), or finish with `code`
  /// and `reason`. Call once, on the io thread (now or later).
  using AttemptDecision = std::function<void(bool restart, int code, const std::string& reason)>;
  /// Multi-node: when set, decides what follows every attempt instead of the local rule
  /// (restart while attempt < max_restarts after a failure): called once all of the attempt's
  /// workers are gone, with this node's result (0, a failure's shell code, 1 after
  /// stop_for_peer, 128 + signal after a shutdown signal; `by_signal` then true). Until
  /// `decide` runs, the supervisor waits (handle_signal ignores shutdown signals: route them
  /// to whoever holds `decide`).
  std::function<void(int attempt, int code, bool by_signal, AttemptDecision decide)> attempt_gate;

  /// Spawns attempt 0.
  void start();
  /// Before start(): the job's node count as the start rendezvous closed it (--nnodes
  /// MIN:MAX); WORLD_SIZE and GROUP_WORLD_SIZE follow.
  void set_node_count(int nnodes) {
    opt_.plan.nnodes = nnodes;
    opt_.plan.world_size = opt_.plan.nproc * nnodes;
  }
  /// Multi-node, before a restart's attempt starts: the job was re-formed with the nodes left
  /// (--nnodes MIN:MAX): this node's rank in it (GROUP_RANK; RANK follows) and the node count.
  void set_node(int node_rank, int nnodes) {
    opt_.plan.node_rank = node_rank;
    set_node_count(nnodes);
  }

  /// Multi-node: another node failed. Stops this node's workers as a local failure would
  /// (SIGTERM, SIGKILL after the grace period), saying `reason`; the attempt counts as failed
  /// (result 1) without a local failure summary. No-op unless the attempt is running and has
  /// no failure or shutdown yet. `grace`: SIGKILL after this instead of the grace period (a
  /// node cut off from the job: its workers hold nothing the job needs).
  void stop_for_peer(const std::string& reason,
                     std::optional<std::chrono::milliseconds> grace = std::nullopt);
  /// Multi-node: another node's gpurun got the shutdown signal `sig`: says `reason`, then
  /// reacts as handle_signal(sig) would (SIGTERM: stop at the next boundary). No-op unless the
  /// attempt is running with no failure or shutdown yet.
  void peer_signal(int sig, const std::string& reason);

  /// Elastic mode: `controller` (outliving the supervisor's run) decides which slots start
  /// and how their exits count. Call before start().
  void set_controller(SlotController* controller) { controller_ = controller; }
  /// Elastic mode: what the controller answers (holds_job_open) changed without a local exit
  /// (e.g. the last process of another node ended): the supervisor checks again, on a fresh
  /// stack, whether the job is over.
  void controller_changed();
  /// Elastic mode: starts a process for slot `local_rank` (which must have none) with the
  /// plan's environment plus `overlay`. Returns its pid, or -1 when it could not start
  /// (reported later as an exit with code 1, on a fresh stack).
  int spawn_slot(int local_rank, const EnvMap& overlay);
  /// Elastic mode, on every node: starts job slot `spawn.slot`'s process here (its local slot
  /// control::slot_local(spawn.slot)) with elastic_worker_env(d, spawn) over the plan's
  /// environment. Returns spawn_slot's pid or -1.
  int spawn_elastic(const control::Decision& d, const ElasticSpawn& spawn);
  /// Sends SIGKILL to the process group of slot `local_rank` (no-op without a process).
  void kill_slot(int local_rank);
  /// Elastic mode: the generation in force is `active` (sorted job slot ids, node k's local
  /// slot i being k*1000+i with k = plan.node_rank; rank = index), or none (nullopt: before the
  /// first decision, the slots' own ranks). Each slot's console prefix, named by its job slot id
  /// follows it from the next line on (expand_elastic_prefix); a process spawned later gets
  /// its slot's. Call on the io thread, before the spawns the generation causes (so the
  /// prefix width the pty leaves is the one its lines get).
  void set_generation(std::optional<std::vector<int>> active);

  /// Reacts to a signal gpurun received: SIGINT/SIGTERM/SIGQUIT start a shutdown (the
  /// signal is forwarded to every worker group, SIGKILL after the grace period;
  /// a second one sends SIGKILL at once; exit status 128 + the signal), like torchrun's
  /// agent; while paused (elastic, no member) it also says that the pause snapshot is
  /// deleted. SIGUSR1/SIGUSR2 are forwarded; SIGHUP reloads the config (elastic) or is
  /// only logged.
  /// Preemption (docs/cli.md#preemption): SIGTERM first asks the workers that use the worker
  /// runtime (their process group wrote <run_dir>/preempt/runtime.<pgid>; every worker in
  /// elastic mode) to stop at their next boundary (<run_dir>/preempt/stop; elastic: an `exit`
  /// decision) and forwards SIGTERM to them only after stop_timeout (the others get it at
  /// once); exit status 143 all the same. The preempt signal (default SIGUSR2) is forwarded to
  /// every worker group (not in elastic mode, where the next decision carries it) and becomes
  /// the runtime's checkpoint request; with stop_on_preempt it then stops the job like SIGTERM
  /// (but forwards nothing before stop_timeout).
  void handle_signal(int sig);
  /// The signal that stopped the job (SIGINT/SIGTERM/SIGQUIT, or the preempt signal with
  /// stop_on_preempt); 0 when none did.
  int shutdown_signal() const { return shutdown_signal_; }
  /// <run_dir>/preempt: the files of gpurun's requests to the worker runtime.
  std::string preempt_dir() const;

  bool done() const { return exit_code_.has_value(); }
  int exit_code() const { return exit_code_.value_or(-1); }
  int attempt() const { return attempt_; }
  /// Pids of the current attempt's workers (-1 for a slot that failed to start).
  std::vector<int> worker_pids() const;

 private:
  struct Stream;
  struct Worker;
  struct Failure;
  // kGated: every worker of the attempt is gone; attempt_gate's decision is awaited.
  enum class Phase { kRunning, kStopping, kDraining, kGated, kDone };

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
  // "rank 1 (pid 123) ended with signal SIGKILL (9)[: killed by the kernel's OOM killer …]"
  std::string ended_with(const Worker& w) const;
  void record_failure(Worker& w, ExitStatus status, std::string reason);
  // The record root_cause judges a worker by (its error file, stderr tail, times).
  FailureRecord record_of(const Worker& w) const;
  // The teardown hold (SupervisorOptions::teardown_hold), static mode: starts it when the
  // first failure (failure_, worker `w`) is a teardown error; true when it did.
  bool hold_teardown(const Worker& w);
  // While holding: ends the hold when `w` (just exited, or running with an error file) failed
  // of something other than a teardown error, or every worker has ended.
  void check_hold(const Worker* exited);
  // Ends the hold (if any) and stops the other workers: SIGTERM, SIGKILL after the grace
  // period; tells on_failure of `cause` (failure_'s worker, or the one that ended the hold).
  // `why` starts the line said ("" : failure_'s reason).
  void begin_teardown(const Worker* cause, const std::string& why);
  void stop_workers(int sig);
  void signal_all(int sig);
  void check_progress();
  void arm_poll();
  void finish_attempt();
  void restart(const std::string& reason);  // the next attempt, on a fresh stack
  void finish_unrestarted();                // the local rule's end: success or a failure
  void print_summary();
  // Static mode, at an attempt's end: makes failure_ the root cause among the workers that
  // failed (choose_root_cause), which need not be the first one reaped.
  void settle_root_cause();
  void finish(int code, const std::string& reason);
  void say(const std::string& line);  // "gpurun: ..." on the console's stderr
  void say_paused_snapshot();         // a shutdown signal while paused: the snapshot's fate
  // Preemption: the warning signal; a stop at the next boundary (SIGTERM, or the warning with
  // stop_on_preempt); whether `w`'s process group uses the worker runtime.
  void on_preempt_signal(int sig);
  void stop_at_boundary(int sig, bool signal_others_now);
  bool uses_runtime(const Worker& w) const;
  // The console prefix of slot `local_rank` now: its rank's, or set_generation's.
  std::string prefix_of(int local_rank) const;

  boost::asio::io_context& io_;
  SupervisorOptions opt_;
  ProcessSpawner& spawner_;
  Console& console_;
  EventLog& events_;

  std::vector<std::unique_ptr<Worker>> workers_;
  std::vector<std::unique_ptr<Worker>> retired_;  // earlier processes of respawned slots
  SlotController* controller_ = nullptr;
  std::optional<std::vector<int>> generation_;  // set_generation: the active set in force
  std::unique_ptr<Failure> absorbed_failure_;   // first failure elastic mode absorbed
  std::unique_ptr<Failure> failure_;
  std::optional<WallClock::time_point> teardown_at_;  // record_failure's SIGTERM to every group
  OomWatch oom_;
  Phase phase_ = Phase::kRunning;
  int attempt_ = 0;
  int shutdown_signal_ = 0;  // SIGINT/SIGTERM/SIGQUIT received
  bool grace_armed_ = false;
  std::optional<std::chrono::milliseconds> grace_;  // stop_for_peer's, else opt_.grace_period
  bool holding_ = false;  // the teardown hold is on: failure_ is set, no SIGTERM sent yet
  bool killed_ = false;
  bool drain_expired_ = false;
  bool kill_expired_ = false;
  // finish_attempt ran for this attempt: a check queued before it (a timer's that had already
  // fired, say) finds nothing more to do until start_attempt clears it.
  bool attempt_finished_ = false;
  bool poll_armed_ = false;
  std::optional<int> exit_code_;
  boost::asio::steady_timer grace_timer_;
  boost::asio::steady_timer kill_timer_;
  boost::asio::steady_timer poll_timer_;
  boost::asio::steady_timer drain_timer_;
  boost::asio::steady_timer stop_timer_;                   // stop at a boundary -> SIGTERM
  boost::asio::steady_timer hold_timer_;                   // the teardown hold's end
  std::shared_ptr<int> alive_ = std::make_shared<int>(0);  // handlers check it via weak_ptr
};

}  // namespace gpurun::supervisor
