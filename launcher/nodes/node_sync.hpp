// gpurun::supervisor::NodeSync — a static multi-node job (--nnodes > 1) held together through
// node 0's store: the start rendezvous (one run id, one restart limit), a failure anywhere
// stopping every node, one restart count for the whole job decided by node 0, the root cause
// named on node 0, and the exit barrier; with --nnodes MIN:MAX a lost node re-forms the job with
// the nodes left (docs/cli.md#node-ranges-a-lost-node-re-forms-the-job). Behaviour, keys and
// flags: docs/cli.md#multi-node.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>

#include "gpurun/control/heartbeat.hpp"
#include "gpurun/error.hpp"

#include "gpurun/store/client_store.hpp"
#include "gpurun/store/store.hpp"

namespace gpurun::supervisor {

/// The keys in node 0's store (all under "gpurun/", which survives a restart's key reset).
namespace job_keys {
std::string join(int node);               ///< gpurun/job/join/<node>
std::string start();                      ///< gpurun/job/start
std::string fail(int attempt, int node);  ///< gpurun/job/<attempt>/fail/<node>
std::string stop(int attempt);            ///< gpurun/job/<attempt>/stop
std::string end(int attempt, int node);   ///< gpurun/job/<attempt>/end/<node>
std::string next(int attempt);            ///< gpurun/job/<attempt>/next
std::string live(int node);               ///< gpurun/live/node<node> (Backend)
std::string lost(int node);               ///< gpurun/lost/node<node> (Backend)
std::string beat(int node);               ///< gpurun/beat/node<node>: a counter, nodes > 0
std::string next_node();                  ///< gpurun/job/next_node: c10d node ranks, in join order
std::string job_id();                     ///< gpurun/job/id: node 0's run id, set at its start
/// gpurun/job/<attempt>/nodes: the nodes (their first node ranks, ascending) that attempt
/// + 1 runs on, written before next(attempt) when node 0 re-forms a --nnodes MIN:MAX job
std::string members(int attempt);
}  // namespace job_keys

/// A node's first failure in an attempt, as written to node 0's store: one line,
/// "<time_ms> <node> <rank> <local_rank> <code> <reason>".
struct NodeFailure {
  int64_t time_ms = 0;  ///< when it was seen (Unix ms: the reporting node's clock)
  int node = 0;
  int rank = -1;  ///< global rank; -1 when not one worker (the node itself was lost)
  int local_rank = -1;
  int code = 1;        ///< shell status: exit code, or 128 + signal
  std::string reason;  ///< one line
  std::string encode() const;
  /// nullopt when `text` is not encode()'s form.
  static std::optional<NodeFailure> decode(const std::string& text);
};

/// The root cause among `failures`: the earliest time, then the lowest node (torchrun also
/// names the first failure in time). nullopt when empty.
std::optional<NodeFailure> root_cause(const std::vector<NodeFailure>& failures);

/// Node 0's decision after an attempt: "restart", or "exit <code> <reason>".
struct AttemptOutcome {
  bool restart = false;
  int code = 0;        ///< the job's exit status when !restart
  std::string reason;  ///< one line
  /// A restart of a re-formed job (--nnodes MIN:MAX, a node lost): the next attempt's node
  /// count and this node's rank in it (dense). 0 / -1: unchanged. Not encoded (the nodes read
  /// job_keys::members).
  int nnodes = 0;
  int node_rank = -1;
  std::string encode() const;
  static std::optional<AttemptOutcome> decode(const std::string& text);
};

/// join() could not join the job; `code` is the exit status to end with (node 0's for a
/// rendezvous it ended by a signal, else 1).
struct JoinError : gpurun::Error {
  JoinError(int exit_code, const std::string& what) : gpurun::Error(what), code(exit_code) {}
  int code;
};

/// What nodes > 0 learn from node 0 at the start rendezvous.
struct JobStart {
  std::string run_id;    ///< node 0's (TORCHELASTIC_RUN_ID of every worker)
  int max_restarts = 0;  ///< node 0's --max-restarts: the job's one restart limit
  int nnodes = 0;        ///< the job's node count (with --nnodes MIN:MAX: as node 0 closed it)
  int node_rank = 0;     ///< this node's (given in join order with rank_by_join)
};

/// Settings; defaults match the CLI's.
struct NodeSyncOptions {
  int nnodes = 2;      ///< --nnodes (the minimum of MIN:MAX)
  int nnodes_max = 0;  ///< the maximum of --nnodes MIN:MAX; 0: nnodes
  int node_rank = 0;   ///< --node-rank (nodes > 0 with rank_by_join: given by join())
  /// c10d without --node-rank (docs/cli.md#c10d): nodes > 0 take their rank in join order
  /// from node 0's store (job_keys::next_node).
  bool rank_by_join = false;
  /// Nodes > 0 with rank_by_join and an --rdzv-id of their own: refuse a store whose job has
  /// another run id (a stale job on the port) instead of joining it.
  bool check_run_id = false;
  /// Node 0, --nnodes MIN:MAX: once MIN nodes joined, how long it still waits for more
  /// (--rdzv-conf last_call_timeout; torchrun's default 30 s).
  std::chrono::milliseconds last_call_timeout{std::chrono::seconds(30)};
  int nproc = 1;                   ///< this node's workers (every node must have the same)
  std::string host = "127.0.0.1";  ///< node 0's store (--master-addr), for nodes > 0
  uint16_t port = 29500;           ///< --master-port
  std::string run_id;              ///< node 0: announced to the others
  int max_restarts = 0;            ///< node 0: announced to the others
  /// Nodes > 0: how long to keep trying to reach node 0's store (torch's store default).
  std::chrono::milliseconds connect_timeout{std::chrono::seconds(300)};
  /// Every node: how long the start rendezvous waits for the other nodes (--join-timeout).
  std::chrono::milliseconds join_timeout{std::chrono::seconds(600)};
  /// Nodes > 0: the deadline of one request to node 0's store; a request that fails or
  /// exceeds it means node 0 is gone.
  std::chrono::milliseconds op_timeout{std::chrono::seconds(5)};
  /// Node 0: --exit-barrier-timeout: after its own workers succeeded, how long its store stays
  /// up for nodes whose workers still run; also bounds the wait for the nodes' end of an
  /// attempt after a failure.
  std::chrono::milliseconds barrier_timeout{std::chrono::seconds(300)};
  /// After a shutdown signal on one node, how long node 0 waits for the other nodes' workers
  /// to stop the same way (their stop timeout + grace period, and a margin).
  std::chrono::milliseconds peer_stop_wait{std::chrono::seconds(70)};
  /// Node 0: after the final decision, how long it waits for the other nodes to read it and
  /// disconnect before it closes the store.
  std::chrono::milliseconds disconnect_wait{std::chrono::seconds(5)};
  /// How often the keys are read.
  std::chrono::milliseconds poll_interval{100};
  /// Nodes > 0: how often this node's gpurun tells node 0 it is alive (a counter in
  /// job_keys::beat) while an attempt runs (gpurun sets control::heartbeat_interval of
  /// heartbeat_timeout).
  std::chrono::milliseconds heartbeat_interval{std::chrono::seconds(1)};
  /// Node 0: --node-timeout: a node whose heartbeat has not advanced for this long (node 0's
  /// own clock) while its workers run is given up like a lost node: its gpurun hangs (stopped,
  /// deadlocked, its host stalled) with its connection still open. 0: never.
  std::chrono::milliseconds heartbeat_timeout{std::chrono::seconds(30)};
  /// One "gpurun: ..." line without the prefix (io thread; nodes > 0: also join()'s thread).
  std::function<void(const std::string& line)> say;
};

/// One per gpurun with nnodes > 1. Every member runs on the io thread, except join().
/// Nodes > 0 talk to node 0's store with blocking requests of at most op_timeout each (a
/// lost node 0 stalls this node's io thread once, for at most op_timeout).
class NodeSync {
 public:
  /// Node 0, over the store it hosts (store::BackendStore; it must outlive this). Its calls
  /// must not block (the backend's own mutex only).
  NodeSync(boost::asio::io_context& io, NodeSyncOptions options, store::HostedStore& local);
  /// Nodes > 0: nothing happens until join(), which opens a store::ClientStore to node 0's.
  NodeSync(boost::asio::io_context& io, NodeSyncOptions options);
  ~NodeSync();
  NodeSync(const NodeSync&) = delete;
  NodeSync& operator=(const NodeSync&) = delete;

