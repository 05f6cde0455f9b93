#include "control/node_hub.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "gpurun/json_writer.hpp"

namespace gpurun::control {

namespace {

std::string seconds_text(std::chrono::milliseconds d) {
  return fmt::format("{:g} s", static_cast<double>(d.count()) / 1000.0);
}

// 127.0.0.0/8, ::1, ::ffff:127.x: every node on one host shares it.
bool loopback(const std::string& address) {
  return address.rfind("127.", 0) == 0 || address == "::1" || address.rfind("::ffff:127.", 0) == 0;
}

}  // namespace

NodeHub::NodeHub(store::Backend& backend, NodeHubOptions options, std::function<double()> now_ms)
    : backend_(backend),
      opt_(std::move(options)),
      now_ms_(std::move(now_ms)),
      beats_(now_ms_ ? opt_.node_timeout : std::chrono::milliseconds(0)) {
  backend_.set(keys::node_job(), opt_.run_id);
}

std::chrono::milliseconds NodeHub::now() const {
  return std::chrono::milliseconds(now_ms_ ? static_cast<int64_t>(now_ms_()) : 0);
}

NodeHub::Node* NodeHub::node(int k) {
  auto it = nodes_.find(k);
  return it == nodes_.end() ? nullptr : &it->second;
}

std::vector<int> NodeHub::job_ids(int k, const std::vector<int>& local) const {
  std::vector<int> out;
  for (int i : local)
    if (i >= 0 && i < kSlotsPerNode) out.push_back(job_slot(k, i));
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::optional<NodeHub::Changes> NodeHub::on_key(const std::string& key) {
  const std::optional<keys::NodeWrite> w = keys::parse_node_write(key);
  if (!w) return std::nullopt;
  Changes out;
  const int k = w->node;
  switch (w->kind) {
    case keys::NodeWrite::Kind::kJoin: {
      if (nodes_.count(k)) return out;  // written once; a repeat changes nothing
      NodeJoin j;
      try {
        j = NodeJoin::from_json(backend_.get(key));
      } catch (const ProtocolError& e) {
        out.lines.push_back(fmt::format("warning: ignoring node {}'s join: {}", k, e.what()));
        backend_.set(keys::node_answer(k),
                     fmt::format("refused: node 0 cannot read its join record: {}", e.what()));
        return out;
      }
      Node n;
      n.join = j;
      n.name = fmt::format("node {} ({}, gpurun pid {})", k, j.host, j.pid);
      if (j.node != k) {
        out.lines.push_back(
            fmt::format("warning: ignoring the join under '{}': it names node {}", key, j.node));
        return out;
      }
      if (opt_.max_nodes > 0 && live_nodes() + 1 >= opt_.max_nodes) {
        const std::string why =
            fmt::format("the job already has {} nodes, the most --nnodes allows ({})",
                        live_nodes() + 1, opt_.max_nodes);
        out.lines.push_back(fmt::format("{} is refused: {}", n.name, why));
        n.lost = true;
        n.refused = true;
        Node& kept = nodes_[k] = std::move(n);
        NodeCommand c;
        c.kind = NodeCommand::Kind::kExit;
        c.code = 1;
        c.reason = "node 0 refused this node: " + why;
        command(kept, c);
        backend_.set(keys::node_answer(k), "refused: " + why);
        return out;
      }
      backend_.set(keys::node_answer(k), "admitted");
      n.offer = job_ids(k, j.offer);
      if (j.monotonic_ms > 0 && now_ms_) n.clock_offset_ms = now_ms_() - j.monotonic_ms;
      out.new_slots = job_ids(k, j.slots);
      out.offers_changed = true;
      out.lines.push_back(fmt::format("{} joined the job: slots [{}], offered [{}]", n.name,
                                      join_ids(out.new_slots, ", "), join_ids(n.offer, ", ")));
      nodes_[k] = std::move(n);
      beats_.watch(k, now());  // a whole --node-timeout from its join for its first heartbeat
      return out;
    }
    case keys::NodeWrite::Kind::kOffer: {
      Node* n = node(k);
      if (!n || n->lost) return out;
      std::vector<int> offer;
      try {
        offer = job_ids(k, parse_ids(backend_.get(key)));
      } catch (const ProtocolError& e) {
        out.lines.push_back(fmt::format("warning: ignoring {}'s offer: {}", n->name, e.what()));
        return out;
      }
      const std::vector<int> slots = job_ids(k, n->join.slots);
      std::vector<int> kept;
      std::set_intersection(offer.begin(), offer.end(), slots.begin(), slots.end(),
                            std::back_inserter(kept));
      if (kept == n->offer) return out;
      n->offer = kept;
      out.offers_changed = true;
      out.lines.push_back(kept.empty()
                              ? fmt::format("{} withdrew its offer: its slots leave the job at "
                                            "the next boundary",
                                            n->name)
                              : fmt::format("{} offers [{}]", n->name, join_ids(kept, ", ")));
      return out;
    }
    case keys::NodeWrite::Kind::kLeave: {
      Node* n = node(k);
      if (!n || n->lost || n->leaving) return out;
      n->leaving = true;
      out.withdrawn = job_ids(k, n->join.slots);
      if (!n->offer.empty()) out.offers_changed = true;
      n->offer.clear();
      const std::string why = backend_.get(key);
      out.lines.push_back(
          fmt::format("{} is leaving the job ({}): its slots leave at the next "
                      "boundary",
                      n->name, why.empty() ? "asked" : why));
      return out;
    }
    case keys::NodeWrite::Kind::kEvent: {
      Node* n = node(k);
      if (!backend_.check({key})) return out;  // handled already
      const std::string text = backend_.get(key);
      backend_.delete_key(key);
      if (!n) return out;
      NodeEvent e;
      try {
        e = NodeEvent::from_json(text);
      } catch (const ProtocolError& err) {
        out.lines.push_back(fmt::format("warning: ignoring {}'s event: {}", n->name, err.what()));
        return out;
      }
      if (e.kind == NodeEvent::Kind::kSnapshotFetched) {
        out.fetched.emplace_back(k, e);
        return out;
      }
      if (slot_node(e.slot) != k) {
        out.lines.push_back(fmt::format("warning: ignoring {}'s event about slot {} of node {}",
                                        n->name, e.slot, slot_node(e.slot)));
        return out;
      }
      Remote& r = remote_[e.slot];
      if (e.kind == NodeEvent::Kind::kSpawned) {
        if (e.pid > 0 && r.pid >= 0) {
          r.pid = e.pid;
          out.started.emplace_back(e.slot, e.pid);
        }
        return out;
      }
      if (r.pid < 0) return out;  // its end was taken already (its node was lost)
      r.pid = -1;
      out.exits.push_back(Exit{e.slot, e.code == 0 && e.signal == 0,
                               e.how.empty() ? fmt::format("exit code {}", e.code) : e.how});
      return out;
    }
    case keys::NodeWrite::Kind::kLost: {
      Node* n = node(k);
      if (!n || n->lost) return out;
      lose(k, *n, "its gpurun's store connection closed", out);
      return out;
    }
    case keys::NodeWrite::Kind::kBeat: {
      const Node* n = node(k);
      if (n && !n->lost) beats_.seen(k, backend_.get(key), now());
      return out;
    }
  }
  return out;
}

void NodeHub::lose(int k, Node& n, const std::string& why, Changes& out) {
  n.lost = true;
  beats_.forget(k);
  if (!n.offer.empty()) out.offers_changed = true;
  n.offer.clear();
  if (n.released || n.ended) return;  // it left as told
  n.lost_why = why;
  for (int slot : job_ids(k, n.join.slots)) out.withdrawn.push_back(slot);  // maybe several nodes
  out.lines.push_back(
      fmt::format("{} was lost: {}; the job goes on without its slots", n.name, why));
  for (auto& [slot, r] : remote_) {
    if (slot_node(slot) != k || r.pid < 0) continue;
    out.exits.push_back(Exit{slot, false, fmt::format("the loss of {} ({})", n.name, why)});
    r.pid = -1;
  }
  sever(k, n, out);
}

void NodeHub::sever(int k, const Node& n, Changes& out) {
  const std::string& a = n.join.address;
  if (!opt_.sever || !opt_.generation || a.empty()) return;
  // Its address is this host's or a live node's: cutting it would cut live ranks too. Its
  // workers live on (silent, not dead) and nothing closes their connections.
  const auto unseverable = [&] {
    if (!n.silent) return;  // its gpurun died: its workers with it, their connections closed
    out.lines.push_back(fmt::format(
        "{}'s workers share the address {} with this host or another node: their connections "
        "cannot be cut from here, so survivors waiting on them inside a collective go on only "
        "when it fails (GPURUN_COMM_TIMEOUT_MS, default 300 s) or those processes end",
        n.name, a));
  };
  if (loopback(a) || std::find(opt_.own_addresses.begin(), opt_.own_addresses.end(), a) !=
                         opt_.own_addresses.end())
    return unseverable();
  for (const auto& [other, o] : nodes_)
    if (other != k && !o.lost && !o.released && !o.ended && o.join.address == a)
      return unseverable();
  const int64_t g = opt_.generation();
  backend_.set(keys::sever(next_sever_++), keys::sever_value({g, a}));
  out.lines.push_back(fmt::format(
      "the workers of generation {} shut down their connections to {} ({}'s address): a "
      "collective waiting on its workers fails now",
      g, a, n.name));
}

NodeHub::Changes NodeHub::check_heartbeats() {
  Changes out;
  const std::chrono::milliseconds t = now();
  if (const auto away = beats_.checked(t)) {  // node 0 itself was stopped: no node is blamed
    out.lines.push_back(fmt::format(
        "node 0's gpurun did not run for {} (stopped, or its host stalled): no node is given up "
        "for that; every node's heartbeat gets a whole --node-timeout ({}) from now",
        seconds_text(*away), seconds_text(beats_.timeout())));
    return out;
  }
  for (auto& [k, n] : nodes_) {
    if (n.lost || n.released || n.ended) continue;
    const std::optional<std::chrono::milliseconds> silent = beats_.overdue(k, t);
    if (!silent) continue;
    const std::string why = fmt::format(
        "its gpurun sent no heartbeat for {} (--node-timeout {}): its link to node 0 is cut, or "
        "its host stopped or hung",
        seconds_text(*silent), seconds_text(beats_.timeout()));
    n.silent = true;
    lose(k, n, why, out);
    // Should its link come back, it stops its workers and exits rather than train on alone.
    NodeCommand c;
    c.kind = NodeCommand::Kind::kGivenUp;
    c.reason = why;
    command(n, c);
  }
  return out;
}

int NodeHub::spawn(int slot, int64_t generation, int64_t warm, bool standby,
                   const Decision& decision) {
  Node* n = node(slot_node(slot));
  if (!n || n->lost || n->ended) return -1;
  NodeCommand c;
  c.kind = NodeCommand::Kind::kSpawn;
  c.slot = slot;
  c.generation = generation;
  c.warm = warm;
  c.standby = standby;
  c.decision = decision;
  command(*n, c);
  const int pid = next_provisional_++;
  remote_[slot].pid = pid;
  return pid;
}

void NodeHub::kill(int slot) {
  Node* n = node(slot_node(slot));
  if (!n || n->lost || n->ended) return;
  NodeCommand c;
  c.kind = NodeCommand::Kind::kKill;
  c.slot = slot;
  command(*n, c);
}

bool NodeHub::fetch_snapshot(int k, const std::string& endpoint, int64_t serial) {
  Node* n = node(k);
  if (!n || n->lost || n->released || n->ended) return false;
  NodeCommand c;
  c.kind = NodeCommand::Kind::kFetchSnapshot;
  c.endpoint = endpoint;
  c.serial = serial;
  command(*n, c);
  return true;
}

std::string NodeHub::snapshot_endpoint(int k) const {
  const auto it = nodes_.find(k);
  if (it == nodes_.end() || it->second.lost) return {};
  return it->second.join.snapshot_endpoint;
}

double NodeHub::clock_offset_ms(int k) const {
  const auto it = nodes_.find(k);
  return it == nodes_.end() ? 0.0 : it->second.clock_offset_ms;
}

bool NodeHub::live(int k) const {
  const auto it = nodes_.find(k);
  return it != nodes_.end() && !it->second.lost && !it->second.released && !it->second.ended;
}

std::string NodeHub::lost(int k) const {
  const auto it = nodes_.find(k);
  if (it == nodes_.end() || !it->second.lost || it->second.lost_why.empty()) return {};
  return fmt::format("{}, which was lost: {}", it->second.name, it->second.lost_why);
}

void NodeHub::command(Node& n, const NodeCommand& c) {
  backend_.set(keys::node_command(n.join.node, n.next_command++), c.to_json());
}

bool NodeHub::remote_pid(int pid) const {
  if (pid >= kProvisionalBase) return true;
  for (const auto& [slot, r] : remote_)
    if (r.pid == pid) return true;
  return false;
}

std::vector<int> NodeHub::offered() const {
  std::vector<int> out;
  for (const auto& [k, n] : nodes_)
    if (!n.lost && !n.released) out.insert(out.end(), n.offer.begin(), n.offer.end());
  std::sort(out.begin(), out.end());
  return out;
}

bool NodeHub::remote_processes() const {
  return std::any_of(remote_.begin(), remote_.end(),
                     [](const auto& r) { return r.second.pid >= 0; });
}

void NodeHub::release_idle(const std::function<bool(int slot)>& has_process,
                           const std::function<bool(int node)>& keep) {
  for (auto& [k, n] : nodes_) {
    if (!n.leaving || n.lost || n.released || n.ended) continue;
    const std::vector<int> slots = job_ids(k, n.join.slots);
    if (std::any_of(slots.begin(), slots.end(), [&](int s) {
          const auto r = remote_.find(s);
          return (r != remote_.end() && r->second.pid >= 0) || has_process(s);
        }))
      continue;
    if (keep && keep(k)) continue;
    n.released = true;
    NodeCommand c;
    c.kind = NodeCommand::Kind::kRelease;
    c.reason = "none of its slots has a process left";
    command(n, c);
  }
}

void NodeHub::generation(int64_t generation, const std::vector<int>& active) {
  NodeCommand c;
  c.kind = NodeCommand::Kind::kGeneration;
  c.generation = generation;
  c.decision = Decision{};
  c.decision->generation = generation;
  c.decision->active = active;
  for (auto& [k, n] : nodes_)
    if (!n.lost && !n.released && !n.ended) command(n, c);
}

void NodeHub::job_ended(int code, const std::string& reason) {
  for (auto& [k, n] : nodes_) {
    if (n.lost || n.released || n.ended) continue;
    n.ended = true;
    NodeCommand c;
    c.kind = NodeCommand::Kind::kExit;
    c.code = code;
    c.reason = reason;
    command(n, c);
  }
}

int NodeHub::live_nodes() const {
  int live = 0;
  for (const auto& [k, n] : nodes_)
    if (!n.lost && !n.released) ++live;
  return live;
}

std::string NodeHub::status_json() const {
  std::string out = "[";
  for (const auto& [k, n] : nodes_) {
    JsonObject o;
    o.add("node", k)
        .add("host", n.join.host)
        .add("pid", n.join.pid)
        // A node told to go (released, refused, the job's end) that then disconnects is not lost.
        .add("state", n.refused         ? "refused"
                      : n.released      ? "released"
                      : n.ended         ? "ended"
                      : n.lost          ? "lost"
                      : n.leaving       ? "leaving"
                      : n.offer.empty() ? "idle"
                                        : "live")
        .add_raw("slots", ids_json(job_ids(k, n.join.slots)))
        .add_raw("offer", ids_json(n.offer));
    if (!n.lost_why.empty()) o.add("lost", n.lost_why);
    out += (out.size() > 1 ? "," : "") + o.str();
  }
  return out + "]";
}

}  // namespace gpurun::control
