#include "nodes/node_agent.hpp"

#include <signal.h>
#include <sys/stat.h>

#include <algorithm>
#include <ctime>
#include <utility>

#include <fmt/format.h>
#include <boost/asio/post.hpp>

#include "gpurun/control/heartbeat.hpp"
#include "gpurun/control/keys.hpp"
#include "gpurun/error.hpp"
#include "gpurun/json_writer.hpp"
#include "nodes/node_sync.hpp"  // JoinError
#include "nodes/node_sync_detail.hpp"
#include "supervisor/supervisor.hpp"
#include "supervisor/worker_env.hpp"

namespace gpurun::supervisor {

namespace asio = boost::asio;
namespace keys = control::keys;

namespace {

// The first of `files` that exists: "PATH (N bytes, written HH:MM:SS UTC<note>)"; "" when none
// does.
std::string snapshot_text(const std::vector<std::string>& files, const std::string& note) {
  for (const std::string& path : files) {
    struct stat st {};
    if (path.empty() || ::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    std::tm tm{};
    const std::time_t t = st.st_mtime;
    ::gmtime_r(&t, &tm);
    char when[16];
    std::strftime(when, sizeof when, "%H:%M:%S", &tm);
    return fmt::format("{} ({} bytes, written {} UTC{})", path, static_cast<int64_t>(st.st_size),
                       when, note);
  }
  return {};
}

}  // namespace

ElasticJoin join_elastic_job(store::Store& store, const ElasticJoinRequest& r) {
  ElasticJoin out;
  try {
    out.run_id = store.get(keys::node_job(), r.job_wait);
  } catch (const StoreTimeout&) {
    throw JoinError(1, fmt::format("node 0 at {} does not run an elastic job (no {} after {} "
                                   "ms): start node 0 with --config FILE and --nnodes",
                                   r.where, keys::node_job(), r.job_wait.count()));
  }
  if (!r.run_id.empty() && r.run_id != out.run_id)
    throw JoinError(1, fmt::format("node 0's store at {} runs job '{}', this node was started for "
                                   "'{}' (--rdzv-id): not joining it",
                                   r.where, out.run_id, r.run_id));
  out.node = static_cast<int>(store.add(keys::node_next(), 1));
  control::NodeJoin join;
  join.node = out.node;
  join.host = r.host.empty() ? node_sync_detail::this_host() : r.host;
  join.pid = r.pid > 0 ? r.pid : static_cast<int>(::getpid());
  join.slots = r.slots;
  join.offer = r.offer;
  join.run_id = r.run_id;
  join.device = r.device;
  join.snapshot_endpoint = r.snapshot_endpoint;
  join.address = r.address;
  // This host's clock when written: node 0 aligns this node's resize timings with it.
  join.monotonic_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch())
          .count();
  store.set(keys::node_live(out.node), fmt::format("{} {}", join.host, join.pid));
  store.set(keys::node_join(out.node), join.to_json());
  // Node 0's answer: the node says it joined only once admitted (a refused one only why).
  std::string answer;
  try {
    answer = store.get(keys::node_answer(out.node), r.answer_wait);
  } catch (const StoreTimeout&) {
    throw JoinError(
        1, fmt::format("node 0 at {} did not answer this node's join (node {}, {}) "
                       "within {} ms: is node 0's gpurun busy or stopped?",
                       r.where, out.node, keys::node_answer(out.node), r.answer_wait.count()));
  }
  if (answer != "admitted")
    throw JoinError(1,
                    fmt::format("node 0 at {} refused this node (node {}): {}", r.where, out.node,
                                answer.rfind("refused: ", 0) == 0 ? answer.substr(9) : answer));
  return out;
}

NodeAgent::NodeAgent(boost::asio::io_context& io, Supervisor& supervisor,
                     std::unique_ptr<store::Store> commands, std::unique_ptr<store::Store> events,
                     NodeAgentOptions options)
    : io_(io),
      sup_(supervisor),
      commands_(std::move(commands)),
      events_(std::move(events)),
      opt_(std::move(options)),
      offer_(control::join_ids(opt_.joined_offer)) {}

NodeAgent::~NodeAgent() {
  close();
}

void NodeAgent::close() {
  stop_ = true;
  if (reader_.joinable()) reader_.join();
  commands_.reset();
  events_.reset();
}

std::optional<std::pair<int, std::string>> NodeAgent::final_status() const {
  if (!end_) return std::nullopt;
  return std::make_pair(end_->code, end_->reason);
}

std::string NodeAgent::name() const {
  return fmt::format("node {}", opt_.node);
}

void NodeAgent::say(const std::string& line) {
  if (opt_.say) opt_.say(line);
}

void NodeAgent::follow(int64_t generation, const std::vector<int>& active) {
  if (generation < generation_) return;  // an older one (a spawn's, after a newer command)
  generation_ = generation;
  active_ = active;
  sup_.set_generation(active_);  // console prefixes: "[rank2 gpu1000]: ", as node 0 names it
  status_changed();
}

void NodeAgent::status_changed() {
  if (opt_.status_changed) opt_.status_changed();
}

std::string NodeAgent::status_members(const std::vector<std::string>& physical) const {
  const bool released = end_ && end_->reason.rfind("node 0 released", 0) == 0;
  JsonObject node;
  node.add("node", opt_.node)
      .add("node0", opt_.where)
      .add("state", !end_      ? (leaving_ ? "leaving" : "live")
                    : released ? "released"
                               : "ended")
      .add("why", end_ ? end_->reason : std::string())
      .add("generation", generation_)
      .add_raw("active", control::ids_json(active_));
  std::string slots = "[";
  for (const int local : opt_.slots) {
    const int slot = control::job_slot(opt_.node, local);
    const auto v = views_.find(local);
    const auto p = procs_.find(local);
    const bool runs = p != procs_.end() && p->second > 0;
    const auto member = std::find(active_.begin(), active_.end(), slot);
    const int rank =
        runs && member != active_.end() ? static_cast<int>(member - active_.begin()) : -1;
    std::string state = "IDLE", reason;
    int64_t generation = -1;
    if (runs && v != views_.end()) {
      state = rank >= 0           ? "ACTIVE"
              : v->second.standby ? "STANDBY"
              : v->second.warm    ? "WARMING"
                                  : "RUNNING";
      generation = rank >= 0 ? generation_ : v->second.generation;
      if (rank < 0 && v->second.warm) reason = "a warm joiner: enters at a boundary";
    } else if (v != views_.end() && !v->second.ended.empty()) {
      state = v->second.clean ? "EXITED" : "FAILED";
      reason = v->second.ended;
    } else {
      reason = "no process: node 0 starts one at a boundary";
    }
    JsonObject o;
    o.add("gpu", slot).add("local_gpu", local);
    if (static_cast<size_t>(local) < physical.size() && !physical[local].empty())
      o.add("physical_gpu", physical[local]);
    else
      o.add_null("physical_gpu");
    o.add("state", state)
        .add("generation", generation)
        .add("rank", rank)
        .add("pid", runs ? p->second : -1)
        .add("reason", reason);
    slots += (slots.size() > 1 ? "," : "") + o.str();
  }
  return fmt::format("\"node\": {}, \"slots\": {}]", node.str(), slots);
}

void NodeAgent::on_attempt_start(int /*attempt*/) {
  // Every slot starts without a process: node 0's commands start them.
  if (!reader_.joinable() && commands_) reader_ = std::thread([this] { read_commands(); });
}

void NodeAgent::read_commands() {
  using Clock = std::chrono::steady_clock;
  using std::chrono::milliseconds;
  const bool beats = opt_.node_timeout.count() > 0;
  const milliseconds interval = control::heartbeat_interval(opt_.node_timeout);
  const milliseconds slice = beats ? std::min(opt_.wait_slice, interval) : opt_.wait_slice;
  Clock::time_point answered = Clock::now(), beat_sent{};
  int64_t n = 0;
  while (!stop_) {
    const std::string key = keys::node_command(opt_.node, n);
    std::string text;
    const Clock::time_point asked = Clock::now();
    try {
      if (beats && asked - beat_sent >= interval) {
        // This gpurun is alive (NodeHub watches it): the value is how many of these markers its
        // io thread has run, so that a stuck io thread (a deadlock) stops the heartbeat too.
        commands_->set(keys::node_beat(opt_.node), std::to_string(io_ticks_.load()));
        asio::post(io_, [this, alive = std::weak_ptr<int>(alive_)] {
          if (!alive.expired()) ++io_ticks_;
        });
        beat_sent = asked;
      }
      text = commands_->get(key, slice);
      commands_->remove(key);
      answered = Clock::now();
    } catch (const StoreTimeout&) {
      const Clock::time_point now = Clock::now();
      // A request unanswered for node_timeout (the connection's own timeout): cut off.
      if (beats && now - asked >= opt_.node_timeout) {
        if (stop_) return;
        const auto silent = std::chrono::duration_cast<milliseconds>(now - answered);
        asio::post(io_, [this, alive = std::weak_ptr<int>(alive_), silent] {
          if (!alive.expired()) cut_off(silent);
        });
        return;
      }
      answered = now;
      continue;  // none yet (the wait's own timeout: node 0 answered): look at stop_, again
    } catch (const gpurun::Error& e) {
      if (stop_) return;
      asio::post(io_, [this, alive = std::weak_ptr<int>(alive_), cause = std::string(e.what())] {
        if (!alive.expired()) node0_gone(cause);
      });
      return;
    }
    asio::post(io_, [this, alive = std::weak_ptr<int>(alive_), n, text = std::move(text)] {
      if (!alive.expired()) on_command(n, text);
    });
    ++n;
  }
}

void NodeAgent::on_command(int64_t n, const std::string& text) {
  if (end_) return;  // ended: what node 0 still says changes nothing
  control::NodeCommand c;
  try {
    c = control::NodeCommand::from_json(text);
  } catch (const gpurun::Error& e) {
    say(
        fmt::format("{}: warning: node 0's command {} ({}) is not one this gpurun reads: {}; "
                    "ignoring it",
                    name(), n, keys::node_command(opt_.node, n), e.what()));
    return;
  }
  using Kind = control::NodeCommand::Kind;
  switch (c.kind) {
    case Kind::kSpawn:
      spawn(c);
      return;
    case Kind::kKill:
      if (control::slot_node(c.slot) == opt_.node) sup_.kill_slot(control::slot_local(c.slot));
      return;
    case Kind::kRelease:
      ended(leave_code(), fmt::format("node 0 released {}: {}", name(), c.reason),
            fmt::format("{}: node 0 released this node ({}); its gpurun exits {}{}", name(),
                        c.reason, leave_code(), procs_.empty() ? "" : " once its workers ended"),
            /*stop_workers=*/false);
      return;
    case Kind::kExit:
      ended(c.code, fmt::format("node 0 ended the job: {}", c.reason),
            fmt::format("{}: node 0 ended the job ({}): exit status {}", name(), c.reason, c.code),
            /*stop_workers=*/true);
      return;
    case Kind::kGivenUp:  // its link came back after node 0 went on without it
      ended(1, fmt::format("node 0 gave this node up: {}", c.reason),
            fmt::format("{}: node 0 gave this node up ({}) and trains on without its slots; "
                        "this node's gpurun exits 1",
                        name(), c.reason),
            /*stop_workers=*/true, opt_.cut_off_grace);
      return;
    case Kind::kFetchSnapshot:
      fetch_snapshot(c);
      return;
    case Kind::kGeneration:
      if (c.decision) follow(c.generation, c.decision->active);
      return;
  }
}

void NodeAgent::fetch_snapshot(const control::NodeCommand& c) {
  control::NodeEvent e;
  e.kind = control::NodeEvent::Kind::kSnapshotFetched;
  e.serial = c.serial;
  if (!opt_.fetch_snapshot) {
    e.how = fmt::format("{} cannot copy a pause snapshot (it serves none)", name());
    event(e);
    return;
  }
  say(fmt::format("{}: copying the pause snapshot from {} for a resume onto this node's slots",
                  name(), c.endpoint));
  opt_.fetch_snapshot(
      c.endpoint, c.serial,
      [&io = io_, this, alive = std::weak_ptr<int>(alive_)](const control::NodeEvent& done) {
        asio::post(io, [this, alive, done] {
          if (alive.expired() || end_) return;
          if (done.how.empty()) {
            fetched_serial_ = done.serial;
            say(fmt::format("{}: the pause snapshot is here: {} bytes in {} ms", name(), done.bytes,
                            done.ms));
          } else {
            say(fmt::format("{}: {}", name(), done.how));
          }
          event(done);
        });
      });
}

void NodeAgent::spawn(const control::NodeCommand& c) {
  if (stopping_now_) {  // a second stop signal: the supervisor is stopping every worker
    exited(c.slot, -1,
           fmt::format("{}: {} not started: this node is stopping its workers (a stop signal)",
                       name(), control::slot_name(c.slot)));
    return;
  }
  const int local = control::slot_local(c.slot);
  if (control::slot_node(c.slot) != opt_.node ||
      std::find(opt_.slots.begin(), opt_.slots.end(), local) == opt_.slots.end()) {
    exited(c.slot, -1,
           fmt::format("{}: no {} on this node (its slots: gpu {})", name(),
                       control::slot_name(c.slot), control::join_ids(opt_.slots, ", gpu ")));
    return;
  }
  if (const auto p = procs_.find(local); p != procs_.end()) {
    exited(c.slot, -1,
           fmt::format("{}: slot busy: {}'s process {} still runs; not started again", name(),
                       control::slot_name(c.slot), p->second));
    return;
  }
  if (!c.decision) {
    exited(c.slot, -1,
           fmt::format("{}: the spawn command for {} carries no decision", name(),
                       control::slot_name(c.slot)));
    return;
  }
  // A joiner of a known generation: its prefix names its rank there from its first line.
  if (c.warm < 0) follow(c.decision->generation, c.decision->active);
  const int pid = sup_.spawn_elastic(*c.decision, {.slot = c.slot,
                                                   .generation = c.generation,
                                                   .warm = c.warm,
                                                   .standby = c.standby,
                                                   .config_path = opt_.config_path});
  procs_[local] = pid;  // -1: its exit (code 1) follows, through on_worker_exit
  SlotView& v = views_[local] = SlotView{};
  v.warm = c.warm >= 0;
  v.standby = c.standby;
  v.generation = v.warm ? -1 : c.generation;
  status_changed();
  control::NodeEvent e;
  e.kind = control::NodeEvent::Kind::kSpawned;
  e.slot = c.slot;
  e.pid = pid > 0 ? pid : -1;
  event(e);
}

void NodeAgent::exited(int slot, int pid, const std::string& how) {
  control::NodeEvent e;
  e.kind = control::NodeEvent::Kind::kExited;
  e.slot = slot;
  e.pid = pid;
  e.code = 1;
  e.how = how;
  say(how);
  event(e);
}

bool NodeAgent::on_worker_exit(int local_rank, ExitStatus status, bool /*can_restart*/) {
  int pid = -1;
  if (const auto p = procs_.find(local_rank); p != procs_.end()) {
    pid = p->second;
    procs_.erase(p);
  }
  views_[local_rank].ended = status.describe();
  views_[local_rank].clean = status.success();
  status_changed();
  if (!end_) {
    control::NodeEvent e;
    e.kind = control::NodeEvent::Kind::kExited;
    e.slot = control::job_slot(opt_.node, local_rank);
    e.pid = pid;
    e.code = status.code;
    e.signal = status.signal;
    e.how = status.describe();
    event(e);
  }
  return true;  // node 0 decides what the exit means
}

void NodeAgent::event(const control::NodeEvent& e) {
  if (write(keys::node_event(opt_.node, next_event_), e.to_json())) ++next_event_;
}

bool NodeAgent::write(const std::string& key, const std::string& value) {
  if (!events_) return false;
  const auto asked = std::chrono::steady_clock::now();
  try {
    events_->set(key, value);
    return true;
  } catch (const StoreTimeout& e) {  // no answer within the connection's timeout
    if (opt_.node_timeout.count() <= 0) {
      node0_gone(e.what());
      return false;
    }
    cut_off(std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                                  asked));
    return false;
  } catch (const gpurun::Error& e) {
    node0_gone(e.what());
    return false;
  }
}

