// gpurun::control::HeartbeatWatch — the one rule of --node-timeout (docs/cli.md#multi-node,
// docs/cli.md#elastic-nodes): every gpurun of a node k > 0 advances a counter in node 0's store
// every heartbeat_interval(); node 0 gives a node up when its counter has not changed for
// --node-timeout on node 0's own monotonic clock. A static multi-node job
// (supervisor::NodeSync, job_keys::beat) and an elastic one (control::NodeHub,
// keys::node_beat) both watch their nodes through it.
#pragma once

#include <chrono>
#include <map>
#include <optional>
#include <string>

namespace gpurun::control {

/// How often a node > 0 advances its heartbeat for a given --node-timeout: min(1 s, timeout / 5),
/// at least 10 ms; 1 s when the timeout is 0 (never).
std::chrono::milliseconds heartbeat_interval(std::chrono::milliseconds node_timeout);

/// Node 0's side: per node, its heartbeat's last value and when (node 0's monotonic clock, ms)
/// it last changed. Pure (time comes in as `now`); not thread-safe.
class HeartbeatWatch {
 public:
  using Ms = std::chrono::milliseconds;
  /// `timeout`: --node-timeout; 0 = never overdue.
  explicit HeartbeatWatch(Ms timeout) : timeout_(timeout) {}

  /// Watches `node` from `now` on: it has a whole timeout from now (its value: none yet).
  void watch(int node, Ms now);
  /// Stops watching `node` (it left, or was given up).
  void forget(int node) { nodes_.erase(node); }
  /// Stops watching every node.
  void clear() { nodes_.clear(); }
  /// `node`'s heartbeat read `value` at `now`: a value other than the last one restarts its
  /// timeout. A node not watched yet is watched from `now`.
  void seen(int node, const std::string& value, Ms now);
  /// How long `node`'s heartbeat has not changed, when that is the timeout or more; nullopt
  /// while it is within the timeout, when the timeout is 0 or the node is not watched.
  std::optional<Ms> overdue(int node, Ms now) const;
  Ms timeout() const { return timeout_; }
  /// Node 0's own check at `now` (it checks every heartbeat_interval()). When more than half
  /// the timeout passed since its previous check, node 0 itself did not run meanwhile (its
  /// gpurun stopped, its host stalled): the silence it saw is its own, so every watched node's
  /// timeout restarts from `now`, and that gap is returned; nullopt otherwise (and at the first
  /// check).
  std::optional<Ms> checked(Ms now);

 private:
  struct Beat {
    std::string value;
    Ms changed{0};
  };
  Ms timeout_;
  std::map<int, Beat> nodes_;
  std::optional<Ms> last_check_;
};

}  // namespace gpurun::control
