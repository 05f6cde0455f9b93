// gpurun::supervisor::NodeAgent — the gpurun of node k > 0 in one elastic job over several nodes
// (--config with --nnodes, docs/cli.md#elastic-nodes): a slot agent. Node 0 decides for every
// node; this node's supervisor starts and kills its slots' processes only on node 0's commands
// and tells node 0 what became of them, all through node 0's store (keys::node_*,
// gpurun/control/node_messages.hpp). It offers its slots (its config's active_gpus), leaves at
// a boundary on SIGTERM or SIGINT, and stops when node 0 ends the job or is gone.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <boost/asio/io_context.hpp>

#include "gpurun/control/node_messages.hpp"
#include "gpurun/store/store.hpp"
#include "supervisor/slot_controller.hpp"

namespace gpurun::supervisor {

class Supervisor;

/// What a node tells node 0 when it joins (join_elastic_job).
struct ElasticJoinRequest {
  std::string where;       ///< node 0's store, "host:port" (messages)
  std::string run_id;      ///< --rdzv-id given to this node; "" = none given (any job is joined)
  std::string host;        ///< this host's name; "" = gethostname()
  int pid = 0;             ///< this gpurun's pid; 0 = getpid()
  std::vector<int> slots;  ///< its local slots, 0..n-1
  std::vector<int> offer;  ///< the local slots its config offers now
  std::string device;      ///< "cuda" or "cpu"
  /// Where this gpurun serves its pause snapshot (SnapshotServer, "ip:port"); "" = none.
  std::string snapshot_endpoint;
  /// The IP address it reaches node 0's store from (NodeJoin::address); "" = unknown.
  std::string address;
  /// How long node 0's job record (keys::node_job) may take to appear after the connect.
  std::chrono::milliseconds job_wait{std::chrono::seconds(5)};
  /// How long node 0's answer to the join (keys::node_answer) may take.
  std::chrono::milliseconds answer_wait{std::chrono::seconds(30)};
};

/// What the join gave.
struct ElasticJoin {
  int node = 0;        ///< this node's id (join order, from 1)
  std::string run_id;  ///< node 0's (every worker's TORCHELASTIC_RUN_ID)
};

/// Joins node 0's elastic job over `store` (the connection whose close tells node 0 this node is
/// gone: the live key is bound to it): reads node 0's run id, takes the next node id, sets this
/// node's live key and writes its join record. Blocks (at most job_wait, then one request per
/// step), then waits for node 0's answer (at most answer_wait). Throws JoinError (code 1) when
/// node 0 runs no elastic job or another run id than `run_id`, refuses the node (beyond
/// --nnodes MAX: the message says why) or does not answer; StoreError when node 0's store fails.
ElasticJoin join_elastic_job(store::Store& store, const ElasticJoinRequest& request);

/// Settings of a slot agent.
struct NodeAgentOptions {
  int node = 1;                   ///< this node's id (join_elastic_job)
  std::string where;              ///< node 0's store, "host:port" (messages)
  std::vector<int> slots;         ///< local slot ids (0..n-1): the supervisor's slots
  std::string config_path;        ///< GPURUN_CONFIG of its workers (absolute; "" = not set)
  std::vector<int> joined_offer;  ///< the offer its join record carried (local slots)
  /// How long the command reader blocks in one wait for node 0's next command: bounds how long
  /// destroying the agent takes. Node 0's command reaches the agent at once all the same.
  /// With a node_timeout, at most control::heartbeat_interval(node_timeout).
  std::chrono::milliseconds wait_slice{std::chrono::milliseconds(250)};
  /// --node-timeout: the command reader writes this node's heartbeat (keys::node_beat) every
  /// control::heartbeat_interval(node_timeout), the count of markers the io thread ran (a stuck
  /// io thread stops it from advancing, and node 0 gives the node up); a request node 0's store has
  /// not answered for node_timeout (the connections' own request timeout: set both to it) cuts this
  /// node off: its workers are stopped (SIGTERM, SIGKILL after cut_off_grace) and it ends with
  /// status 1. 0 = no heartbeat (node 0 then never gives this node up for silence).
  std::chrono::milliseconds node_timeout{0};
  /// Cut off: how long its workers have after SIGTERM (they hold nothing the job needs: the
  /// job goes on from the survivors' state).
  std::chrono::milliseconds cut_off_grace{std::chrono::seconds(2)};
  /// The local slots this node's config offers now (its active_gpus, else its --nproc first
  /// slots). Called on the io thread at a reload (SIGHUP, a config change). Empty function:
  /// the offer never changes.
  std::function<std::vector<int>()> offer;
  /// One "gpurun: ..." line without the prefix, starting "node <k>: " (io thread).
  std::function<void(const std::string& line)> say;
  /// Something status_members() shows changed (io thread): the app rewrites this node's
  /// status.json. Empty: nothing is told.
  std::function<void()> status_changed;
  /// Node 0's kFetchSnapshot: copies pause snapshot `serial` from `endpoint` into this node's
  /// snapshot path off the io thread (SnapshotFetcher::start); `done` runs once, on any thread.
  /// Empty: this node cannot fetch (its answer says so).
  std::function<void(const std::string& endpoint, int64_t serial,
                     std::function<void(const control::NodeEvent&)> done)>
      fetch_snapshot;
  /// The paths this node keeps its pause snapshot at (snapshot_files of its run dir), read
  /// when node 0 is gone to say whether this node holds one. Empty function: none.
  std::function<std::vector<std::string>()> snapshot_files;
};

/// One per gpurun of node k > 0 in an elastic job; the supervisor's SlotController. Every
/// member runs on the io thread (the supervisor's), except the command reader: a thread of its
/// own doing blocking waits on `commands` for node 0's next command (keys::node_command(k, n),
/// n = 0, 1, …, each deleted once read), posting each to io. Events and the offer are written
/// to `events` from the io thread (a blocking request each, bounded by that connection's
/// timeout). A request that fails on either connection means node 0's gpurun is gone: this node
/// stops its workers (SIGTERM, SIGKILL after the grace period) and ends with status 1, saying
/// in one line that the job cannot go on and what is left of its state (node0_gone).
class NodeAgent final : public SlotController {
 public:
  /// `events` should be the connection join_elastic_job ran on (its close is this node's
  /// loss); `commands` another one (a blocked wait there does not delay the events). Both must
  /// be thread-safe (ClientStore is). The supervisor must outlive the agent's io handlers.
  NodeAgent(boost::asio::io_context& io, Supervisor& supervisor,
            std::unique_ptr<store::Store> commands, std::unique_ptr<store::Store> events,
            NodeAgentOptions options);
  /// Stops the reader (within about wait_slice) and joins it.
  ~NodeAgent() override;
  NodeAgent(const NodeAgent&) = delete;
  NodeAgent& operator=(const NodeAgent&) = delete;