void NodeAgent::offer_changed() {
  if (!opt_.offer || end_ || leaving_) return;
  const std::string offer = control::join_ids(opt_.offer());
  if (offer_ == offer) return;
  if (write(keys::node_offer(opt_.node), offer)) offer_ = offer;
}

bool NodeAgent::on_signal(int sig) {
  // SIGINT (Ctrl-C) leaves as SIGTERM does: the job goes on over the other nodes, where a
  // forwarded SIGINT would end this node's ranks with KeyboardInterrupt mid-step.
  const bool leave = sig == SIGTERM || sig == SIGINT;
  if (!leave || leaving_ || end_) {
    if (leave || sig == SIGQUIT) stopping_now_ = true;
    return false;
  }
  leaving_ = true;
  leave_signal_ = sig;
  status_changed();
  const std::string s = signal_name(sig);
  if (!write(keys::node_leave(opt_.node), s)) return true;
  say(
      fmt::format("{}: leaving the job at the next boundary ({}); its gpurun then exits {}; a "
                  "second SIGINT or SIGTERM stops its workers at once",
                  name(), s, leave_code()));
  return true;
}

int NodeAgent::leave_code() const {
  return leave_signal_ == SIGINT ? 128 + SIGINT : 0;
}

bool NodeAgent::on_stop_request(const std::string& /*why*/) {
  // The supervisor's own stop (a second stop signal, the preempt signal with --requeue): this
  // node has no boundary of its own (node 0 holds them): its workers stop at once.
  stopping_now_ = true;
  return false;
}

