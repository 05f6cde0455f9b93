#include "supervisor/node_sync.hpp"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <thread>
#include <utility>

#include <fmt/format.h>
#include <boost/asio/post.hpp>

#include "gpurun/error.hpp"
#include "gpurun/store/client.hpp"
#include "gpurun/store/live_keys.hpp"
#include "supervisor/process_spawner.hpp"

namespace gpurun::supervisor {

namespace {

using Clock = std::chrono::steady_clock;

std::string seconds(Clock::duration d) {
  return fmt::format(
      "{:g} s",
      static_cast<double>(std::chrono::duration_cast<std::chrono::milliseconds>(d).count()) /
          1000.0);
}

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string this_host() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "?";
  return buf;
}

template <class Int>
bool parse_int(std::string_view text, Int& out) {
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  return ec == std::errc() && end == text.data() + text.size();
}

/// Splits off the first `n` space-separated fields; the rest (maybe with spaces) is `rest`.
bool split_fields(const std::string& text, std::size_t n, std::vector<std::string>& fields,
                  std::string& rest) {
  fields.clear();
  std::size_t pos = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t sp = text.find(' ', pos);
    if (sp == std::string::npos) {
      if (i + 1 != n) return false;
      fields.push_back(text.substr(pos));
      rest.clear();
      return true;
    }
    fields.push_back(text.substr(pos, sp - pos));
    pos = sp + 1;
  }
  rest = text.substr(pos);
  return true;
}

std::string one_line(std::string s) {
  std::replace(s.begin(), s.end(), '\n', ' ');
  return s;
}

std::string node_list(const std::vector<int>& nodes) {
  return fmt::format("{}", fmt::join(nodes, ", "));
}

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

/// Node 0's backend or a client of node 0's store. Client requests throw gpurun::Error.
struct NodeSync::Store {
  LocalStore* local = nullptr;
  std::unique_ptr<store::Client> client;

  std::optional<std::string> get(const std::string& key) {
    if (local) return local->get(key);
    if (!client->check({key})) return std::nullopt;
    return client->get(key);
  }
  void set(const std::string& key, const std::string& value) {
    if (local)
      local->set(key, value);
    else
      client->set(key, value);
  }
  std::string set_if_missing(const std::string& key, const std::string& value) {
    return local ? local->set_if_missing(key, value) : client->compare_set(key, "", value);
  }
};

NodeSync::NodeSync(boost::asio::io_context& io, NodeSyncOptions options, LocalStore& local)
    : io_(io), opt_(std::move(options)), store_(std::make_unique<Store>()), timer_(io) {
  store_->local = &local;
  hosts_.assign(static_cast<std::size_t>(max_nodes()), "");
  hosts_[0] = this_host();
  local.set(job_keys::job_id(), opt_.run_id);  // a joining node checks it (check_run_id)
}