  /// How this node's gpurun ends, once node 0 said it (release: 0, exit: its code) or node 0
  /// was lost (1): the status and the reason. nullopt while the job goes on.
  struct End {
    int code = 0;
    std::string reason;
  };
  const std::optional<End>& end() const { return end_; }
  /// Supervisor::final_status of this node: end()'s status and reason, else nullopt (the
  /// supervisor's own: 128 + signal after a stop signal).
  std::optional<std::pair<int, std::string>> final_status() const;

  /// A signal gpurun received. Returns true when the agent took it: the first SIGTERM or SIGINT
  /// makes this node leave the job at the next boundary (keys::node_leave; node 0 releases it
  /// once its slots' processes are gone, then gpurun exits 0 after SIGTERM, 130 after SIGINT).
  /// Anything else (a second SIGTERM or SIGINT, SIGQUIT, other signals) is the supervisor's: it
  /// stops the workers at once.
  bool on_signal(int sig);
  /// This node's part of its own status.json (docs/cli.md#elastic-nodes): `"node"` (its id,
  /// node 0's store, its state, the generation node 0 last told it) and `"slots"` (one object a
  /// local slot under its job slot id: state, generation, rank, pid, reason), as JSON members
  /// without braces. `physical` names each local slot's GPU ("" = none).
  std::string status_members(const std::vector<std::string>& physical) const;
  /// Rereads the offer (NodeAgentOptions::offer) and writes it when it changed
  /// (keys::node_offer): the config watcher's call.
  void offer_changed();
  /// Stops the reader and closes both connections (node 0 sees this node leave now). Idempotent.
  void close();