void NodeAgent::ended(int code, std::string reason, const std::string& line, bool stop_workers,
                      std::optional<std::chrono::milliseconds> grace) {
  end_ = End{code, std::move(reason)};
  status_changed();
  if (procs_.empty() || !stop_workers) {
    say(line);
    sup_.controller_changed();  // no process left: the supervisor ends the job
    return;
  }
  // Processes left (an exit, node 0 gone): stopped (SIGTERM, SIGKILL after the grace period).
  sup_.stop_for_peer(line, grace);
}

void NodeAgent::cut_off(std::chrono::milliseconds silent) {
  if (end_) return;
  stop_ = true;  // the reader stops at its next wake-up
  // Node 0 may still run (then it gave this node up after the same --node-timeout and trains
  // on without it) or be gone with its host (then the job has ended): this node cannot tell.
  const std::string what = fmt::format(
      "cut off from node 0: its store at {} has not answered for {} (--node-timeout {})",
      opt_.where, node_sync_detail::seconds(silent), node_sync_detail::seconds(opt_.node_timeout));
  ended(1, what,
        fmt::format("{}: {}: if node 0 still runs, it has given this node up by now and the job "
                    "goes on without this node's slots; if node 0 is gone, the job has ended; {}; "
                    "this node's gpurun exits 1",
                    name(), what, state_left_here(/*node0_dead=*/false)),
        /*stop_workers=*/true, opt_.cut_off_grace);
}