NodeSync::NodeSync(boost::asio::io_context& io, NodeSyncOptions options)
    : io_(io), opt_(std::move(options)), store_(std::make_unique<Store>()), timer_(io) {
  hosts_.assign(static_cast<std::size_t>(max_nodes()), "");
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

JobStart NodeSync::join() {
  const auto t0 = Clock::now();
  const std::string where = fmt::format("{}:{}", opt_.host, opt_.port);
  const auto cancelled = [&] {
    if (const int sig = join_cancel_.load())
      throw JoinError(
          128 + sig, fmt::format("{} while joining node 0's store at {}", signal_name(sig), where));
  };
  int windows = 0;
  std::string last;
  while (!store_->client) {
    cancelled();
    store::ClientOptions co;
    co.host = opt_.host;
    co.port = opt_.port;
    // Short windows while connecting, so that a signal is seen within about a second.
    co.timeout = std::min(opt_.op_timeout, std::chrono::milliseconds(1000));
    ++windows;
    try {
      store_->client = std::make_unique<store::Client>(co);
      break;
    } catch (const gpurun::Error& e) {
      last = e.what();
    }
    if (windows == 1 && opt_.say)
      opt_.say(fmt::format(
          "{}: waiting for node 0's store at {} (at most {})",
          opt_.rank_by_join ? std::string("this node") : fmt::format("node {}", opt_.node_rank),
          where, seconds(opt_.connect_timeout)));
    if (Clock::now() - t0 >= opt_.connect_timeout)
      throw JoinError(1, fmt::format("node 0's store at {} did not answer within {} ({} tried in "
                                     "{} windows; last: {})",
                                     where, seconds(opt_.connect_timeout),
                                     seconds(Clock::now() - t0), windows, last));
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // a window can end early
  }
  store::ClientOptions co;
  co.host = opt_.host;
  co.port = opt_.port;
  co.timeout = opt_.op_timeout;
  const std::string me = fmt::format("{} {}", this_host(), ::getpid());
  const std::string record = fmt::format("{} {} {}", opt_.nproc, max_nodes(), me);
  const auto t_join = Clock::now();
  try {
    std::string held;
    if (opt_.check_run_id) {  // a stale job on the port is not joined
      std::optional<std::string> id;
      for (int i = 0; i < 50 && !(id = store_->get(job_keys::job_id())); ++i) {
        cancelled();
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
      if (id && *id != opt_.run_id)
        throw JoinError(1, fmt::format("node 0's store at {} runs job '{}', this node was "
                                       "started for '{}' (--rdzv-id): not joining it",
                                       where, *id, opt_.run_id));
      if (!id && opt_.say)
        opt_.say(
            fmt::format("the store at {} names no multi-node job yet (a single-node gpurun "
                        "or another program listens there?); waiting for its start",
                        where));
    }
    if (opt_.rank_by_join) {  // c10d: the next free node rank, in join order
      for (;;) {
        // First a rank whose node left before the start (node 0 dropped its join key), then
        // the next one. A rank taken between the two steps is skipped (compare_set).
        int n = -1;
        const int64_t given = store_->client->add(job_keys::next_node(), 0);
        for (int r = 1; r <= given && r < max_nodes() && n < 0; ++r)
          if (!store_->client->check({job_keys::join(r)}) &&
              store_->client->compare_set(job_keys::join(r), "", record) == record)
            n = r;
        if (n < 0) {
          const int64_t next = store_->client->add(job_keys::next_node(), 1);
          if (next >= max_nodes())
            throw JoinError(1, fmt::format("node 0's store at {} already has {} nodes, the most "
                                           "--nnodes allows: this node cannot join",
                                           where, max_nodes()));
          if (store_->client->compare_set(job_keys::join(static_cast<int>(next)), "", record) !=
              record)
            continue;  // a node given --node-rank took it: the next one
          n = static_cast<int>(next);
        }
        opt_.node_rank = n;
        ranked_ = true;
        held = record;
        break;
      }
      if (opt_.say) opt_.say(fmt::format("joined as node {} (join order)", opt_.node_rank));
    } else {
      // First come, first served: a second gpurun with the same --node-rank is refused.
      held = store_->client->compare_set(job_keys::join(opt_.node_rank), "", record);
    }
    if (held != record) {
      std::vector<std::string> f;
      std::string rest;
      const std::string other = split_fields(held, 2, f, rest) ? rest : held;
      throw JoinError(1, fmt::format("another gpurun ({}) already joined node 0's store at {} as "
                                     "node {}: every node needs its own --node-rank",
                                     other, where, opt_.node_rank));
    }
    store_->client->set(job_keys::live(opt_.node_rank), me);
    if (opt_.say)
      opt_.say(fmt::format(
          "node {}: joined node 0's store at {}; waiting for the other nodes (at most {})",
          opt_.node_rank, where, seconds(opt_.join_timeout)));
    for (;;) {
      cancelled();
      if (const auto v = store_->get(job_keys::start())) {
        std::vector<std::string> f;
        std::string rest;
        if (v->rfind("error ", 0) == 0) {
          int code = 1;
          std::string why = v->substr(6);
          if (split_fields(why, 1, f, rest) && parse_int(f[0], code)) why = rest;
          throw JoinError(code, fmt::format("node 0 ({}) refused this node: {}", where, why));
        }
        JobStart js;
        if (!split_fields(*v, 3, f, js.run_id) || f[0] != "ok" ||
            !parse_int(f[1], js.max_restarts) || !parse_int(f[2], js.nnodes) || js.run_id.empty() ||
            js.nnodes < 1)
          throw JoinError(1, fmt::format("node 0's start record {} = '{}' is not gpurun's "
                                         "(another program on {}?)",
                                         job_keys::start(), *v, where));
        if (opt_.node_rank >= js.nnodes)
          throw JoinError(1, fmt::format("node 0 closed the rendezvous with {} node{} before "
                                         "this node ({}) joined (--nnodes {}:{}, "
                                         "last_call_timeout)",
                                         js.nnodes, js.nnodes == 1 ? "" : "s", opt_.node_rank,
                                         opt_.nnodes, max_nodes()));
        opt_.nnodes = js.nnodes;
        js.node_rank = opt_.node_rank;
        for (int r = 0; r < opt_.nnodes; ++r)  // the hosts, to name nodes in messages
          if (const auto j = store_->get(job_keys::join(r)))
            if (split_fields(*j, 3, f, rest)) hosts_[static_cast<std::size_t>(r)] = f[2];
        return js;
      }
      if (Clock::now() - t_join >= opt_.join_timeout)
        throw JoinError(1,
                        fmt::format("the start rendezvous at {} timed out after {} "
                                    "(--join-timeout): node 0 did not start the job (are all "
                                    "{} nodes started, with --nnodes {}?)",
                                    where, seconds(opt_.join_timeout), opt_.nnodes, opt_.nnodes));
      std::this_thread::sleep_for(opt_.poll_interval);
    }
  } catch (const gpurun::StoreError& e) {
    throw JoinError(1, fmt::format("node 0's store at {} failed during the start rendezvous "
                                   "after {}: {}",
                                   where, seconds(Clock::now() - t0), e.what()));
  }
}

void NodeSync::rendezvous(std::function<void(const std::string& error)> ready) {
  ready_ = std::move(ready);
  rendezvous_deadline_ = Clock::now() + opt_.join_timeout;
  rendezvous_tick();
}

void NodeSync::rendezvous_tick() {
  std::vector<int> missing;
  const auto refuse = [this](const std::string& error) {
    store_->set(job_keys::start(), "error 1 " + one_line(error));
    auto r2 = std::move(ready_);
    ready_ = nullptr;
    r2(error);
  };
  std::vector<bool> joined(static_cast<std::size_t>(max_nodes()), false);
  joined[0] = true;
  for (int r = 1; r < max_nodes(); ++r) {
    const auto v = store_->get(job_keys::join(r));
    if (!v) {
      if (r < opt_.nnodes) missing.push_back(r);
      continue;
    }
    std::vector<std::string> f;
    std::string rest;
    int nproc = -1, nnodes = -1;
    if (split_fields(*v, 3, f, rest) && parse_int(f[0], nproc) && parse_int(f[1], nnodes))
      hosts_[static_cast<std::size_t>(r)] = f[2];
    if (store_->get(job_keys::lost(r))) {  // it joined, then its gpurun went away
      store_->local->remove(job_keys::join(r));
      store_->local->remove(job_keys::lost(r));
      if (opt_.say)
        opt_.say(
            fmt::format("{} left before the start; waiting for a node {} again", node_name(r), r));
      missing.push_back(r);
      continue;
    }
    if (nnodes != max_nodes()) {
      refuse(
          fmt::format("{} was started with --nnodes {}, node 0 with --nnodes {}: every node "
                      "of a job gives the same node count",
                      node_name(r), nnodes,
                      max_nodes() == opt_.nnodes ? std::to_string(opt_.nnodes)
                                                 : fmt::format("{}:{}", opt_.nnodes, max_nodes())));
      return;
    }
    if (nproc != opt_.nproc) {
      refuse(
          fmt::format("{} joined with {} workers (--nproc), node 0 has {}: every node of a "
                      "static job runs the same number of workers",
                      node_name(r), nproc, opt_.nproc));
      return;
    }
    joined[static_cast<std::size_t>(r)] = true;
  }
  // Nodes 0..count-1 all joined (a range closes on a prefix: a later rank is refused).
  int count = 0;
  while (count < max_nodes() && joined[static_cast<std::size_t>(count)]) ++count;
  bool start = missing.empty() && count >= max_nodes();
  if (missing.empty() && !start) {  // --nnodes MIN:MAX: MIN are in; the last call for more
    if (!last_call_) {
      last_call_ = Clock::now() + opt_.last_call_timeout;
      if (opt_.say)
        opt_.say(
            fmt::format("{} of at most {} nodes joined; waiting {} more for others (last "
                        "call)",
                        count, max_nodes(), seconds(opt_.last_call_timeout)));
    }
    start = Clock::now() >= *last_call_;
  }
  if (start) {
    const int lo = opt_.nnodes;
    opt_.nnodes = count;
    store_->set(job_keys::join(0),
                fmt::format("{} {} {} {}", opt_.nproc, max_nodes(), hosts_[0], ::getpid()));
    store_->set(job_keys::start(),
                fmt::format("ok {} {} {}", opt_.max_restarts, opt_.nnodes, opt_.run_id));
    if (opt_.say)
      opt_.say(max_nodes() == opt_.nnodes
                   ? fmt::format("all {} nodes joined; starting the workers", opt_.nnodes)
                   : fmt::format("starting with {} node{} (--nnodes {}:{}; the last call "
                                 "ended)",
                                 opt_.nnodes, opt_.nnodes == 1 ? "" : "s", lo, max_nodes()));
    auto r2 = std::move(ready_);
    ready_ = nullptr;
    r2("");
    return;
  }
  if (Clock::now() >= rendezvous_deadline_) {
    refuse(
        fmt::format("the start rendezvous timed out after {} (--join-timeout): node(s) {} did "
                    "not join (they connect to this node's store at {}:{})",
                    seconds(opt_.join_timeout), node_list(missing), opt_.host, opt_.port));
    return;
  }
  arm([this] { rendezvous_tick(); });
}

void NodeSync::cancel_rendezvous(const std::string& why, int code) {
  if (!ready_) return;
  tick_ = nullptr;
  timer_.cancel();
  store_->set(job_keys::start(), fmt::format("error {} {}", code, one_line(why)));
  auto ready = std::move(ready_);
  ready_ = nullptr;
  ready(why);
}

bool NodeSync::node_lost(int node) {
  return store_->get(job_keys::lost(node)).has_value();
}

void NodeSync::attempt_started(int attempt) {
  attempt_ = attempt;
  watching_ = true;
  peer_stopped_ = false;
  announced_ = false;
  const auto n = static_cast<std::size_t>(opt_.nnodes);
  beat_seen_.assign(n, "");
  beat_changed_.assign(n, Clock::now());  // every node gets a whole timeout from the start
  hung_.assign(n, false);
  beat_sent_ = {};
  arm([this] { watch_tick(); });
}

void NodeSync::beat() {
  if (store_->local || Clock::now() - beat_sent_ < opt_.heartbeat_interval) return;
  store_->set(job_keys::beat(opt_.node_rank), std::to_string(++beats_));
  beat_sent_ = Clock::now();
}

bool NodeSync::node_hung(int r) {
  const auto i = static_cast<std::size_t>(r);
  if (opt_.heartbeat_timeout.count() <= 0 || i >= hung_.size()) return false;
  if (hung_[i]) return true;
  const std::string v = store_->get(job_keys::beat(r)).value_or("");
  const auto now = Clock::now();
  if (v != beat_seen_[i]) {
    beat_seen_[i] = v;
    beat_changed_[i] = now;
    return false;
  }
  if (now - beat_changed_[i] < opt_.heartbeat_timeout) return false;
  hung_[i] = true;
  const int a = attempt_;
  if (!store_->get(job_keys::fail(a, r))) {
    NodeFailure f;
    f.node = r;
    f.time_ms = now_ms();
    f.reason = fmt::format(
        "{}'s gpurun sent no heartbeat for {} with its connection to node 0's store still open "
        "(stopped or hung, or its host stalled; --node-timeout)",
        node_name(r), seconds(opt_.heartbeat_timeout));
    store_->set(job_keys::fail(a, r), f.encode());
    store_->set_if_missing(job_keys::stop(a), std::to_string(r));
  }
  return true;
}

void NodeSync::watch_tick() {
  if (!watching_) return;
  const int a = attempt_;
  try {
    beat();
    if (store_->local) {  // node 0: a node whose gpurun vanished mid-attempt is a failure
      for (int r = 1; r < opt_.nnodes; ++r) {
        if (store_->get(job_keys::end(a, r))) continue;
        const auto lost = store_->get(job_keys::lost(r));
        if (!lost) {
          node_hung(r);  // alive but silent: given up after heartbeat_timeout
          continue;
        }
        if (store_->get(job_keys::fail(a, r))) continue;
        NodeFailure f;
        f.node = r;
        if (!parse_int(*lost, f.time_ms)) f.time_ms = now_ms();
        f.reason = fmt::format(
            "{}'s gpurun disconnected from node 0's store (killed, or its host or network "
            "failed)",
            node_name(r));
        store_->set(job_keys::fail(a, r), f.encode());
        store_->set_if_missing(job_keys::stop(a), std::to_string(r));
      }
    }
    if (const auto stopper = store_->get(job_keys::stop(a)); stopper && !peer_stopped_) {
      int node = -1, sig = 0;
      std::vector<std::string> f;
      std::string rest;
      if (!split_fields(*stopper, 1, f, rest) || !parse_int(f[0], node)) node = -1;
      if (!rest.empty() && !parse_int(rest, sig)) sig = 0;
      if (node != opt_.node_rank) {
        peer_stopped_ = true;
        std::string why = fmt::format("{} failed", node >= 0 ? node_name(node) : "a node");
        if (node >= 0)
          if (const auto rec = store_->get(job_keys::fail(a, node)))
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
    store_->set(job_keys::fail(attempt, opt_.node_rank), f.encode());
    store_->set_if_missing(job_keys::stop(attempt), std::to_string(opt_.node_rank));
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
    store_->set_if_missing(job_keys::fail(attempt, opt_.node_rank), f.encode());
    store_->set_if_missing(job_keys::stop(attempt), fmt::format("{} {}", opt_.node_rank, sig));
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
      store_->set(job_keys::end(attempt, opt_.node_rank),
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
  if (store_->local) {
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
  for (int r = 0; r < opt_.nnodes; ++r) {
    std::optional<NodeFailure> rec;
    if (const auto v = store_->get(job_keys::fail(a, r))) rec = NodeFailure::decode(*v);
    int code = 0;
    bool by_signal = false;
    if (r == 0) {
      code = own_code_;
      by_signal = own_by_signal_;
    } else if (const auto end = store_->get(job_keys::end(a, r))) {
      std::vector<std::string> f;
      std::string rest;
      if (!split_fields(*end, 1, f, rest) || !parse_int(f[0], code)) code = 1;
      by_signal = rest == "1";
      any_signal = any_signal || by_signal;
    } else if (node_hung(r)) {  // its failure record was written by node_hung
      lost_nodes.push_back(r);
    } else if (const auto lost = store_->get(job_keys::lost(r))) {
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
      store_->set_if_missing(job_keys::stop(a), std::to_string(failures.front().node));
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
    out.reason = fmt::format("{}: {}", node_name(root.node), root.reason);
    out.code = root.code != 0 ? root.code : 1;
    if (a >= opt_.max_restarts) {
      // no restart left: out.restart stays false
    } else if (!lost_nodes.empty() || !missing.empty()) {
      out.reason += fmt::format(" (no restart: node(s) {} gone, and a static job needs every node)",
                                node_list(lost_nodes.empty() ? missing : lost_nodes));
    } else if (any_signal) {
      out.reason += " (no restart after a shutdown signal)";
    } else {
      out.restart = true;
      // The next attempt starts on a clean store: only gpurun's own keys stay.
      store_->local->reset_keyspace("gpurun/");
    }
  }
  store_->set(job_keys::next(a), out.encode());
  if (!out.restart && out.code != 0 && opt_.say)
    opt_.say(fmt::format("the job failed: {}", out.reason));
  decided(out);
}

void NodeSync::node_wait_tick() {
  if (!decide_) return;
  std::optional<std::string> v;
  try {
    v = store_->get(job_keys::next(attempt_));
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
  if (store_->local && !interrupted_) {
    // Every node still running stops as if it got the signal; node 0 waits for them a while.
    interrupted_ = true;
    own_code_ = 128 + sig;
    own_by_signal_ = true;
    NodeFailure f;
    f.time_ms = now_ms();
    f.code = own_code_;
    f.reason = fmt::format("{}'s gpurun received {}", node_name(0), signal_name(sig));
    store_->set_if_missing(job_keys::fail(attempt_, 0), f.encode());
    store_->set_if_missing(job_keys::stop(attempt_), fmt::format("0 {}", sig));
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
  if (store_->local) store_->set(job_keys::next(attempt_), out.encode());
  decided(out);
}

void NodeSync::finish(std::function<void()> closed) {
  if (!store_->local) {
    store_->client.reset();  // node 0 sees this node's lost key: it has read the decision
    closed();
    return;
  }
  closed_ = std::move(closed);
  disconnect_deadline_ = Clock::now() + opt_.disconnect_wait;
  finish_tick();
}

void NodeSync::finish_tick() {
  // A node is done with the store once its live key's connection closed (or it never joined).
  bool gone = true;
  for (int r = 1; r < opt_.nnodes;
       ++r) {  // the store deletes a live key when its connection closes
    const auto i = static_cast<std::size_t>(r);
    if (i < hung_.size() && hung_[i]) continue;  // given up as hung: it will not read or close
    if (store_->get(job_keys::live(r))) gone = false;
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