  // SlotController
  void on_attempt_start(int attempt) override;
  bool on_worker_exit(int local_rank, ExitStatus status, bool can_restart) override;
  bool holds_job_open() const override { return !end_ && !stopping_now_; }
  /// Node 0 knows whether the job is paused; a stop signal here forwards as it is.
  bool paused() const override { return false; }
  /// Node 0 decides the job's outcome; this node's status is end()'s (Supervisor::final_status).
  bool succeeded() const override { return true; }
  void on_reload_request() override { offer_changed(); }
  bool on_stop_request(const std::string& why) override;

 private:
  void read_commands();  // the reader thread
  void on_command(int64_t n, const std::string& text);
  void spawn(const control::NodeCommand& c);
  /// kFetchSnapshot: the copy, then a kSnapshotFetched event to node 0.
  void fetch_snapshot(const control::NodeCommand& c);
  /// The end is known: `line` said; with `stop_workers` the processes left are stopped, else
  /// the supervisor ends once they exited.
  void ended(int code, std::string reason, const std::string& line, bool stop_workers,
             std::optional<std::chrono::milliseconds> grace = std::nullopt);
  /// Node 0's gpurun is gone (`cause`: why this node knows): the job cannot go on. The one
  /// path that ends this node then: it says so in one line (what is left of the training
  /// state and where, how to go on), stops its workers (ended) and ends with status 1.
  void node0_gone(const std::string& cause);
  /// Node 0's store has not answered for `silent` (a cut link, node 0's host stopped): this
  /// node's workers stop (cut_off_grace), its gpurun ends with status 1.
  void cut_off(std::chrono::milliseconds silent);
  /// What is left of the training state on this node as it ends (its workers stop now, a pause
  /// snapshot file here is deleted at exit), for node0_gone and cut_off: `node0_dead` says node
  /// 0's ranks ended with it (else they may still run).
  std::string state_left_here(bool node0_dead) const;
  /// Writes `key` = `value` to node 0's store; false (node0_gone done) when it failed.
  bool write(const std::string& key, const std::string& value);
  void event(const control::NodeEvent& e);
  void exited(int slot, int pid, const std::string& how);
  void say(const std::string& line);
  void status_changed();
  /// Generation `generation` with members `active` (job slot ids) is in force: the console
  /// prefixes (Supervisor::set_generation) and status.json follow it; an older one is ignored.
  void follow(int64_t generation, const std::vector<int>& active);
  std::string name() const;  // "node 1"
  /// Its status once node 0 released it: 0, 130 when it left on SIGINT (Ctrl-C).
  int leave_code() const;

  boost::asio::io_context& io_;
  Supervisor& sup_;
  std::unique_ptr<store::Store> commands_;
  std::unique_ptr<store::Store> events_;
  NodeAgentOptions opt_;
  std::thread reader_;
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> io_ticks_{0};  // heartbeat markers the io thread has run
  int64_t next_event_ = 0;
  std::map<int, int> procs_;  // local slot -> pid of its process (-1: could not start)

  /// What status.json shows of a local slot: its last process's kind and end.
  struct SlotView {
    bool warm = false, standby = false;
    int64_t generation = -1;  // the generation its process joined by (-1: a warm joiner)
    std::string ended;        // how its last process ended; "" = runs, or never ran
    bool clean = false;       // that end was exit code 0
  };
  std::map<int, SlotView> views_;
  int64_t generation_ = -1;  // the latest generation node 0 told this node (its decision)
  std::vector<int> active_;  // that generation's members, job slot ids (rank = index)

  std::optional<std::string> offer_;  // the offer last written ("0,1")
  bool leaving_ = false;
  int leave_signal_ = 0;       // the signal that made it leave (SIGTERM, SIGINT)
  bool stopping_now_ = false;  // a second stop signal: the supervisor stops the workers
  std::optional<End> end_;
  int64_t fetched_serial_ = -1;  // the pause snapshot node 0 last had copied here (-1: none)
  std::shared_ptr<int> alive_ = std::make_shared<int>(0);  // io handlers check it
};

}  // namespace gpurun::supervisor
