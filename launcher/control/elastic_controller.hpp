// gpurun::control::ElasticController — elastic mode of the supervisor: wires the
// config watcher, the store (reports, joins, parks), the Scheduler and the
// Supervisor's slots together, and keeps <run_dir>/status.json current.
// Protocol: docs/control-protocol.md.
#pragma once

#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <boost/asio/io_context.hpp>

#include "control/config.hpp"
#include "control/config_watcher.hpp"
#include "control/effects.hpp"
#include "control/foreign_gpus.hpp"
#include "control/lease_keeper.hpp"
#include "control/node_hub.hpp"
#include "control/resize_timeline.hpp"
#include "control/scheduler.hpp"
#include "control/status.hpp"
#include "gpurun/clock.hpp"
#include "store/backend.hpp"
#include "supervisor/console.hpp"
#include "supervisor/event_log.hpp"
#include "supervisor/slot_controller.hpp"
#include "supervisor/supervisor.hpp"

namespace gpurun::control {

/// What the controller needs besides its collaborators.
struct ElasticOptions {
  std::filesystem::path config_path;  ///< --config
  /// Every slot id active_gpus may name: with --device cuda each visible GPU (0..visible-1),
  /// with --device cpu 0..nproc-1.
  std::vector<int> slots;
  /// Slots trained on while active_gpus is absent: the first --nproc. nullopt = every slot.
  std::optional<std::vector<int>> launch;
  std::vector<std::string> physical_gpus;  ///< per slot (plan.gpu_ids); empty with --device cpu
  std::string run_id;
  std::string run_dir;  ///< status.json lives here
  WatcherOptions watcher;
  /// Per-slot energy columns for status.json; empty = no energy monitor.
  std::function<EnergyStatus()> energy_status;
  /// The timers of the boundary deadlines (Scheduler::on_deadline) and of status.json's
  /// coalesced writes, the time of lease ends and of yields' reclaim_after, and (unless
  /// `watcher.clock` names another) the config and leases watchers' clock; run on the io thread;
  /// tests pass a FakeClock. Must outlive the controller. nullptr: a supervisor::AsioClock on the
  /// controller's io_context (real time).
  gpurun::Clock* clock = nullptr;
  /// Node 0 of an elastic job over several nodes (--nnodes > 1, docs/cli.md#elastic-nodes): the
  /// hub's settings; nullopt: one node.
  std::optional<NodeHubOptions> nodes;
  /// Several nodes: where this gpurun serves its pause snapshot to the others ("ip:port"); ""
  /// = it serves none.
  std::string snapshot_endpoint;
  /// Several nodes: copies pause snapshot `serial` from the node serving it at `endpoint` into
  /// this node's snapshot path, off the io thread; `done` runs once, on any thread, with a
  /// kSnapshotFetched event (`how` empty: in place). Empty: this node cannot fetch.
  std::function<void(const std::string& endpoint, int64_t serial,
                     std::function<void(const NodeEvent&)> done)>
      fetch_snapshot;
};

/// Several nodes (docs/cli.md#elastic-nodes, "Pause and resume across nodes"): why no copy of
/// the current pause snapshot can be read again — node 0 has none (not in `copies`), every node
/// in `copies` is lost (`lost(k)`: NodeHub::lost, non-empty) and no copy is on its way to node 0
/// or to a node not lost (`fetching`). The sentence starts "is on node 1 (…), which was lost:
/// …" and says that node ids are not reused. "" while a copy may still be read (on node 0, or
/// on a live, leaving or released node) or may still land, and when `copies` is empty.
std::string snapshot_unreachable(const std::set<int>& copies, const std::set<int>& fetching,
                                 const std::function<std::string(int node)>& lost);

/// What the controller tells the supervisor's energy monitor (docs/energy.md), as callbacks
/// so that control does not depend on energy. Every callback runs on the io thread.
struct EnergyHooks {
  /// The GPUs trained on changed (a start, resize, pause or resume): charge these from now.
  std::function<void(const std::vector<int>& active)> active_changed;
  /// A boundary round is complete, before its decision: close the window; a returned
  /// sentence stops the job at this boundary (Zeus' early stop).
  std::function<std::optional<std::string>(const BoundaryInfo&)> boundary;
  /// A member finished training (exit 0) after its last epoch `final_epoch`.
  std::function<void(int64_t final_epoch)> training_finished;
  /// A write under gpurun/ (on the io thread), before the controller reads it: true when the
  /// hook took it (the program's energy questions, energy/energy_answers.hpp).
  std::function<bool(const std::string& key)> store_write;
};

/// Runs on the supervisor's io thread (every method and callback). The backend, supervisor,
/// event log and console must outlive it. It is the scheduler's EffectSink: the store, the
/// slots' processes, timers, the event log and the console.
class ElasticController : public supervisor::SlotController, private EffectSink {
 public:
  /// `initial` = the already validated config. Installs the store write observer and the
  /// config watcher; writes status.json.
  ElasticController(boost::asio::io_context& io, store::Backend& backend,
                    supervisor::Supervisor& supervisor, supervisor::EventLog& events,
                    supervisor::Console& console, Config initial, ElasticOptions options);
  ~ElasticController() override;

