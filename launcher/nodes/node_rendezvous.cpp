// NodeSync's start rendezvous (launcher/nodes/node_sync.hpp): nodes > 0 join node 0's store (a
// given --node-rank, or c10d's join order), node 0 waits for them (a node range: MIN, then the
// last call) and writes the start record. docs/cli.md#multi-node, #c10d-rendezvous-node-ranks-
// in-join-order.
#include <thread>

#include "gpurun/error.hpp"
#include "nodes/node0_store.hpp"
#include "nodes/node_sync.hpp"
#include "nodes/node_sync_detail.hpp"
#include "supervisor/process_spawner.hpp"  // signal_name

namespace gpurun::supervisor {

using namespace node_sync_detail;

namespace {
/// Connect windows in a row that reach a listener that is not a store before join() gives up.
constexpr int kNotAStoreWindows = 3;
}  // namespace

void NodeSync::throw_if_join_cancelled(const std::string& where) const {
  if (const int sig = join_cancel_.load())
    throw JoinError(128 + sig,
                    fmt::format("{} while joining node 0's store at {}", signal_name(sig), where));
}

std::unique_ptr<store::ClientStore> connect_to_node0(const Node0StoreOptions& opt,
                                                     Clock::time_point t0,
                                                     const std::function<void()>& cancelled) {
  const std::string where = fmt::format("{}:{}", opt.host, opt.port);
  std::unique_ptr<store::ClientStore> client;
  int windows = 0;
  int foreign = 0;  // windows in a row that reached a listener that is not a store
  std::string last;
  while (!client) {
    cancelled();
    store::ClientOptions co;
    co.host = opt.host;
    co.port = opt.port;
    // Short windows while connecting, so that a signal is seen within about a second.
    co.timeout = std::min(opt.op_timeout, std::chrono::milliseconds(1000));
    ++windows;
    try {
      client = std::make_unique<store::ClientStore>(co);
      break;
    } catch (const store::NotAStoreError& e) {
      // Another program on the port: not waited on as a store that has yet to start (a port
      // that refuses connections is). A few windows, so that a store busy for a moment passes.
      if (++foreign == kNotAStoreWindows)
        throw JoinError(1, fmt::format("{}: another program listens on node 0's store port "
                                       "({} tries over {}); stop it, or give the address and "
                                       "port node 0's gpurun listens on",
                                       e.what(), foreign, seconds(Clock::now() - t0)));
      last = e.what();
    } catch (const gpurun::Error& e) {
      foreign = 0;
      last = e.what();
    }
    if (windows == 1 && opt.say)
      opt.say(fmt::format("{}: waiting for node 0's store at {} (at most {})", opt.who, where,
                          seconds(opt.connect_timeout)));
    if (Clock::now() - t0 >= opt.connect_timeout)
      throw JoinError(1, fmt::format("node 0's store at {} did not answer within {} ({} tried in "
                                     "{} windows; last: {})",
                                     where, seconds(opt.connect_timeout),
                                     seconds(Clock::now() - t0), windows, last));
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // a window can end early
  }
  return client;
}

void NodeSync::connect_to_node0(Clock::time_point t0, const std::string& where) {
  Node0StoreOptions o;
  o.host = opt_.host;
  o.port = opt_.port;
  o.connect_timeout = opt_.connect_timeout;
  o.op_timeout = opt_.op_timeout;
  o.who = opt_.rank_by_join ? std::string("this node") : fmt::format("node {}", opt_.node_rank);
  o.say = opt_.say;
  client_ = supervisor::connect_to_node0(o, t0, [&] { throw_if_join_cancelled(where); });
}

JobStart NodeSync::join() {
  const auto t0 = Clock::now();
  const std::string where = fmt::format("{}:{}", opt_.host, opt_.port);
  const auto cancelled = [&] { throw_if_join_cancelled(where); };
  connect_to_node0(t0, where);
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
      for (int i = 0; i < 50 && !(id = store().try_get(job_keys::job_id())); ++i) {
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
        const int64_t given = client_->add(job_keys::next_node(), 0);
        for (int r = 1; r <= given && r < max_nodes() && n < 0; ++r)
          if (!client_->try_get(job_keys::join(r)) &&
              client_->compare_set(job_keys::join(r), "", record) == record)
            n = r;
        if (n < 0) {
          const int64_t next = client_->add(job_keys::next_node(), 1);
          if (next >= max_nodes())
            throw JoinError(1, fmt::format("node 0's store at {} already has {} nodes, the most "
                                           "--nnodes allows: this node cannot join",
                                           where, max_nodes()));
          if (client_->compare_set(job_keys::join(static_cast<int>(next)), "", record) != record)
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
      held = client_->compare_set(job_keys::join(opt_.node_rank), "", record);
    }
    if (held != record) {
      std::vector<std::string> f;
      std::string rest;
      const std::string other = split_fields(held, 2, f, rest) ? rest : held;
      throw JoinError(1, fmt::format("another gpurun ({}) already joined node 0's store at {} as "
                                     "node {}: every node needs its own --node-rank",
                                     other, where, opt_.node_rank));
    }
    client_->set(job_keys::live(opt_.node_rank), me);
    if (opt_.say)
      opt_.say(fmt::format(
          "node {}: joined node 0's store at {}; waiting for the other nodes (at most {})",
          opt_.node_rank, where, seconds(opt_.join_timeout)));
    for (;;) {
      cancelled();
      if (const auto v = store().try_get(job_keys::start())) {
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
        set_members({});
        js.node_rank = opt_.node_rank;
        for (int r = 0; r < opt_.nnodes; ++r)  // the hosts, to name nodes in messages
          if (const auto j = store().try_get(job_keys::join(r)))
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
    store().set(job_keys::start(), "error 1 " + one_line(error));
    auto r2 = std::move(ready_);
    ready_ = nullptr;
    r2(error);
  };
  std::vector<bool> joined(static_cast<std::size_t>(max_nodes()), false);
  joined[0] = true;
  for (int r = 1; r < max_nodes(); ++r) {
    const auto v = store().try_get(job_keys::join(r));
    if (!v) {
      if (r < opt_.nnodes) missing.push_back(r);
      continue;
    }
    std::vector<std::string> f;
    std::string rest;
    int nproc = -1, nnodes = -1;
    if (split_fields(*v, 3, f, rest) && parse_int(f[0], nproc) && parse_int(f[1], nnodes))
      hosts_[static_cast<std::size_t>(r)] = f[2];
    if (store().try_get(job_keys::lost(r))) {  // it joined, then its gpurun went away
      host_->remove(job_keys::join(r));
      host_->remove(job_keys::lost(r));
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
    min_nodes_ = lo;
    opt_.nnodes = count;
    set_members({});
    store().set(job_keys::join(0),
                fmt::format("{} {} {} {}", opt_.nproc, max_nodes(), hosts_[0], ::getpid()));
    store().set(job_keys::start(),
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
  store().set(job_keys::start(), fmt::format("error {} {}", code, one_line(why)));
  auto ready = std::move(ready_);
  ready_ = nullptr;
  ready(why);
}

}  // namespace gpurun::supervisor
