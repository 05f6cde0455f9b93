#include "nodes/node_sync.hpp"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <thread>
#include <utility>

#include <fmt/format.h>
#include <boost/asio/post.hpp>

#include "gpurun/error.hpp"
#include "gpurun/store/client_store.hpp"
#include "gpurun/store/live_keys.hpp"
#include "nodes/node_sync_detail.hpp"
#include "supervisor/process_spawner.hpp"

namespace gpurun::supervisor {

namespace {
using namespace node_sync_detail;
}  // namespace

namespace job_keys {
std::string join(int node) {
  return fmt::format("gpurun/job/join/{}", node);
}
std::string start() {
  return "gpurun/job/start";
}
std::string fail(int attempt, int node) {
  return fmt::format("gpurun/job/{}/fail/{}", attempt, node);
}
std::string stop(int attempt) {
  return fmt::format("gpurun/job/{}/stop", attempt);
}
std::string end(int attempt, int node) {
  return fmt::format("gpurun/job/{}/end/{}", attempt, node);
}
std::string next(int attempt) {
  return fmt::format("gpurun/job/{}/next", attempt);
}
std::string live(int node) {
  return fmt::format("{}node{}", store::kLivePrefix, node);
}
std::string lost(int node) {
  return fmt::format("{}node{}", store::kLostPrefix, node);
}
std::string beat(int node) {
  return fmt::format("gpurun/beat/node{}", node);
}
std::string next_node() {
  return "gpurun/job/next_node";
}
std::string job_id() {
  return "gpurun/job/id";
}
std::string members(int attempt) {
  return fmt::format("gpurun/job/{}/nodes", attempt);
}
}  // namespace job_keys

std::string NodeFailure::encode() const {
  return fmt::format("{} {} {} {} {} {}", time_ms, node, rank, local_rank, code, one_line(reason));
}

std::optional<NodeFailure> NodeFailure::decode(const std::string& text) {
  std::vector<std::string> f;
  NodeFailure out;
  if (!split_fields(text, 5, f, out.reason)) return std::nullopt;
  if (!parse_int(f[0], out.time_ms) || !parse_int(f[1], out.node) || !parse_int(f[2], out.rank) ||
      !parse_int(f[3], out.local_rank) || !parse_int(f[4], out.code))
    return std::nullopt;
  return out;
}

std::optional<NodeFailure> root_cause(const std::vector<NodeFailure>& failures) {
  if (failures.empty()) return std::nullopt;
  return *std::min_element(failures.begin(), failures.end(), [](const auto& a, const auto& b) {
    return a.time_ms != b.time_ms ? a.time_ms < b.time_ms : a.node < b.node;
  });
}

std::string AttemptOutcome::encode() const {
  if (restart) return "restart " + one_line(reason);
  return fmt::format("exit {} {}", code, one_line(reason));
}

std::optional<AttemptOutcome> AttemptOutcome::decode(const std::string& text) {
  AttemptOutcome out;
  std::vector<std::string> f;
  if (text.rfind("restart", 0) == 0) {
    out.restart = true;
    out.reason = text.size() > 8 ? text.substr(8) : "";
    return out;
  }
  if (!split_fields(text, 2, f, out.reason) || f[0] != "exit" || !parse_int(f[1], out.code) ||
      out.code < 0 || out.code > 255)
    return std::nullopt;
  return out;
}

NodeSync::NodeSync(boost::asio::io_context& io, NodeSyncOptions options, store::HostedStore& local)
    : io_(io), opt_(std::move(options)), host_(&local), timer_(io) {
  hosts_.assign(static_cast<std::size_t>(max_nodes()), "");
  set_members({});
  hosts_[0] = this_host();
  local.set(job_keys::job_id(), opt_.run_id);  // a joining node checks it (check_run_id)
}

NodeSync::NodeSync(boost::asio::io_context& io, NodeSyncOptions options)
    : io_(io), opt_(std::move(options)), timer_(io) {
  hosts_.assign(static_cast<std::size_t>(max_nodes()), "");
  set_members({});
}

void NodeSync::set_members(std::vector<int> members) {
  if (members.empty())  // every node of the job: 0 .. nnodes - 1
    for (int r = 0; r < opt_.nnodes; ++r) members.push_back(r);
  members_ = std::move(members);
  opt_.nnodes = static_cast<int>(members_.size());
}

NodeSync::~NodeSync() = default;

std::string NodeSync::node_name(int node) const {
  const auto i = static_cast<std::size_t>(node);
  if (i < hosts_.size() && !hosts_[i].empty()) return fmt::format("node {} ({})", node, hosts_[i]);
  return fmt::format("node {}", node);
}

void NodeSync::arm(std::function<void()> tick) {
  tick_ = std::move(tick);
  timer_.expires_after(opt_.poll_interval);
  timer_.async_wait([this](const boost::system::error_code& ec) {
    if (ec || !tick_) return;
    std::function<void()> t = std::move(tick_);
    tick_ = nullptr;
    t();
  });
}

bool NodeSync::node_lost(int node) {
  return store().try_get(job_keys::lost(node)).has_value();
}

void NodeSync::attempt_started(int attempt) {
  attempt_ = attempt;
  watching_ = true;
  peer_stopped_ = false;
  announced_ = false;
  const auto n = static_cast<std::size_t>(std::max(max_nodes(), opt_.nnodes));  // by first rank
  // Every node gets a whole timeout from the start.
  beat_watch_ = control::HeartbeatWatch(opt_.heartbeat_timeout);
  for (std::size_t r = 0; r < n; ++r) beat_watch_.watch(static_cast<int>(r), steady_ms());
  hung_.assign(n, false);
  beat_sent_ = {};
  arm([this] { watch_tick(); });
}

void NodeSync::beat() {
  if (host_ || Clock::now() - beat_sent_ < opt_.heartbeat_interval) return;
  store().set(job_keys::beat(opt_.node_rank), std::to_string(++beats_));
  beat_sent_ = Clock::now();
}

bool NodeSync::node_hung(int r) {
  const auto i = static_cast<std::size_t>(r);
  if (opt_.heartbeat_timeout.count() <= 0 || i >= hung_.size()) return false;
  if (hung_[i]) return true;
  const auto now = steady_ms();
  beat_watch_.seen(r, store().try_get(job_keys::beat(r)).value_or(""), now);
  if (!beat_watch_.overdue(r, now)) return false;
  hung_[i] = true;
  const int a = attempt_;
  if (!store().try_get(job_keys::fail(a, r))) {
    NodeFailure f;
    f.node = r;
    f.time_ms = now_ms();
    f.reason = fmt::format(
        "{}'s gpurun sent no heartbeat for {} with its connection to node 0's store still open "
        "(stopped or hung, or its host stalled; --node-timeout)",
        node_name(r), seconds(opt_.heartbeat_timeout));
    store().set(job_keys::fail(a, r), f.encode());
    store().compare_set(job_keys::stop(a), "", std::to_string(r));
  }
  return true;
}

void NodeSync::watch_tick() {
  if (!watching_) return;
  const int a = attempt_;
  try {
    beat();
    // Node 0 itself did not run for a while (stopped): no node is blamed for that silence.
    if (host_) (void)beat_watch_.checked(steady_ms());
    if (host_) {  // node 0: a node whose gpurun vanished mid-attempt is a failure
      for (const int r : members_) {
        if (r == 0 || store().try_get(job_keys::end(a, r))) continue;
        const auto lost = store().try_get(job_keys::lost(r));
        if (!lost) {
          node_hung(r);  // alive but silent: given up after heartbeat_timeout
          continue;
        }
        if (store().try_get(job_keys::fail(a, r))) continue;
        NodeFailure f;
        f.node = r;
        if (!parse_int(*lost, f.time_ms)) f.time_ms = now_ms();
        f.reason = fmt::format(
            "{}'s gpurun disconnected from node 0's store (killed, or its host or network "
            "failed)",
            node_name(r));
        store().set(job_keys::fail(a, r), f.encode());
        store().compare_set(job_keys::stop(a), "", std::to_string(r));
      }
    }
    if (const auto stopper = store().try_get(job_keys::stop(a)); stopper && !peer_stopped_) {
      int node = -1, sig = 0;
      std::vector<std::string> f;
      std::string rest;
      if (!split_fields(*stopper, 1, f, rest) || !parse_int(f[0], node)) node = -1;
      if (!rest.empty() && !parse_int(rest, sig)) sig = 0;
      if (node != opt_.node_rank) {
        peer_stopped_ = true;
        std::string why = fmt::format("{} failed", node >= 0 ? node_name(node) : "a node");
        if (node >= 0)
          if (const auto rec = store().try_get(job_keys::fail(a, node)))
            if (const auto f = NodeFailure::decode(*rec))
              why = f->rank >= 0 ? why + ": " + f->reason : f->reason;
        if (on_peer_failure) on_peer_failure(why, sig);
      }
    }
  } catch (const gpurun::Error& e) {  // nodes > 0: node 0's store is gone
    watching_ = false;
    node0_gone_ = true;
    node0_error_ = fmt::format(
        "node 0's store at {}:{} is gone ({}): node 0's gpurun stopped or its host failed",
        opt_.host, opt_.port, e.what());
    if (on_peer_failure) on_peer_failure(node0_error_, 0);
    return;
  }
  arm([this] { watch_tick(); });
}

void NodeSync::local_failure(int attempt, const NodeFailure& failure) {
  NodeFailure f = failure;
  f.node = opt_.node_rank;
  if (f.time_ms == 0) f.time_ms = now_ms();
  try {
    store().set(job_keys::fail(attempt, opt_.node_rank), f.encode());
    store().compare_set(job_keys::stop(attempt), "", std::to_string(opt_.node_rank));
  } catch (const gpurun::Error& e) {
    node0_gone_ = true;
    node0_error_ =
        fmt::format("node 0's store at {}:{} is gone ({})", opt_.host, opt_.port, e.what());
  }
}

void NodeSync::local_signal(int attempt, int sig) {
  if (node0_gone_ || attempt < 0) return;
  NodeFailure f;
  f.time_ms = now_ms();
  f.node = opt_.node_rank;
  f.code = 128 + sig;
  f.reason = fmt::format("{}'s gpurun received {}", node_name(opt_.node_rank), signal_name(sig));
  try {
    store().compare_set(job_keys::fail(attempt, opt_.node_rank), "", f.encode());
    store().compare_set(job_keys::stop(attempt), "", fmt::format("{} {}", opt_.node_rank, sig));
  } catch (const gpurun::Error& e) {
    node0_gone_ = true;
    node0_error_ =
        fmt::format("node 0's store at {}:{} is gone ({})", opt_.host, opt_.port, e.what());
  }
}

void NodeSync::attempt_ended(int attempt, int code, bool by_signal,
                             std::function<void(const AttemptOutcome&)> decide) {
  watching_ = false;
  tick_ = nullptr;
  timer_.cancel();
  attempt_ = attempt;
  decide_ = std::move(decide);
  own_code_ = code;
  own_by_signal_ = by_signal;
  interrupted_ = false;
  if (!node0_gone_) {
    try {
      store().set(job_keys::end(attempt, opt_.node_rank),
                  fmt::format("{} {}", code, by_signal ? 1 : 0));
    } catch (const gpurun::Error& e) {
      node0_gone_ = true;
      node0_error_ =
          fmt::format("node 0's store at {}:{} is gone ({})", opt_.host, opt_.port, e.what());
    }
  }
  if (node0_gone_) {  // nobody to decide with: this node's own result, or 1
    AttemptOutcome out{false, code != 0 ? code : 1, node0_error_};
    boost::asio::post(io_, [this, out] {
      if (decide_) decided(out);
    });
    return;
  }
  wait_deadline_ = Clock::now() + opt_.barrier_timeout;
  if (host_) {
    node0_decide_tick();
  } else {
    wait_deadline_ += std::chrono::seconds(60);  // node 0's own bound comes first
    node_wait_tick();
  }
}

void NodeSync::node0_decide_tick() {
  if (!decide_) return;
  const int a = attempt_;
  std::vector<NodeFailure> failures;
  std::vector<std::size_t> placeholders;  // indexes in failures: a status, no failure record
  std::vector<int> missing, lost_nodes;
  bool any_signal = own_by_signal_;
  for (const int r : members_) {
    std::optional<NodeFailure> rec;
    if (const auto v = store().try_get(job_keys::fail(a, r))) rec = NodeFailure::decode(*v);
    int code = 0;
    bool by_signal = false;
    if (r == 0) {
      code = own_code_;
      by_signal = own_by_signal_;
    } else if (const auto end = store().try_get(job_keys::end(a, r))) {
      std::vector<std::string> f;
      std::string rest;
      if (!split_fields(*end, 1, f, rest) || !parse_int(f[0], code)) code = 1;
      by_signal = rest == "1";
      any_signal = any_signal || by_signal;
    } else if (node_hung(r)) {  // its failure record was written by node_hung
      lost_nodes.push_back(r);
    } else if (const auto lost = store().try_get(job_keys::lost(r))) {
      lost_nodes.push_back(r);
      if (!rec) {
        NodeFailure f;
        f.node = r;
        if (!parse_int(*lost, f.time_ms)) f.time_ms = now_ms();
        f.reason = fmt::format("{}'s gpurun disconnected from node 0's store", node_name(r));
        rec = f;
      }
    } else {
      missing.push_back(r);
    }
    if (!rec && code != 0) {  // e.g. a node that got SIGTERM: it ended, but no worker failed
      NodeFailure f;
      f.time_ms = now_ms();
      f.node = r;
      f.code = code;
      f.reason = by_signal ? fmt::format("{}'s gpurun was stopped by a signal (status {})",
                                         node_name(r), code)
                           : fmt::format("{} ended with status {}", node_name(r), code);
      rec = f;
      placeholders.push_back(failures.size());
    }
    if (rec) failures.push_back(*rec);
  }
  // A node's status without a failure record of its own (its workers were stopped because of
  // another node's failure, or it got a signal) is stamped now: it must never come before a
  // recorded failure, not even within the same millisecond (root_cause breaks ties by node).
  int64_t last_recorded = 0;
  for (std::size_t i = 0; i < failures.size(); ++i)
    if (std::find(placeholders.begin(), placeholders.end(), i) == placeholders.end())
      last_recorded = std::max(last_recorded, failures[i].time_ms);
  for (std::size_t i : placeholders)
    failures[i].time_ms = std::max(failures[i].time_ms, last_recorded + 1);
  if (!missing.empty()) {
    if (!failures.empty()) {
      // Every node must stop: a node that ended by a signal wrote no stop key.
      store().compare_set(job_keys::stop(a), "", std::to_string(failures.front().node));
    } else if (!announced_ && opt_.say) {
      opt_.say(
          fmt::format("node 0's workers are done; keeping the store up for node(s) {} (at most {})",
                      node_list(missing), seconds(opt_.barrier_timeout)));
    }
    announced_ = true;
    if (Clock::now() < wait_deadline_) {
      arm([this] { node0_decide_tick(); });
      return;
    }
    if (failures.empty()) {
      if (opt_.say)
        opt_.say(fmt::format(
            "warning: exit barrier timed out after {}: no done status from node(s) {} (key {}); "
            "closing the store (exit status 0: node 0's workers succeeded)",
            seconds(opt_.barrier_timeout), node_list(missing), job_keys::end(a, missing.front())));
    } else if (opt_.say) {
      opt_.say(
          fmt::format("warning: node(s) {} did not end attempt {} within {}; deciding "
                      "without them",
                      node_list(missing), a, seconds(opt_.barrier_timeout)));
    }
  }
  AttemptOutcome out;
  if (failures.empty()) {
    out.reason = missing.empty() ? "all nodes' workers succeeded"
                                 : "node 0's workers succeeded (exit barrier timed out)";
  } else {
    const NodeFailure root = *root_cause(failures);
    if (on_root_cause) on_root_cause(a, root);
    // A node's own failure names its node already ("node 1 (host)'s gpurun …"): once.
    out.reason =
        root.rank >= 0 ? fmt::format("{}: {}", node_name(root.node), root.reason) : root.reason;
    out.code = root.code != 0 ? root.code : 1;
    if (a >= opt_.max_restarts) {
      // no restart left: out.restart stays false
    } else if (!lost_nodes.empty() || !missing.empty()) {
      std::vector<int> gone = lost_nodes;
      gone.insert(gone.end(), missing.begin(), missing.end());
      std::sort(gone.begin(), gone.end());
      if (auto reformed = any_signal ? std::nullopt : reform(a, gone, out.reason)) {
        out = *reformed;
      } else {
        out.reason +=
            fmt::format(" (no restart: node(s) {} gone, and {})", node_list(gone),
                        min_nodes_ == 0 || min_nodes_ == max_nodes()
                            ? std::string("a static job needs every node")
                        : any_signal ? std::string("a shutdown signal ends the job")
                                     : fmt::format("fewer than --nnodes {}:{}'s {} would be left",
                                                   min_nodes_, max_nodes(), min_nodes_));
      }
    } else if (any_signal) {
      out.reason += " (no restart after a shutdown signal)";
    } else {
      out.restart = true;
      // The next attempt starts on a clean store: only gpurun's own keys stay.
      host_->reset_keyspace("gpurun/");
    }
  }
  store().set(job_keys::next(a), out.encode());
  if (!out.restart && out.code != 0 && opt_.say)
    opt_.say(fmt::format("the job failed: {}", out.reason));
  decided(out);
}

std::optional<AttemptOutcome> NodeSync::reform(int a, const std::vector<int>& gone,
                                               std::string reason) {
  if (min_nodes_ == 0 || min_nodes_ == max_nodes()) return std::nullopt;  // not a range
  std::vector<int> left;
  for (const int r : members_)
    if (std::find(gone.begin(), gone.end(), r) == gone.end()) left.push_back(r);
  if (static_cast<int>(left.size()) < min_nodes_) return std::nullopt;
  // As torchrun re-forms its rendezvous with the nodes still there: ranks renumbered densely,
  // the next attempt on a clean store (gpurun's own keys stay), the others told through
  // job_keys::members before job_keys::next.
  std::vector<std::string> names;
  for (const int r : gone) names.push_back(node_name(r));
  if (opt_.say)
    opt_.say(
        fmt::format("{} left the job: restarting with {} node{} (--nnodes {}:{}; restart {} of {})",
                    fmt::join(names, ", "), left.size(), left.size() == 1 ? "" : "s", min_nodes_,
                    max_nodes(), a + 1, opt_.max_restarts));
  store().set(job_keys::members(a), fmt::format("{}", fmt::join(left, " ")));
  host_->reset_keyspace("gpurun/");
  set_members(left);
  AttemptOutcome out;
  out.restart = true;
  out.code = 1;
  out.reason = fmt::format("{} (re-formed with {} node{}: node(s) {} left)", reason, left.size(),
                           left.size() == 1 ? "" : "s", node_list(gone));
  out.nnodes = opt_.nnodes;
  out.node_rank = 0;  // node 0 stays first
  return out;
}

void NodeSync::node_wait_tick() {
  if (!decide_) return;
  std::optional<std::string> v;
  try {
    v = store().try_get(job_keys::next(attempt_));
  } catch (const gpurun::Error& e) {
    decided(AttemptOutcome{
        false, own_code_ != 0 ? own_code_ : 1,
        fmt::format("node 0's store at {}:{} went away before it decided attempt {} ({})",
                    opt_.host, opt_.port, attempt_, e.what())});
    return;
  }
  if (v) {
    if (auto out = AttemptOutcome::decode(*v)) {
      if (!out->restart && out->code != 0 && opt_.say)
        opt_.say(fmt::format("the job failed (decided by node 0): {}", out->reason));
      std::optional<std::string> nodes;
      try {
        if (out->restart) nodes = store().try_get(job_keys::members(attempt_));
      } catch (const gpurun::Error&) {  // node 0 gone: the next attempt finds out
      }
      if (nodes) {  // node 0 re-formed the job (--nnodes MIN:MAX): this node's new rank
        std::vector<int> left;
        for (std::size_t pos = 0; pos < nodes->size();) {
          std::size_t sp = nodes->find(' ', pos);
          if (sp == std::string::npos) sp = nodes->size();
          int r = -1;
          if (parse_int(std::string_view(*nodes).substr(pos, sp - pos), r)) left.push_back(r);
          pos = sp + 1;
        }
        const auto me = std::find(left.begin(), left.end(), opt_.node_rank);
        if (me == left.end()) {
          decided(AttemptOutcome{false, 1,
                                 fmt::format("node 0 re-formed the job without {} (nodes {} "
                                             "go on)",
                                             node_name(opt_.node_rank), node_list(left))});
          return;
        }
        out->node_rank = static_cast<int>(me - left.begin());
        set_members(left);
        out->nnodes = opt_.nnodes;
        if (opt_.say)
          opt_.say(
              fmt::format("node 0 re-formed the job with {} node{}; this node is node {} "
                          "of them (GROUP_RANK)",
                          out->nnodes, out->nnodes == 1 ? "" : "s", out->node_rank));
      }
      decided(*out);
      return;
    }
    decided(AttemptOutcome{
        false, 1,
        fmt::format("node 0's decision {} = '{}' is not gpurun's", job_keys::next(attempt_), *v)});
    return;
  }
  if (Clock::now() >= wait_deadline_) {
    decided(AttemptOutcome{false, own_code_ != 0 ? own_code_ : 1,
                           fmt::format("node 0 did not decide attempt {} in time", attempt_)});
    return;
  }
  arm([this] { node_wait_tick(); });
}

void NodeSync::decided(const AttemptOutcome& outcome) {
  tick_ = nullptr;
  timer_.cancel();
  auto d = std::move(decide_);
  decide_ = nullptr;
  if (d) d(outcome);
}

void NodeSync::interrupt(int sig) {
  if (!decide_) return;
  if (host_ && !interrupted_) {
    // Every node still running stops as if it got the signal; node 0 waits for them a while.
    interrupted_ = true;
    own_code_ = 128 + sig;
    own_by_signal_ = true;
    NodeFailure f;
    f.time_ms = now_ms();
    f.code = own_code_;
    f.reason = fmt::format("{}'s gpurun received {}", node_name(0), signal_name(sig));
    store().compare_set(job_keys::fail(attempt_, 0), "", f.encode());
    store().compare_set(job_keys::stop(attempt_), "", fmt::format("0 {}", sig));
    wait_deadline_ = std::min(wait_deadline_, Clock::now() + opt_.peer_stop_wait);
    if (opt_.say)
      opt_.say(
          fmt::format("received {} while waiting for the other nodes: they stop too (at "
                      "most {}; again: stop waiting)",
                      signal_name(sig), seconds(opt_.peer_stop_wait)));
    return;
  }
  AttemptOutcome out{false, 128 + sig,
                     fmt::format("node {} received {} while waiting for the other nodes",
                                 opt_.node_rank, signal_name(sig))};
  if (opt_.say) opt_.say(out.reason + "; not waiting any longer");
  if (host_) store().set(job_keys::next(attempt_), out.encode());
  decided(out);
}

void NodeSync::finish(std::function<void()> closed) {
  if (!host_) {
    client_.reset();  // node 0 sees this node's lost key: it has read the decision
    closed();
    return;
  }
  closed_ = std::move(closed);
  disconnect_deadline_ = Clock::now() + opt_.disconnect_wait;
  finish_tick();
}

void NodeSync::finish_tick() {
  // A node is done with the store once its live key's connection closed (the store deletes
  // the live key and writes the lost key then), or when it never joined. A node writes its join
  // record before its live key: one refused at the start rendezvous in between has no live key
  // yet and has not read the refusal (no lost key either).
  bool gone = true;
  for (int r = 1; r < max_nodes(); ++r) {  // --nnodes MIN:MAX: a late node reads it too
    const auto i = static_cast<std::size_t>(r);
    if (i < hung_.size() && hung_[i]) continue;  // given up as hung: it will not read or close
    if (store().try_get(job_keys::live(r)) ||
        (store().try_get(job_keys::join(r)) && !store().try_get(job_keys::lost(r))))
      gone = false;
  }
  if (gone || Clock::now() >= disconnect_deadline_) {
    auto c = std::move(closed_);
    closed_ = nullptr;
    if (c) c();
    return;
  }
  arm([this] { finish_tick(); });
}

}  // namespace gpurun::supervisor
