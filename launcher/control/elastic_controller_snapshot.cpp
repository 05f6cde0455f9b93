// ElasticController, the pause snapshot across nodes (docs/cli.md#elastic-nodes, "Pause and
// resume across nodes"): which nodes hold a copy of the current pause snapshot, the copies a
// resume onto other nodes needs (node to node over TCP, not through the store), and a leaving
// node that holds the paused job's only copy, and the loss of the nodes that held the only copies.
// The rest of the controller: elastic_controller.cpp.
#include "control/elastic_controller.hpp"

#include <functional>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <boost/asio/post.hpp>

namespace gpurun::control {

namespace asio = boost::asio;
using supervisor::StreamId;

std::string snapshot_unreachable(const std::set<int>& copies, const std::set<int>& fetching,
                                 const std::function<std::string(int node)>& lost) {
  if (copies.empty() || copies.count(0)) return {};  // node 0's copy is always there
  for (int k : fetching)
    if (k == 0 || lost(k).empty()) return {};  // a copy may still land: its answer decides
  std::vector<std::string> gone;
  for (int k : copies) {
    std::string why = lost(k);
    if (why.empty()) return {};  // live, leaving or released: a resume waits for it (or not)
    gone.push_back(std::move(why));
  }
  std::string on;
  for (const std::string& g : gone) on += (on.empty() ? "" : ", and on ") + g;
  return fmt::format(
      "is on {}; node ids are not reused (a restarted gpurun joins as a new "
      "node), so no node can serve that snapshot again",
      on);
}

void ElasticController::lose_unreachable_snapshot() {
  if (!hub_ || !scheduler_.holds_job_open() || !current_copies()) return;
  const std::string where =
      snapshot_unreachable(copies_, fetching_, [this](int k) { return hub_->lost(k); });
  if (where.empty() || !scheduler_.snapshot_unreachable(where)) return;
  supervisor_.controller_changed();  // no process may be left to end: the job ends now
}

bool ElasticController::current_copies() {
  const int source = scheduler_.snapshot_node();
  if (source < 0) return false;  // no pause snapshot written: as on one node
  if (copies_serial_ != scheduler_.snapshot_serial()) {  // a new snapshot: older copies are stale
    copies_serial_ = scheduler_.snapshot_serial();
    copies_ = {source};
    fetching_.clear();
    unreachable_said_.clear();
    handed_over_.clear();
  }
  return true;
}

std::string ElasticController::snapshot_endpoint(int node) const {
  if (node == 0) return opt_.snapshot_endpoint;
  return hub_->live(node) ? hub_->snapshot_endpoint(node) : std::string();
}

int ElasticController::serving_node() const {
  // The node whose slot wrote it first, else node 0 (a leaving node handed it over there),
  // else any other node with a copy.
  const int source = scheduler_.snapshot_node();
  if (copies_.count(source) && !snapshot_endpoint(source).empty()) return source;
  if (copies_.count(0) && !opt_.snapshot_endpoint.empty()) return 0;
  for (int k : copies_)
    if (!snapshot_endpoint(k).empty()) return k;
  return -1;
}

void ElasticController::copy_snapshot(int from, int to, const std::string& why) {
  const std::string endpoint = snapshot_endpoint(from);
  fetching_.insert(to);
  console_.write(StreamId::kStderr,
                 fmt::format("gpurun: copying the pause snapshot from node {} ({}) to node {} {}\n",
                             from, endpoint, to, why));
  events_.emit("snapshot_copy", supervisor::JsonObject()
                                    .add("from_node", from)
                                    .add("to_node", to)
                                    .add("endpoint", endpoint)
                                    .add("serial", copies_serial_));
  if (to != 0) {
    hub_->fetch_snapshot(to, endpoint, copies_serial_);
    return;
  }
  opt_.fetch_snapshot(endpoint, copies_serial_,
                      [this, alive = std::weak_ptr<int>(alive_)](const NodeEvent& e) {
                        asio::post(io_, [this, alive, e] {
                          if (alive.expired()) return;
                          snapshot_copied(0, e);
                          run_effects();
                        });
                      });
}

bool ElasticController::snapshot_on_nodes(const std::vector<int>& target) {
  if (!current_copies()) return true;
  std::set<int> nodes;
  for (int slot : target) nodes.insert(slot_node(slot));
  bool ready = true;
  for (int k : nodes) {
    if (copies_.count(k)) continue;
    ready = false;
    if (fetching_.count(k)) continue;
    const int from = serving_node();
    const bool can = from >= 0 && (k == 0 ? static_cast<bool>(opt_.fetch_snapshot) : hub_->live(k));
    if (!can) {
      if (unreachable_said_.insert(k).second)
        console_.write(
            StreamId::kStderr,
            fmt::format("gpurun: the resume onto [{}] waits: the pause snapshot is on node {}, "
                        "which {}; a config that resumes on node {}'s slots goes on\n",
                        join_ids(target, ", "),
                        join_ids(std::vector<int>(copies_.begin(), copies_.end()), ", "),
                        from < 0 ? "no longer serves it (gone)"
                                 : fmt::format("cannot send it to node {}", k),
                        from < 0 ? scheduler_.snapshot_node() : from));
      continue;
    }
    copy_snapshot(from, k, fmt::format("for the resume onto [{}]", join_ids(target, ", ")));
  }
  return ready;
}

bool ElasticController::keep_for_snapshot(int node) {
  // Only while the job is paused: its state is then in the pause snapshot alone.
  if (!scheduler_.active().empty() || !current_copies() || !copies_.count(node)) return false;
  for (int k : copies_)
    if (k != node && !snapshot_endpoint(k).empty()) return false;  // another node keeps it
  if (fetching_.count(0)) return true;
  if (!handed_over_.insert(node).second) return false;  // tried: it failed (said), let it go
  if (!opt_.fetch_snapshot || snapshot_endpoint(node).empty()) {
    console_.write(StreamId::kStderr,
                   fmt::format("gpurun: warning: node {} leaves while the job is paused and holds "
                               "its only pause snapshot, which node 0 cannot copy: the training "
                               "state leaves with it\n",
                               node));
    return false;
  }
  copy_snapshot(node, 0,
                fmt::format("before node {} leaves: the job is paused and node {} holds its only "
                            "pause snapshot (node {} is released once it is copied)",
                            node, node, node));
  return true;
}

void ElasticController::snapshot_copied(int node, const NodeEvent& e) {
  fetching_.erase(node);
  if (e.serial != copies_serial_) return;  // a copy of an older snapshot
  if (!e.how.empty()) {
    console_.write(StreamId::kStderr,
                   fmt::format("gpurun: copying the pause snapshot to node {} failed: {}; the "
                               "resume waits (a config edit tries again)\n",
                               node, e.how));
    events_.emit("snapshot_copied", supervisor::JsonObject().add("node", node).add("error", e.how));
    return;
  }
  copies_.insert(node);
  const double mb_s =
      e.ms > 0 ? static_cast<double>(e.bytes) / 1e6 / (static_cast<double>(e.ms) / 1e3) : 0.0;
  console_.write(StreamId::kStderr,
                 fmt::format("gpurun: node {} has the pause snapshot: {} bytes in {} ms ({:.0f} "
                             "MB/s)\n",
                             node, e.bytes, e.ms, mb_s));
  events_.emit("snapshot_copied", supervisor::JsonObject()
                                      .add("node", node)
                                      .add("bytes", e.bytes)
                                      .add("ms", e.ms)
                                      .add("serial", e.serial));
  scheduler_.try_resume();
}

}  // namespace gpurun::control