  void on_attempt_start(int attempt) override;
  bool on_worker_exit(int local_rank, supervisor::ExitStatus status, bool can_restart) override;
  /// Several nodes: another node's processes may run while none of this node's does.
  bool paused() const override { return scheduler_.holds_job_open(); }
  /// Paused, or (several nodes) a process of another node still runs.
  bool holds_job_open() const override {
    return scheduler_.holds_job_open() || (hub_ && hub_->remote_processes());
  }
  bool succeeded() const override;
  std::string failure_summary() const override;
  std::string job_failed() const override { return scheduler_.state_lost(); }
  void on_reload_request() override;
  void on_checkpoint_request() override;
  bool on_stop_request(const std::string& why) override;

  const Scheduler& scheduler() const { return scheduler_; }
  /// Several nodes: node 0's hub (nullptr with one node).
  NodeHub* node_hub() { return hub_.get(); }
  /// The set config.toml declares now (active_gpus, or the launch set), before policies.
  std::vector<int> declared_gpus() const { return declared_set(declared_); }
  /// `[policy] min_gpus` of the file's last good config.
  int min_gpus() const { return declared_.policy.min_gpus; }
  /// The GPUs lent now (`gpurun lend`, docs/sharing.md), sorted: /metrics' "lent" state.
  std::vector<int> lent_now() const;
  /// The GPUs given up to another user's process now (docs/sharing.md#yield): "yielded".
  std::vector<int> yielded_now() const;
  /// Installs the energy monitor's hooks; call before the supervisor starts.
  void set_energy_hooks(EnergyHooks hooks);
  /// Rewrites status.json (coalesced): the energy columns change without protocol events.
  void publish_status() { write_status(); }
  /// The compute processes NVML lists on the job's GPUs (slot -> (pid, bytes)), about once a
  /// second: `[policy] yield_to_foreign` (docs/sharing.md#yield). Io thread.
  void on_gpu_processes(const ForeignGpus::Listing& listing);
  /// `[energy] scale = "auto"` (docs/energy.md#scale): the GPUs it gives back, (gpu, why),
  /// and its status.json object (`policy.scale`). Called from the energy hook of a boundary,
  /// the new set takes effect at that boundary's decision; otherwise at the next boundary.
  /// Io thread.
  void set_scale(std::vector<std::pair<int, std::string>> out, std::string status_json);

