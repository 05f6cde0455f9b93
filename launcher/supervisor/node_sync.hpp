// gpurun::supervisor::NodeSync — the end of a static multi-node job (--nnodes > 1): every
// node writes `gpurun/node/<rank>/done` = its exit status to node 0's store, and node 0 keeps
// its store up until every node's key exists (the exit barrier, like torchrun's agent) or one
// reports a failure. Behaviour and flag: docs/cli.md#exit-barrier.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>

#include "gpurun/store/client.hpp"

namespace gpurun::supervisor {

/// The key node `node_rank` writes its exit status to ("gpurun/node/<rank>/done").
std::string node_done_key(int node_rank);

/// Settings; defaults match the CLI's.
struct NodeSyncOptions {
  int nnodes = 1;     ///< --nnodes
  int node_rank = 0;  ///< --node-rank
  /// Node 0's store (--master-addr, --master-port): where nodes > 0 connect.
  std::string host = "127.0.0.1";
  uint16_t port = 29500;
  /// Nodes > 0: how long to keep trying to reach node 0's store (torch's store default).
  std::chrono::milliseconds connect_timeout{std::chrono::seconds(300)};
  /// Nodes > 0: one connect attempt window (the client's jittered backoff runs inside it) and
  /// the deadline of the final write. A stop request is seen within one window.
  std::chrono::milliseconds op_timeout{std::chrono::seconds(5)};
  /// Node 0: --exit-barrier-timeout, how long its store stays up for the other nodes after
  /// its own workers succeeded.
  std::chrono::milliseconds barrier_timeout{std::chrono::seconds(300)};
  /// Node 0: how often the barrier looks at the done keys.
  std::chrono::milliseconds poll_interval{100};
  /// One "gpurun: ..." line without the prefix. Node 0: called on the io thread; nodes > 0:
  /// also on the connect thread (must be thread-safe, e.g. fprintf to stderr).
  std::function<void(const std::string& line)> say;
};

/// Node 0's in-process store: the value of `key`, nullopt when it is missing (must not
/// block: e.g. Backend::check + Backend::get).
using LocalRead = std::function<std::optional<std::string>(const std::string& key)>;
/// Node 0's in-process store: SET `key` = `value`.
using LocalWrite = std::function<void(const std::string& key, const std::string& value)>;

/// One per gpurun with nnodes > 1.
///
/// Node 0 (first constructor): finish() writes its own key through `write`; on success it
/// waits on the io_context (a timer polling `read`, never blocking a handler) until every
/// other node's key exists, a node reports a non-zero status, the barrier times out or
/// interrupt() is called; then `done` runs once with gpurun's exit status.
///
/// Nodes > 0 (second constructor): a thread connects to node 0's store at once, retrying until
/// connect_timeout (an error line names host:port and the elapsed time when it gives up);
/// report() then writes the node's status with one blocking SET (at most op_timeout).
///
/// Not thread-safe beyond what is said: call every member on one thread (node 0: io's).
class NodeSync {
 public:
  /// Node 0 (options.node_rank == 0).
  NodeSync(boost::asio::io_context& io, NodeSyncOptions options, LocalRead read, LocalWrite write);
  /// Nodes > 0: starts the connect thread.
  explicit NodeSync(NodeSyncOptions options);
  /// Stops and joins the connect thread (within op_timeout).
  ~NodeSync();
  NodeSync(const NodeSync&) = delete;
  NodeSync& operator=(const NodeSync&) = delete;

  /// Node 0: its workers finished with `exit_code`. Writes its done key, then: non-zero →
  /// `done(exit_code)` at once (no barrier: fail fast); zero → the barrier. `done` receives 0
  /// when every node reported 0 or the barrier timed out (a warning names the missing
  /// nodes), a node's status when it reported a failure (its value; 1 if it is not a number
  /// in 1..255), or 128 + sig after interrupt(sig). Runs on the io thread, maybe inside this
  /// call.
  void finish(int exit_code, std::function<void(int exit_code)> done);
  /// Node 0: true while the barrier waits.
  bool waiting() const { return done_ != nullptr; }
  /// Node 0: a stop signal (SIGINT/SIGTERM/SIGQUIT) while the barrier waits: stop waiting,
  /// `done(128 + sig)`. No-op when not waiting.
  void interrupt(int sig);

  /// Nodes > 0: writes this node's status to node 0's store. Blocks: waits for the connect
  /// thread (it gives up at once if it has not connected yet, within op_timeout), then one
  /// SET (at most op_timeout). Never throws; says why when the status could not be written.
  void report(int exit_code);

 private:
  void poll();
  void end_barrier(int code);
  void connect_loop();

  NodeSyncOptions opt_;
  // Node 0.
  boost::asio::io_context* io_ = nullptr;
  LocalRead read_;
  LocalWrite write_;
  std::unique_ptr<boost::asio::steady_timer> timer_;
  std::chrono::steady_clock::time_point barrier_deadline_;
  std::function<void(int)> done_;
  bool announced_ = false;  // the "keeping the store up" line was said
  // Nodes > 0: the connect thread's result.
  std::mutex mutex_;
  std::condition_variable stop_cv_;
  bool stop_ = false;
  std::unique_ptr<store::Client> client_;
  std::thread connect_thread_;
};

}  // namespace gpurun::supervisor