  /// Nodes > 0, before io runs: connects to node 0's store (retrying until connect_timeout),
  /// announces this node (its live key and join key) and blocks until node 0's start record
  /// (at most join_timeout). Throws gpurun::Error naming host:port, the elapsed time and the
  /// cause (never reached; node 0 refused this node, e.g. a different --nproc; timed out).
  JobStart join();
  /// Makes a running join() throw JoinError(128 + sig) within about a second (any thread).
  void cancel_join(int sig) { join_cancel_.store(sig); }
  /// Node 0: waits (on io) until every node joined, checks them, writes the start record,
  /// then calls `ready("")`; `ready(error)` when a node cannot take part (its join names a
  /// different nproc) or join_timeout passes (the error names the missing nodes).
  void rendezvous(std::function<void(const std::string& error)> ready);
  /// The job's node count: node 0's after rendezvous(), the others' after join(); smaller
  /// after a re-formed restart (--nnodes MIN:MAX).
  int nnodes() const { return opt_.nnodes; }
  /// This node's rank; -1 while a node ranked by join order has none yet.
  int node_rank() const { return opt_.rank_by_join && !ranked_ ? -1 : opt_.node_rank; }
  /// Node 0: true until rendezvous() called `ready`.
  bool rendezvous_pending() const { return static_cast<bool>(ready_); }
  /// Node 0: ends a pending rendezvous now: the joined nodes are told `why` and exit with
  /// `code`; `ready(why)`.
  void cancel_rendezvous(const std::string& why, int code);