 private:
  std::string failed_while_finishing_;  ///< the first failure after a member finished (or "")
  /// Loads the file after a change or a SIGHUP: applies it, rejects it (and says what stays
  /// in force), or, when a SIGHUP finds it unchanged, says so (console + config_unchanged).
  void reload();
  /// The config the scheduler gets: the declared one with the lent GPUs taken out
  /// (docs/sharing.md); `declared` itself when no lease changes its set.
  Config effective_config(const Config& declared) const;
  /// Leases changed: said, logged, and the effective set given to the scheduler.
  void on_leases(const std::vector<LeaseKeeper::Change>& changes);
  /// Gives the scheduler the effective set when it changed (leases, yields, scale), says so,
  /// and runs the scheduler's effects unless `effects` is false (inside a boundary).
  void apply_policy(bool effects = true);
  /// active_gpus, or the launch set when the file names none.
  std::vector<int> declared_set(const Config& declared) const;
  /// The GPUs policies other than leases take out: yields, then scale's.
  std::vector<std::pair<int, std::string>> policy_out(const Config& declared) const;
  /// The effective set now, from `declared` and every policy.
  EffectiveSet effective_now(const Config& declared) const;
  /// status.json's "policy" object text.
  std::string policy_status() const;
  void on_key(const std::string& key);
  /// A process of `gpu` ended (a local one, or another node's): the scheduler's verdict, the
  /// energy hook of a finished training. Returns whether elastic mode absorbs the exit.
  bool process_exited(int gpu, bool success, const std::string& how, bool can_restart);
  /// What a node's write changed (NodeHub::on_key): new slots, offers, started and ended
  /// processes of other nodes.
  void on_nodes(const NodeHub::Changes& changes);
  /// Every heartbeat_interval(--node-timeout): NodeHub::check_heartbeats, then again.
  void check_node_heartbeats();
  /// Scheduler::resume_gate: every node of `target` has the current pause snapshot; starts the
  /// copies that are missing (docs/cli.md#elastic-nodes).
  bool snapshot_on_nodes(const std::vector<int>& target);
  /// A copy of the pause snapshot to node `node` ended (e.how empty: in place).
  void snapshot_copied(int node, const NodeEvent& e);
  /// Whether a pause snapshot was written; copies_ made current (a new one: no copies yet).
  bool current_copies();
  /// Where node `node` serves its pause snapshot ("" when it is gone or serves none).
  std::string snapshot_endpoint(int node) const;
  /// A node with a copy of the current pause snapshot that serves it, -1 when none.
  int serving_node() const;
  /// Starts the copy of the current pause snapshot from node `from` to node `to` (`why`: the
  /// end of the console line).
  void copy_snapshot(int from, int to, const std::string& why);
  /// NodeHub::release_idle's `keep`: a leaving node that holds the paused job's only pause
  /// snapshot stays until node 0 has a copy (started here); once, then it goes.
  bool keep_for_snapshot(int node);
  /// Before each batch of effects: the paused job's only pause snapshot is on nodes that were
  /// lost (snapshot_unreachable): the training state is lost (Scheduler::snapshot_unreachable)
  /// and the supervisor ends the job.
  void lose_unreachable_snapshot();
  /// control::run_effects over this sink, then what follows every batch of effects (console
  /// prefixes, resize events, energy hooks, stale timers, status.json).
  void run_effects();
  // EffectSink (the io thread).
  void begin_batch() override;
  void write_key(const std::string& key, const std::string& value,
                 const Decision* decision) override;
  void delete_key(const std::string& key) override;
  void abandon_keys(const std::string& prefix) override;
  int spawn(int gpu, int64_t generation, int64_t warm, bool standby,
            const Decision& decision) override;
  void kill(int gpu) override;
  void arm_deadline(int64_t generation, int64_t round, std::chrono::milliseconds after) override;
  void event(const std::string& name, const JsonObject& fields) override;
  void say(const std::string& line) override;
  /// The console prefixes follow the generation in force (Supervisor::set_generation): called
  /// before each batch of effects, so a joiner spawned by it starts with its generation's.
  void follow_generation();
  void write_status();
  std::string render_current_status() const;
  /// Resize timings (docs/control-protocol.md#resize-timings): the `resize` events completed.
  void emit_resize_events();

  boost::asio::io_context& io_;
  store::Backend& backend_;
  supervisor::Supervisor& supervisor_;
  supervisor::EventLog& events_;
  supervisor::Console& console_;
  std::optional<std::vector<int>> console_active_;  ///< the active set the prefixes show
  ElasticOptions opt_;
  Config declared_;  ///< the file's last good config (the scheduler gets effective_config())
  Scheduler scheduler_;
  std::unique_ptr<ConfigWatcher> watcher_;
  std::unique_ptr<LeaseKeeper> leases_;
  ForeignGpus foreign_;
  std::vector<std::pair<int, std::string>> scale_out_;  // set_scale
  std::string scale_status_;                            // its status.json object, or ""
  bool in_boundary_ = false;                            // inside the energy hook of a boundary
  bool policy_pending_ = false;  // set_scale ran there: apply before the decision
  StatusWriter status_writer_;
  std::unique_ptr<gpurun::Clock> own_clock_;  // when opt_.clock is nullptr
  gpurun::Clock& clock_;
  std::map<std::pair<int64_t, int64_t>, gpurun::Clock::Timer> deadlines_;
  ResizeTimeline timeline_;
  EnergyHooks energy_;
  std::vector<int> energy_active_;        // the set last given to energy_.active_changed
  bool sighup_pending_ = false;           // a SIGHUP waits for its reload's answer
  std::unique_ptr<NodeHub> hub_;          // several nodes: node 0's side
  gpurun::Clock::Timer heartbeat_timer_;  // check_node_heartbeats
  int64_t copies_serial_ = -1;            // the pause snapshot copies_ hold
  std::set<int> copies_;                  // nodes that have it
  std::set<int> fetching_;                // nodes copying it now
  std::set<int> unreachable_said_;
  std::set<int> handed_over_;  // leaving nodes whose snapshot node 0 copied (or tried to)
  std::shared_ptr<int> alive_ = std::make_shared<int>(0);
};

}  // namespace gpurun::control
