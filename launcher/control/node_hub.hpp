// gpurun::control::NodeHub — node 0's side of one elastic job over several gpurun nodes
// (docs/cli.md#elastic-nodes): the nodes that joined (their slots, what they offer, whether
// they live), the commands node 0 sends them (spawn, kill, release, exit) and the events they
// send back (a process started, a process ended), all through node 0's store
// (gpurun/control/node_messages.hpp, keys::node_*). The ElasticController owns it: the
// scheduler decides over every node's slots; the hub carries the process effects of another
// node's slots there and brings their exits back.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "gpurun/control/decision.hpp"
#include "gpurun/control/heartbeat.hpp"
#include "gpurun/control/keys.hpp"
#include "gpurun/control/node_messages.hpp"
#include "store/backend.hpp"

namespace gpurun::control {

/// Settings of node 0's hub.
struct NodeHubOptions {
  std::string run_id;  ///< node 0's: written to keys::node_job() (joining nodes check it)
  /// --nnodes MIN:MAX's MAX: a node that would make the job larger is refused; 0 = no limit.
  int max_nodes = 0;
  /// --node-timeout: a node whose heartbeat (keys::node_beat) has not advanced for this long on
  /// node 0's clock (`now_ms`) is lost, as if its store connection closed (check_heartbeats;
  /// the rule: control::HeartbeatWatch). 0 = never.
  std::chrono::milliseconds node_timeout{0};
  /// Node 0's host's own addresses (every interface's): never severed (keys::sever): a lost
  /// node on node 0's host shares them with node 0's workers and store.
  std::vector<std::string> own_addresses;
  /// False: no address is ever severed (node 0's own addresses are unknown).
  bool sever = true;
  /// The generation in force (the scheduler's): a lost node's address is severed for it.
  /// Empty: no address is ever severed.
  std::function<int64_t()> generation;
};

/// One per elastic node 0 with --nnodes > 1. Io thread only (the controller's). The backend
/// must outlive it.
class NodeHub {
 public:
  /// `now_ms`: node 0's monotonic clock (ms), as the resize timings read it (tests: a fake).
  NodeHub(store::Backend& backend, NodeHubOptions options,
          std::function<double()> now_ms = nullptr);

  /// A process of another node ended (or its node was lost): the controller takes it as a
  /// local exit of that slot.
  struct Exit {
    int slot = -1;
    bool clean = false;  ///< exit code 0
    std::string how;     ///< "exit code 1", "signal SIGKILL (9)", "node 1 (host) was lost: …"
  };
  /// What a store write under gpurun/node/ or gpurun/lost/ changed.
  struct Changes {
    std::vector<int> new_slots;  ///< job slot ids of a node that joined
    std::vector<int> withdrawn;  ///< job slot ids of a node that is leaving or was lost
    bool offers_changed = false;
    std::vector<std::pair<int, int>> started;  ///< (slot, real pid) of a started process
    std::vector<Exit> exits;
    /// kSnapshotFetched events: (node, the event) — `how` empty when the copy is in place.
    std::vector<std::pair<int, NodeEvent>> fetched;
    std::vector<std::string> lines;  ///< console lines (without "gpurun: ")
    bool any() const {
      return !new_slots.empty() || !withdrawn.empty() || offers_changed || !started.empty() ||
             !exits.empty() || !fetched.empty() || !lines.empty();
    }
  };
  /// Handles `key` if it is a node's join, offer, leave, event, lost or heartbeat key
  /// (keys::parse_node_write); nullopt for any other key.
  std::optional<Changes> on_key(const std::string& key);
  /// Every live node whose heartbeat has not advanced for --node-timeout (NodeHubOptions) is
  /// lost now: the same Changes as its store connection's close (its slots withdrawn, its
  /// processes' exits), with a line naming the node, how long it was silent and the timeout.
  /// Call it every heartbeat_interval(node_timeout). Nothing when node_timeout is 0.
  Changes check_heartbeats();