  /// Called when another node failed (or node 0 was lost): stop this node's workers,
  /// naming the cause. `sig` != 0: that node's gpurun got the shutdown signal `sig`: stop as
  /// if this node got it too (e.g. SIGTERM: at the next boundary). Set before the first
  /// attempt starts.
  std::function<void(const std::string& reason, int sig)> on_peer_failure;
  /// Node 0: called once per decided attempt that failed, with the root cause (for the
  /// console summary and the event log).
  std::function<void(int attempt, const NodeFailure& root)> on_root_cause;

  /// Attempt `attempt`'s workers start: watch for other nodes' failures.
  void attempt_started(int attempt);
  /// This node's first failure in `attempt`: written for everyone, which stops the others.
  void local_failure(int attempt, const NodeFailure& failure);
  /// This node's gpurun got the shutdown signal `sig` (SIGINT/SIGTERM/SIGQUIT) while attempt
  /// `attempt` runs: recorded as this node's failure (status 128 + sig), and every other node
  /// stops its workers as if it got `sig` too.
  void local_signal(int attempt, int sig);
  /// Every worker of `attempt` is gone; this node's result is `code` (`by_signal`: gpurun
  /// got a shutdown signal). Node 0 waits for every node's end (bounded; see the options),
  /// decides; the others wait for that decision. `decide` runs once, on the io thread.
  void attempt_ended(int attempt, int code, bool by_signal,
                     std::function<void(const AttemptOutcome&)> decide);
  /// True while attempt_ended waits.
  bool waiting() const { return static_cast<bool>(decide_); }
  /// A shutdown signal while waiting. Node 0, the first time: every node still running stops as
  /// if it got `sig`, and node 0 waits for them at most peer_stop_wait more; again: node 0
  /// decides exit 128 + sig at once. Nodes > 0: stop waiting with 128 + sig. No-op when not
  /// waiting.
  void interrupt(int sig);
  /// After the final decision. Node 0: waits until every other node disconnected (at most
  /// disconnect_wait), then calls `closed` (close the store then). Nodes > 0: disconnects,
  /// then `closed`.
  void finish(std::function<void()> closed);

