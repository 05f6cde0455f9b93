// gpurun::control — one elastic job over several gpurun nodes (docs/cli.md#elastic-nodes): the
// job-wide slot ids, and the messages node 0 (the store host, the one decider) and the other
// nodes' gpurun processes (slot agents) exchange through node 0's store. Key names:
// gpurun/control/keys.hpp (keys::node_*). Encoding: one-line JSON objects with "v":1.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gpurun/control/decision.hpp"

namespace gpurun::control {

// ---- job-wide slot ids ----------------------------------------------------------------------

/// Node k's local slot i is the job's slot k * kSlotsPerNode + i: node 0's slots keep their
/// one-node ids (every one-node key, file and config reads the same), and an id says its node
/// and local GPU by itself. Node ids are given in join order and never reused in a job, so a
/// sorted active set is node-major (ranks of one node are contiguous, as under torchrun).
inline constexpr int kSlotsPerNode = 1000;
/// The node of job slot `slot`.
constexpr int slot_node(int slot) {
  return slot / kSlotsPerNode;
}
/// The node-local slot (its device index with --device cuda) of job slot `slot`.
constexpr int slot_local(int slot) {
  return slot % kSlotsPerNode;
}
/// The job slot of node `node`'s local slot `local` (0 <= local < kSlotsPerNode).
constexpr int job_slot(int node, int local) {
  return node * kSlotsPerNode + local;
}
/// How messages name a slot: "gpu 3" on node 0, "node 1 gpu 3" elsewhere.
std::string slot_name(int slot);

// ---- node k -> node 0 ---------------------------------------------------------------------------

/// keys::node_join(k): written once by node k's gpurun when it joins the job.
struct NodeJoin {
  int node = 0;            ///< its node id (keys::node_next(), join order, from 1)
  std::string host;        ///< its host name (messages, status)
  int pid = 0;             ///< its gpurun's pid
  std::vector<int> slots;  ///< its local slot ids (0..n-1)
  std::vector<int> offer;  ///< the local slots its config offers now (sorted)
  std::string run_id;      ///< the run id it was started with ("" = none given)
  std::string device;      ///< "cuda" or "cpu"
  /// Where its gpurun serves its pause snapshot to other nodes ("ip:port", the address it
  /// reaches node 0's store from); "" = it serves none.
  std::string snapshot_endpoint;
  /// The IP address it reaches node 0's store from (its workers' too): the address node 0
  /// severs (keys::sever) when it gives this node up; "" = unknown.
  std::string address;
  /// Its host's monotonic clock (CLOCK_MONOTONIC, ms) when it wrote this record: node 0 takes
  /// the difference to its own clock at reading it as that host's clock offset (to one store
  /// latency), so the resize timings of its processes compare with node 0's. 0 = not given.
  double monotonic_ms = 0;
  std::string to_json() const;
  /// Throws ProtocolError naming the field.
  static NodeJoin from_json(std::string_view text);
  friend bool operator==(const NodeJoin&, const NodeJoin&) = default;
};

/// keys::node_event(k, n): node k's agent tells node 0 what happened to one of its processes,
/// in order (n = 0, 1, …). Node 0 handles each once and deletes it.
struct NodeEvent {
  enum class Kind {
    kSpawned,          ///< the process of `slot` started as `pid` (pid <= 0: it could not start; an
                       ///< kExited follows)
    kExited,           ///< the process `pid` of `slot` ended: `code` (exit status) or `signal`
    kSnapshotFetched,  ///< a kFetchSnapshot is done: `how` empty = the copy is in place (its
                       ///< `bytes`, in `ms`), else why it failed
  };
  Kind kind = Kind::kSpawned;
  int slot = -1;  ///< job slot id
  int pid = -1;
  int code = 0;        ///< kExited: exit code (when signal == 0)
  int signal = 0;      ///< kExited: the signal that ended it, 0 when it exited
  std::string how;     ///< kExited: "exit code 1", "signal SIGKILL (9)" (ExitStatus::describe)
  int64_t serial = 0;  ///< kSnapshotFetched: the command's serial
  int64_t bytes = 0;   ///< kSnapshotFetched: bytes copied
  int64_t ms = 0;      ///< kSnapshotFetched: how long the copy took (ms)
  std::string to_json() const;
  static NodeEvent from_json(std::string_view text);
  friend bool operator==(const NodeEvent&, const NodeEvent&) = default;
};

// ---- node 0 -> node k ---------------------------------------------------------------------------

/// keys::node_command(k, n): node 0 tells node k's agent what to do, in order (n = 0, 1, …); the
/// agent handles each once and deletes it.
struct NodeCommand {
  enum class Kind {
    kSpawn,    ///< start a process for `slot`: joining `generation` by `decision`, or a warm
               ///< joiner `warm` (>= 0; `standby` too) whose `decision` is the provisional world
    kKill,     ///< SIGKILL the process group of `slot`'s process
    kRelease,  ///< node 0 saw this node's offer withdrawn and none of its slots has a process:
               ///< it may exit 0
    kExit,     ///< the job ended: stop any process left and exit with `code` (`reason` says why)
    kFetchSnapshot,  ///< copy the pause snapshot `serial` from the node serving it at
                     ///< `endpoint` into this node's snapshot path, then say kSnapshotFetched
    kGeneration,     ///< generation `generation` is in force: `decision->active` its members
                     ///< (rank = index): the node's console prefixes and status follow it
    kGivenUp,        ///< node 0 gave this node up (`reason`: no heartbeat for --node-timeout)
                     ///< and trains on without it: stop any process left now and exit 1
  };
  Kind kind = Kind::kSpawn;
  int slot = -1;                     ///< kSpawn, kKill: job slot id
  int64_t generation = -1;           ///< kSpawn of a joiner of a known generation; kGeneration
  int64_t warm = -1;                 ///< kSpawn of a warm joiner: its id
  bool standby = false;              ///< kSpawn of a standby
  std::optional<Decision> decision;  ///< kSpawn: the decision it joins by; kGeneration: active
  int code = 0;                      ///< kExit: the job's exit status
  std::string reason;                ///< kExit, kRelease, kGivenUp: one line
  std::string endpoint;              ///< kFetchSnapshot: "ip:port" of the serving node
  int64_t serial = 0;                ///< kFetchSnapshot: which pause snapshot (Scheduler's serial)
  std::string to_json() const;
  static NodeCommand from_json(std::string_view text);
  friend bool operator==(const NodeCommand&, const NodeCommand&) = default;
};

}  // namespace gpurun::control