  /// Whether `slot` runs on another node (its process effects go through the hub).
  static bool remote(int slot) { return slot_node(slot) != 0; }
  /// Sends node slot_node(slot) a spawn command; returns the provisional pid the slot has until
  /// the node says which process started (Changes::started), or -1 when the node is gone (its
  /// exit is then reported by the next on_key… never: the caller takes -1 as "could not start").
  int spawn(int slot, int64_t generation, int64_t warm, bool standby, const Decision& decision);
  /// Sends a kill command for `slot`'s process (no-op when its node is gone).
  void kill(int slot);
  /// Tells node `node` to copy pause snapshot `serial` from the node serving it at `endpoint`
  /// (its answer: Changes::fetched). False when the node is gone.
  bool fetch_snapshot(int node, const std::string& endpoint, int64_t serial);
  /// Where node `node` serves its pause snapshot ("ip:port"); "" when unknown or gone.
  std::string snapshot_endpoint(int node) const;
  /// What to add to node `node`'s monotonic clock readings (ms) to get node 0's: from its join
  /// record, to one store latency; 0 for node 0, an unknown node or one that gave none.
  double clock_offset_ms(int node) const;
  /// Whether node `node` (>= 1) is in the job and connected.
  bool live(int node) const;
  /// Node `node` was lost (its gpurun died, or was given up for no heartbeat), not released
  /// or told exit first: "node 1 (host, gpurun pid 4001), which was lost: <why>"; "" otherwise
  /// (live, released, ended, unknown). Node ids are not reused: it never comes back.
  std::string lost(int node) const;
  /// Whether `pid` is a process of another node (provisional or real): /proc is not its own.
  bool remote_pid(int pid) const;
  /// The job slot ids every live node offers now (sorted).
  std::vector<int> offered() const;
  /// Whether any process runs on another node (started, not known to have ended).
  bool remote_processes() const;
  /// After each batch of effects: a node whose offer is withdrawn and none of whose slots has a
  /// process (`has_process(slot)`) is told `release` (once), unless `keep(node)` holds it a
  /// while longer (the paused job's only pause snapshot is on it, being copied away).
  void release_idle(const std::function<bool(int slot)>& has_process,
                    const std::function<bool(int node)>& keep = {});
  /// Generation `generation` is in force with members `active` (job slot ids, rank = index):
  /// every live node is told (kGeneration), for its console prefixes and status.json.
  void generation(int64_t generation, const std::vector<int>& active);
  /// The job ended with `code`: every live node is told `exit` (once).
  void job_ended(int code, const std::string& reason);
  /// Nodes still connected (joined, not lost, store connection open).
  int live_nodes() const;
  /// status.json's "nodes" array: node, host, pid, state (live, leaving, released, lost),
  /// slots, offer (job slot ids); a lost node's "lost" says why (its store connection closed,
  /// or no heartbeat for how long).
  std::string status_json() const;

 private:
  struct Node {
    NodeJoin join;
    std::vector<int> offer;  ///< job slot ids
    bool lost = false;
    bool leaving = false;   ///< it said so (keys::node_leave): its offer is gone for good
    bool released = false;  ///< told release
    bool refused = false;   ///< beyond --nnodes MAX: told exit at its join
    bool ended = false;     ///< told exit
    int64_t next_command = 0;
    std::string name;            ///< "node 1 (host)"
    double clock_offset_ms = 0;  ///< node 0's monotonic ms minus its own, when it joined
    std::string lost_why;        ///< lost: why ("its gpurun's store connection closed")
    bool silent = false;         ///< lost for no heartbeat (its processes may live on)
  };
  struct Remote {
    int pid = -1;  ///< provisional or real; -1 none
  };
  void command(Node& n, const NodeCommand& c);
  /// Node `k` is lost (`why`: "its gpurun's store connection closed"): its slots withdrawn,
  /// its processes' exits, the console line, its address severed.
  void lose(int k, Node& n, const std::string& why, Changes& out);
  /// Writes keys::sever for `n`'s address unless it is loopback or another node's (or node 0's).
  void sever(int k, const Node& n, Changes& out);
  std::chrono::milliseconds now() const;
  Node* node(int k);
  std::vector<int> job_ids(int k, const std::vector<int>& local) const;

  store::Backend& backend_;
  NodeHubOptions opt_;
  std::function<double()> now_ms_;
  std::map<int, Node> nodes_;
  std::map<int, Remote> remote_;  ///< job slot -> its process on another node
  int next_provisional_ = kProvisionalBase;
  HeartbeatWatch beats_;
  int64_t next_sever_ = 0;
  static constexpr int kProvisionalBase = 1 << 30;
};

}  // namespace gpurun::control