 private:
  /// Node 0's store: the hosted one on node 0, this node's connection on the others.
  store::Store& store() { return host_ ? static_cast<store::Store&>(*host_) : *client_; }
  void arm(std::function<void()> tick);
  void watch_tick();
  void node0_decide_tick();
  void node_wait_tick();
  void decided(const AttemptOutcome& outcome);
  void rendezvous_tick();
  void finish_tick();
  bool node_lost(int node);  // node 0: its live key's connection closed
  /// Node 0: true when node `r`'s heartbeat has not advanced for heartbeat_timeout (tracked
  /// from attempt_started on); the first time, its failure is written as for a lost node.
  bool node_hung(int r);
  void beat();  // nodes > 0: advance this node's heartbeat when heartbeat_interval passed
  std::string node_name(int node) const;
  /// join()'s first step: connects client_ to node 0's store at `where` in short windows
  /// (from `t0`, at most connect_timeout). Throws JoinError.
  void connect_to_node0(std::chrono::steady_clock::time_point t0, const std::string& where);
  /// Throws JoinError(128 + sig) once cancel_join(sig) was called.
  void throw_if_join_cancelled(const std::string& where) const;

  boost::asio::io_context& io_;
  NodeSyncOptions opt_;
  store::HostedStore* host_ = nullptr;          // node 0
  std::unique_ptr<store::ClientStore> client_;  // nodes > 0, from join() to finish()
  boost::asio::steady_timer timer_;
  std::function<void()> tick_;  // what the timer runs next
  int attempt_ = -1;
  bool watching_ = false;
  bool peer_stopped_ = false;  // on_peer_failure called for attempt_
  bool node0_gone_ = false;    // nodes > 0: a request to node 0's store failed
  std::string node0_error_;
  // attempt_ended
  std::function<void(const AttemptOutcome&)> decide_;
  int own_code_ = 0;
  bool own_by_signal_ = false;
  std::chrono::steady_clock::time_point wait_deadline_;
  bool announced_ = false;
  bool interrupted_ = false;  // node 0: a signal during attempt_ended
  // rendezvous
  std::function<void(const std::string&)> ready_;
  std::chrono::steady_clock::time_point rendezvous_deadline_;
  std::optional<std::chrono::steady_clock::time_point> last_call_;  // node 0: MIN reached
  bool ranked_ = false;  // rank_by_join: join() has taken a rank
  int max_nodes() const { return opt_.nnodes_max > 0 ? opt_.nnodes_max : opt_.nnodes; }
  // The nodes taking part, by their first node rank (the id in every key), ascending; a
  // node's rank in the job (GROUP_RANK) is its index here. Fewer after a re-formed restart.
  std::vector<int> members_;
  int min_nodes_ = 0;  // node 0: --nnodes MIN of a range (0: a fixed count)
  void set_members(std::vector<int> members);
  // Node 0, after a failed attempt `a` with nodes gone: the restart that re-forms the job with
  // the nodes left (--nnodes MIN:MAX, at least MIN left), or nullopt.
  std::optional<AttemptOutcome> reform(int a, const std::vector<int>& gone, std::string reason);
  std::vector<std::string> hosts_;  // per node, from the join records ("" unknown)
  std::function<void()> closed_;
  std::atomic<int> join_cancel_{0};
  std::chrono::steady_clock::time_point disconnect_deadline_;
  // heartbeats: node 0, per node, the last value seen and when it changed (the one rule of
  // --node-timeout, gpurun/control/heartbeat.hpp); nodes > 0, theirs
  control::HeartbeatWatch beat_watch_{std::chrono::milliseconds(0)};
  std::vector<bool> hung_;
  int64_t beats_ = 0;
  std::chrono::steady_clock::time_point beat_sent_{};
};

}  // namespace gpurun::supervisor