std::string NodeAgent::state_left_here(bool node0_dead) const {
  std::vector<int> pids;
  for (const auto& slot_pid : procs_)
    if (slot_pid.second > 0) pids.push_back(slot_pid.second);
  // A pause snapshot file here: written by this node's rank at a pause, copied here for a
  // resume, or only prepared ahead while training (the agent cannot tell which).
  const std::string snap = snapshot_text(
      opt_.snapshot_files ? opt_.snapshot_files() : std::vector<std::string>{},
      fetched_serial_ >= 0 ? fmt::format(", pause snapshot {} copied here", fetched_serial_)
                           : std::string());
  const std::string kept = fmt::format(
      "this node's pause snapshot {}, deleted when this gpurun exits (no new job "
      "resumes from a pause snapshot)",
      snap);
  if (!pids.empty())
    return fmt::format(
        "the training state is {}in the memory of the job's ranks ({}; this node's, pid {}, are "
        "stopped now: a program that saves a checkpoint on SIGTERM has until the SIGKILL){}",
        snap.empty() ? "only " : "",
        node0_dead ? "node 0's ended with it" : "node 0's, if it still runs, keep theirs",
        control::join_ids(pids, ", "),
        snap.empty() ? std::string() : "; if the job is paused, also in " + kept);
  if (!snap.empty())
    return "this node runs no worker; if the job is paused, its training state is in " + kept;
  return "this node runs no worker and holds no pause snapshot: no training state is left here";
}

void NodeAgent::node0_gone(const std::string& cause) {
  if (end_) return;  // node 0 closes its store after it released or ended this node
  stop_ = true;      // the reader stops at its next wake-up
  ended(1, fmt::format("node 0's gpurun ({}) is gone: {}", opt_.where, cause),
        fmt::format("{}: node 0's gpurun ({}) is gone ({}): the job cannot go on without it "
                    "(node 0 holds the job's store and makes every decision); {}; to go on, "
                    "start a new job (node 0 first) from the program's own checkpoint, if it "
                    "writes one; this node's gpurun exits 1",
                    name(), opt_.where, cause, state_left_here(/*node0_dead=*/true)),
        /*stop_workers=*/true);
}

}  // namespace gpurun::supervisor
