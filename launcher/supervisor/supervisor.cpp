// Supervisor: attempts, worker processes, their exits and restarts, the failure summary.
// Output streams and logs: supervisor_output.cpp; signals and stopping: supervisor_signals.cpp.
#include "supervisor/supervisor.hpp"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <boost/asio/post.hpp>

#include "gpurun/check.hpp"
#include "gpurun/control/node_messages.hpp"
#include "gpurun/env_names.hpp"
#include "gpurun/text_block.hpp"
#include "supervisor/error_file.hpp"
#include "supervisor/supervisor_worker.hpp"

namespace gpurun::supervisor {

namespace asio = boost::asio;

int display_columns(std::string_view text) {
  int n = 0;
  for (const char c : text)  // one per UTF-8 sequence: every byte but the continuation bytes
    n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

namespace {
// `tmpl` with ${rank}, ${local_rank} and ${role_name} replaced by the given texts; with
// `slot_label` "rank${rank}" is replaced by ${rank}'s text alone.
std::string expand_vars(const std::string& tmpl, const std::string& rank,
                        const std::string& local_rank, const std::string& role,
                        bool slot_label = false) {
  std::string out;
  for (size_t i = 0; i < tmpl.size();) {
    auto take = [&](std::string_view var, const std::string& value) {
      if (std::string_view(tmpl).substr(i, var.size()) != var) return false;
      out += value;
      i += var.size();
      return true;
    };
    if ((slot_label && take("rank${rank}", rank)) || take("${rank}", rank) ||
        take("${local_rank}", local_rank) || take("${role_name}", role))
      continue;
    out.push_back(tmpl[i++]);
  }
  return out;
}
}  // namespace

std::string expand_prefix(const std::string& tmpl, int rank, int local_rank,
                          const std::string& role) {
  return expand_vars(tmpl, std::to_string(rank), std::to_string(local_rank), role);
}

std::string expand_elastic_prefix(const std::string& tmpl, int slot, int rank,
                                  const std::string& role) {
  if (rank < 0) {
    const std::string label = fmt::format("gpu{}", slot);
    return expand_vars(tmpl, label, label, role, /*slot_label=*/true);
  }
  const std::string r = std::to_string(rank);
  return expand_vars(tmpl, rank == slot ? r : fmt::format("{} gpu{}", r, slot), r, role);
}

std::string Supervisor::prefix_of(int local_rank) const {
  const int rank = opt_.plan.node_rank * opt_.plan.nproc + local_rank;
  if (!generation_) return expand_prefix(opt_.prefix_template, rank, local_rank, opt_.plan.role);
  // Elastic: the job slot id (node k's local slot i is k*1000+i), as node 0 names it.
  const int slot = control::job_slot(opt_.plan.node_rank, local_rank);
  const auto it = std::find(generation_->begin(), generation_->end(), slot);
  const int in_generation =
      it == generation_->end() ? -1 : static_cast<int>(it - generation_->begin());
  return expand_elastic_prefix(opt_.prefix_template, slot, in_generation, opt_.plan.role);
}

void Supervisor::set_generation(std::optional<std::vector<int>> active) {
  generation_ = std::move(active);
  for (auto& w : workers_) w->prefix = prefix_of(w->local_rank);
}

Supervisor::Supervisor(asio::io_context& io, SupervisorOptions options, ProcessSpawner& spawner,
                       Console& console, EventLog& events)
    : io_(io),
      opt_(std::move(options)),
      spawner_(spawner),
      console_(console),
      events_(events),
      grace_timer_(io),
      kill_timer_(io),
      poll_timer_(io),
      drain_timer_(io),
      stop_timer_(io),
      hold_timer_(io) {
  GPURUN_CHECK(!opt_.argv.empty(), "empty worker command");
  GPURUN_CHECK(opt_.plan.nproc >= 1, "nproc {}", opt_.plan.nproc);
  oom_ = opt_.memory_event_files ? OomWatch(*opt_.memory_event_files) : OomWatch::for_self();
}

Supervisor::~Supervisor() = default;

std::vector<int> Supervisor::worker_pids() const {
  std::vector<int> out;
  for (const auto& w : workers_) out.push_back(w->pid);
  return out;
}

void Supervisor::say(const std::string& line) {
  console_.write(StreamId::kStderr, "gpurun: " + line + "\n");
}

void Supervisor::start() {
  if (opt_.ranks_filter) {
    const int first = opt_.plan.node_rank * opt_.plan.nproc;
    const auto it = opt_.ranks_filter->lower_bound(first);
    if (it == opt_.ranks_filter->end() || *it >= first + opt_.plan.nproc)
      say(fmt::format(
          "warning: --ranks-filter names none of the ranks on this node ({}-{}): no worker output "
          "will be shown on the console",
          first, first + opt_.plan.nproc - 1));
  }
  // (never empty: the parser takes "" for no filter)
  if (opt_.local_ranks_filter && *opt_.local_ranks_filter->begin() >= opt_.plan.nproc)
    say(fmt::format(
        "warning: --local-ranks-filter names none of this node's local ranks (0-{}): no worker "
        "output will be shown on the console",
        opt_.plan.nproc - 1));
  if (!preempt_dir().empty()) {
    std::error_code ec;
    std::filesystem::create_directories(preempt_dir(), ec);
    if (ec)
      say(fmt::format("warning: cannot create {}: {} (no stop at a boundary on SIGTERM)",
                      preempt_dir(), ec.message()));
  }
  start_attempt();
}

void Supervisor::start_attempt() {
  if (on_attempt_start) on_attempt_start(attempt_);
  workers_.clear();
  retired_.clear();
  failure_.reset();
  absorbed_failure_.reset();
  teardown_at_.reset();
  oom_.baseline();
  phase_ = Phase::kRunning;
  grace_armed_ = holding_ = killed_ = drain_expired_ = kill_expired_ = attempt_finished_ = false;

  for (int local = 0; local < opt_.plan.nproc; ++local) {
    auto w = std::make_unique<Worker>();
    w->local_rank = local;
    w->rank = opt_.plan.node_rank * opt_.plan.nproc + local;
    w->prefix = prefix_of(local);
    w->error_file = error_file_path(opt_.plan, attempt_, w->rank);
    if (controller_) {
      // Elastic mode: every slot starts without a process; the controller spawns members.
      w->exit = ExitStatus{0, 0};
      w->out.open = w->err.open = false;
    }
    workers_.push_back(std::move(w));
  }
  if (controller_) {
    controller_->on_attempt_start(attempt_);
    check_progress();
    return;
  }
  spawn_from(0);
}

void Supervisor::launch(Worker& w, const EnvMap& overlay) {
  SpawnRequest req;
  req.rank = w.rank;
  req.local_rank = w.local_rank;
  req.argv = opt_.argv;
  req.env = build_worker_env(opt_.plan, w.local_rank, attempt_, opt_.inherited);
  for (const auto& [k, v] : overlay) req.env[k] = v;
  if (!opt_.local_rank_argument.empty()) {  // its LOCAL_RANK (0 with --virtual-local-rank)
    const std::size_t at = std::min(opt_.local_rank_argument_at, req.argv.size());
    req.argv.insert(req.argv.begin() + static_cast<std::ptrdiff_t>(at),
                    opt_.local_rank_argument + "=" + req.env["LOCAL_RANK"]);
  }
  if (!preempt_dir().empty()) {  // the worker runtime's side of docs/cli.md#preemption
    req.env[env::kPreemptDir] = preempt_dir();
    req.env[env::kPreemptSignal] = std::to_string(opt_.preempt_signal);
  }
  req.stdout_pty = w.out.lines.redraws();
  req.stderr_pty = w.err.lines.redraws();
  req.pty_margin_columns = display_columns(w.prefix);  // each line is "<prefix><its text>"
  WorkerCallbacks cb;
  cb.on_output = [this, &w](StreamId s, std::string_view b) { on_output(w, s, b); };
  cb.on_stream_closed = [this, &w](StreamId s) { on_stream_closed(w, s); };
  cb.on_exit = [this, &w](ExitStatus st) { on_exit(w, st); };
  w.proc = spawner_.spawn(req, std::move(cb));
  w.pid = w.proc->pid();
  if (!opt_.memory_event_files) oom_.add_process(w.pid);  // its cgroup may not be gpurun's
  events_.emit("worker_started", JsonObject()
                                     .add("rank", w.rank)
                                     .add("local_rank", w.local_rank)
                                     .add("pid", w.pid)
                                     .add("attempt", attempt_));
}

void Supervisor::spawn_from(size_t first) {
  // Spawns a batch, then yields to the io_context so that a signal (or a worker's early
  // failure) is handled before the next batch: a shutdown stops spawning promptly.
  const size_t batch = std::max<size_t>(1, opt_.spawn_batch);
  size_t i = first;
  for (; i < workers_.size() && i < first + batch; ++i) {
    Worker& w = *workers_[i];
    if (phase_ != Phase::kRunning) break;
    open_logs(w, false);
    std::error_code ec;
    std::filesystem::remove(w.error_file, ec);  // a stale report must not be mistaken for this one
    try {
      launch(w, {});
    } catch (const Error& e) {
      w.exit = ExitStatus{1, 0};
      w.out.open = w.err.open = false;
      w.start_error = e.what();
      events_.emit("worker_start_failed", JsonObject()
                                              .add("rank", w.rank)
                                              .add("local_rank", w.local_rank)
                                              .add("attempt", attempt_)
                                              .add("reason", w.start_error));
      // The reason is printed once, in the summary ("could not start: ...").
      record_failure(w, *w.exit, fmt::format("rank {} could not start", w.rank));
    }
  }
  if (i < workers_.size() && phase_ == Phase::kRunning) {
    asio::post(io_, [this, i, attempt = attempt_, alive = std::weak_ptr<int>(alive_)] {
      if (!alive.expired() && attempt == attempt_ && phase_ != Phase::kDone) spawn_from(i);
    });
    return;
  }
  // Stopped early (a shutdown signal or a failure): the rest never start.
  for (; i < workers_.size(); ++i) {
    Worker& w = *workers_[i];
    if (w.proc || w.exit) continue;
    w.exit = ExitStatus{0, 0};
    w.out.open = w.err.open = false;
  }
  check_progress();
}

int Supervisor::spawn_elastic(const control::Decision& d, const ElasticSpawn& spawn) {
  return spawn_slot(control::slot_local(spawn.slot), elastic_worker_env(d, spawn));
}

int Supervisor::spawn_slot(int local_rank, const EnvMap& overlay) {
  GPURUN_CHECK(local_rank >= 0 && local_rank < static_cast<int>(workers_.size()), "slot {} of {}",
               local_rank, workers_.size());
  auto& slot = workers_[static_cast<size_t>(local_rank)];
  GPURUN_CHECK(slot->exit.has_value(), "slot {} still has process {}", local_rank, slot->pid);
  const bool respawn = slot->proc != nullptr;
  auto w = std::make_unique<Worker>();
  w->local_rank = local_rank;
  w->rank = slot->rank;
  w->prefix = prefix_of(local_rank);
  w->error_file = slot->error_file;
  retired_.push_back(std::move(slot));
  slot = std::move(w);
  Worker& nw = *slot;
  open_logs(nw, respawn);
  try {
    launch(nw, overlay);
    return nw.pid;
  } catch (const Error& e) {
    nw.out.open = nw.err.open = false;
    say(e.what());
    asio::post(io_, [this, &nw, alive = std::weak_ptr<int>(alive_)] {
      if (!alive.expired()) on_exit(nw, ExitStatus{1, 0});
    });
    return -1;
  }
}

void Supervisor::kill_slot(int local_rank) {
  if (local_rank < 0 || local_rank >= static_cast<int>(workers_.size())) return;
  Worker& w = *workers_[static_cast<size_t>(local_rank)];
  if (!w.proc || w.exit) return;
  try {
    w.proc->signal_group(SIGKILL);
    w.killed = true;
  } catch (const Error& e) {
    say(fmt::format("warning: {}", e.what()));
  }
}

std::string Supervisor::ended_with(const Worker& w) const {
  return fmt::format("rank {} (pid {}) ended with {}", w.rank, w.pid,
                     w.exit ? w.exit->describe() : std::string("?"));
}

void Supervisor::on_exit(Worker& w, ExitStatus status) {
  w.exited_at = WallClock::now();
  // A SIGKILL gpurun did not send: did the kernel's OOM killer send it? (read now: the count)
  if (status.signal == SIGKILL && !w.killed && !killed_)
    if (const auto counted = oom_.rose()) {
      w.oom = status.cause = oom_kill_sentence(*counted);  // said wherever the death is
      oom_.baseline();  // the next OOM kill is told apart from this one
    }
  w.exit = status;
  JsonObject fields;
  fields.add("rank", w.rank)
      .add("local_rank", w.local_rank)
      .add("pid", w.pid)
      .add("attempt", attempt_);
  if (status.signal != 0)
    fields.add("signal", signal_name(status.signal));
  else
    fields.add("code", status.code);
  if (w.killed) fields.add("ended_by_gpurun", true);  // e.g. a standby no longer wanted
  if (!w.oom.empty()) fields.add("oom_kill", w.oom);
  events_.emit("worker_exited", fields);
  bool absorbed = false;
  const bool current = controller_ && workers_.size() > static_cast<size_t>(w.local_rank) &&
                       workers_[static_cast<size_t>(w.local_rank)].get() == &w;
  if (current && phase_ == Phase::kRunning && !shutdown_signal_) {
    absorbed = controller_->on_worker_exit(w.local_rank, status, attempt_ < opt_.plan.max_restarts);
    if (absorbed && !status.success() && !absorbed_failure_) {
      absorbed_failure_ = std::make_unique<Failure>();
      absorbed_failure_->rank = w.rank;
      absorbed_failure_->local_rank = w.local_rank;
      absorbed_failure_->pid = w.pid;
      absorbed_failure_->status = status;
      absorbed_failure_->reason = ended_with(w);
    }
  }
  if (holding_) {
    check_hold(&w);
  } else if (!absorbed && !status.success() && phase_ == Phase::kRunning && !shutdown_signal_) {
    record_failure(w, status, ended_with(w));
  }
  check_progress();
}

void Supervisor::record_failure(Worker& w, ExitStatus status, std::string reason) {
  if (failure_) return;
  failure_ = std::make_unique<Failure>();
  failure_->rank = w.rank;
  failure_->local_rank = w.local_rank;
  failure_->pid = w.pid;
  failure_->status = status;
  failure_->reason = std::move(reason);
  failure_->error_file = w.error_file;
  failure_->start_error = w.start_error;
  if (hold_teardown(w)) return;
  begin_teardown(&w, "");
}

void Supervisor::controller_changed() {
  asio::post(io_, [this, alive = std::weak_ptr<int>(alive_)] {
    if (!alive.expired()) check_progress();
  });
}

void Supervisor::stop_for_peer(const std::string& reason,
                               std::optional<std::chrono::milliseconds> grace) {
  if (grace && !grace_armed_) grace_ = grace;
  if (holding_) {  // the peer's failure may be the real one: stop now
    begin_teardown(nullptr, reason);
    check_progress();
    return;
  }
  if (phase_ != Phase::kRunning || failure_ || shutdown_signal_) return;
  failure_ = std::make_unique<Failure>();
  failure_->rank = -1;
  failure_->local_rank = -1;
  failure_->status = ExitStatus{1, 0};
  failure_->reason = reason;
  failure_->peer = true;
  events_.emit("peer_failure", JsonObject().add("attempt", attempt_).add("reason", reason));
  say(fmt::format("{}; stopping this node's workers (SIGTERM, SIGKILL after {} ms)", reason,
                  grace_.value_or(opt_.grace_period).count()));
  stop_workers(SIGTERM);
  check_progress();
}

void Supervisor::signal_all(int sig) {
  for (auto& w : workers_) {
    if (!w->proc) continue;
    try {
      w->proc->signal_group(sig);
    } catch (const Error& e) {
      // Cleanup errors are reported but never replace the real cause.
      say(fmt::format("warning: {}", e.what()));
    }
  }
}

void Supervisor::stop_workers(int sig) {
  if (phase_ == Phase::kDone) return;
  if (phase_ == Phase::kRunning) phase_ = Phase::kStopping;
  signal_all(sig);
  if (!grace_armed_) {
    grace_armed_ = true;
    grace_timer_.expires_after(grace_.value_or(opt_.grace_period));
    grace_timer_.async_wait(
        [this, alive = std::weak_ptr<int>(alive_)](const boost::system::error_code& ec) {
          if (ec || alive.expired() || phase_ == Phase::kDone || killed_) return;
          bool any = false;
          for (auto& w : workers_)
            if (w->proc && w->proc->group_alive()) any = true;
          if (any)
            say(
                fmt::format("grace period of {} ms over: sending SIGKILL to the remaining "
                            "worker process groups",
                            grace_.value_or(opt_.grace_period).count()));
          killed_ = true;
          signal_all(SIGKILL);
          kill_timer_.expires_after(opt_.kill_timeout);
          kill_timer_.async_wait([this, alive](const boost::system::error_code& ec2) {
            if (ec2 || alive.expired()) return;
            kill_expired_ = true;
            check_progress();
          });
          check_progress();
        });
  }
  arm_poll();
}

void Supervisor::arm_poll() {
  if (poll_armed_ || phase_ == Phase::kDone) return;
  poll_armed_ = true;
  poll_timer_.expires_after(opt_.poll_interval);
  poll_timer_.async_wait(
      [this, alive = std::weak_ptr<int>(alive_)](const boost::system::error_code& ec) {
        if (alive.expired()) return;
        poll_armed_ = false;
        if (ec) return;
        check_progress();
      });
}

void Supervisor::check_progress() {
  if (phase_ == Phase::kDone || phase_ == Phase::kGated || attempt_finished_) return;
  // Elastic mode, paused: no process runs, yet the job waits for a resume.
  if (phase_ == Phase::kRunning && controller_ && !failure_ && !shutdown_signal_ &&
      controller_->holds_job_open())
    return;
  const bool all_exited = std::all_of(workers_.begin(), workers_.end(),
                                      [](const auto& w) { return w->exit.has_value(); });
  if (holding_) check_hold(nullptr);  // an error file written meanwhile, or nobody left
  if (!all_exited) {
    if (phase_ == Phase::kStopping || holding_) arm_poll();
    return;
  }
  if (phase_ != Phase::kDraining) {
    bool groups_alive = false;
    for (auto& w : workers_)
      if (w->proc && w->proc->group_alive()) groups_alive = true;
    if (groups_alive && !kill_expired_) {
      // Every worker is gone but processes it started remain in its group.
      if (phase_ == Phase::kRunning) stop_workers(SIGTERM);
      arm_poll();
      return;
    }
    if (groups_alive)
      say("warning: processes of the job survived SIGKILL (unreaped zombies?); carrying on");
    phase_ = Phase::kDraining;
    drain_timer_.expires_after(opt_.drain_timeout);
    drain_timer_.async_wait(
        [this, alive = std::weak_ptr<int>(alive_)](const boost::system::error_code& ec) {
          if (ec || alive.expired() || phase_ != Phase::kDraining) return;
          drain_expired_ = true;
          check_progress();
        });
  }
  const bool drained = std::all_of(workers_.begin(), workers_.end(),
                                   [](const auto& w) { return !w->out.open && !w->err.open; });
  if (drained || drain_expired_) finish_attempt();
}

void Supervisor::finish_attempt() {
  // Once per attempt: restart() posts the next attempt's start, and a check queued meanwhile
  // (the poll timer's, already fired when cancel() below runs) would otherwise restart again.
  if (attempt_finished_) return;
  attempt_finished_ = true;
  grace_timer_.cancel();
  kill_timer_.cancel();
  poll_timer_.cancel();
  drain_timer_.cancel();
  hold_timer_.cancel();
  holding_ = false;
  for (auto& w : workers_) {
    for (StreamId id : {StreamId::kStdout, StreamId::kStderr})
      stream(*w, id).lines.flush_pieces(
          [&](std::string_view text, Piece piece) { on_piece(*w, id, text, piece); });
    w->out.file.reset();
    w->err.file.reset();
  }
  if (failure_ && !failure_->peer) {
    settle_root_cause();
    for (auto& w : workers_)
      if (w->rank == failure_->rank) failure_->tail.assign(w->err_tail.begin(), w->err_tail.end());
    print_summary();
  }
  if (attempt_gate) {  // multi-node: node 0 decides for every node
    int code = 0;
    std::string reason = "all workers succeeded";
    if (failure_) {
      code = failure_->status.shell_code();
      reason = failure_->reason;
    } else if (shutdown_signal_) {
      code = 128 + shutdown_signal_;
      reason = fmt::format("received {}", signal_name(shutdown_signal_));
    }
    phase_ = Phase::kGated;
    attempt_gate(
        attempt_, code, !failure_ && shutdown_signal_ != 0,
        [this, alive = std::weak_ptr<int>(alive_)](bool again, int c, const std::string& why) {
          if (alive.expired() || phase_ != Phase::kGated) return;
          if (again) {
            restart(why);
          } else {
            finish(c, why);
          }
        });
    return;
  }
  if (failure_ && !shutdown_signal_ && attempt_ < opt_.plan.max_restarts) {
    restart(failure_->reason);
    return;
  }
  finish_unrestarted();
}

void Supervisor::peer_signal(int sig, const std::string& reason) {
  if (holding_) {  // this node's failure goes first: stop now, as a stop signal would
    begin_teardown(nullptr, "");
    check_progress();
    return;
  }
  if (phase_ != Phase::kRunning || failure_ || shutdown_signal_) return;
  say(fmt::format("{}; this node stops as if it got {} too", reason, signal_name(sig)));
  handle_signal(sig);
}

void Supervisor::restart(const std::string& reason) {
  ++attempt_;
  events_.emit("restart", JsonObject().add("attempt", attempt_).add("reason", reason));
  say(fmt::format("restarting the worker set (restart {} of at most {}){}", attempt_,
                  opt_.plan.max_restarts,
                  controller_ ? ": elastic training starts again in a new generation from the "
                                "program's initial state (or its own checkpoint); the state "
                                "of the failed attempt is not carried over"
                              : ""));
  try {
    if (on_restart) on_restart(attempt_);
  } catch (const std::exception& e) {
    say(fmt::format("cannot restart: {}", e.what()));
    finish(failure_ ? failure_->status.shell_code() : 1, reason);
    return;
  }
  // Start from a fresh stack: we may be inside a callback of a worker of this attempt. A
  // shutdown signal handled before that start (it found only exited workers) ends the job
  // instead: no new worker set that would never get the signal.
  asio::post(io_, [this, alive = std::weak_ptr<int>(alive_)] {
    if (alive.expired()) return;
    if (shutdown_signal_) {
      finish_unrestarted();
      return;
    }
    start_attempt();
  });
}

void Supervisor::finish_unrestarted() {
  if (failure_) {
    finish(failure_->status.shell_code(), failure_->reason);
  } else if (shutdown_signal_) {
    finish(128 + shutdown_signal_, fmt::format("received {}", signal_name(shutdown_signal_)));
  } else if (absorbed_failure_ && controller_ && !controller_->succeeded()) {
    // Every elastic worker failed, or one failed after the job finished training: the same
    // root-cause summary as a plain run's failure, naming the first worker that failed.
    failure_ = std::move(absorbed_failure_);
    for (auto& w : workers_)
      if (w->rank == failure_->rank) failure_->tail.assign(w->err_tail.begin(), w->err_tail.end());
    print_summary();
    finish(failure_->status.shell_code(),
           failure_->reason + " (" + controller_->failure_summary() + ")");
  } else if (const std::string why = controller_ ? controller_->job_failed() : std::string();
             !why.empty()) {
    // Every worker exited 0 (told to), yet the job failed: never "all workers succeeded".
    say(fmt::format("the job failed although no worker did: {}", why));
    finish(1, why);  // no worker's status to take (docs/cli.md, "Exit status")
  } else {
    finish(0, "all workers succeeded");
  }
}

namespace {
std::string format_error_time(const std::string& ts) {
  long long secs = 0;
  auto [p, ec] = std::from_chars(ts.data(), ts.data() + ts.size(), secs);
  if (ec != std::errc{} || p != ts.data() + ts.size()) return ts;
  return EventLog::format_timestamp(
      std::chrono::system_clock::time_point(std::chrono::seconds(secs)));
}
}  // namespace

FailureRecord Supervisor::record_of(const Worker& w) const {
  FailureRecord r;
  r.rank = w.rank;
  r.local_rank = w.local_rank;
  r.pid = w.pid;
  if (w.exit) r.status = *w.exit;
  r.reaped_at = w.exited_at;
  r.report = read_error_file(w.error_file);
  for (const auto& l : w.err_tail) r.stderr_tail += l + "\n";
  r.after_teardown = teardown_at_ && w.exit && w.exited_at > *teardown_at_;
  return r;
}

void Supervisor::settle_root_cause() {
  if (controller_ || !failure_ || failure_->peer || !failure_->start_error.empty()) return;
  std::vector<FailureRecord> records;
  std::vector<const Worker*> who;
  std::size_t first = 0;
  for (const auto& w : workers_) {
    if (!w->exit || !w->proc || !w->start_error.empty()) continue;
    if (w->rank == failure_->rank) first = records.size();
    records.push_back(record_of(*w));
    who.push_back(w.get());
  }
  if (records.empty()) return;
  const std::size_t root = choose_root_cause(records, teardown_at_, first);
  for (std::size_t i = 0; i < records.size(); ++i) {
    if (i == root || !is_own_failure(records[i], teardown_at_)) continue;
    const std::string said = error_line(records[i]);
    failure_->others.push_back(
        fmt::format("{}{}{}", ended_with(*who[i]), said.empty() ? "" : " (" + said + ")",
                    has_teardown_error(records[i]) && !has_teardown_error(records[root])
                        ? ": a connection closed by the failing rank, not a cause"
                        : ""));
  }
  if (root == first) return;
  const Worker& w = *who[root];
  failure_->rank = w.rank;
  failure_->local_rank = w.local_rank;
  failure_->pid = w.pid;
  failure_->error_file = w.error_file;
  failure_->reason = ended_with(w);
  if (records[root].after_teardown && (w.exit->signal == SIGTERM || w.exit->signal == SIGKILL)) {
    // It failed (its error file says so), then gpurun's teardown ended it before it exited:
    // the job's status stays the first failure's (a worker's own code, not gpurun's signal).
    failure_->ended_by_teardown = fmt::format(
        "{}, sent by gpurun's teardown after it had failed (its error file was written first)",
        w.exit->describe());
    failure_->reason = fmt::format("rank {} (pid {}) failed", w.rank, w.pid);
  } else {
    failure_->status = *w.exit;
  }
}

void Supervisor::print_summary() {
  const Failure& f = *failure_;
  std::string out;
  auto line = [&](const std::string& s) { out += "gpurun: " + s + "\n"; };
  const std::string rule(60, '=');
  line(rule);
  line(fmt::format("{} FAILED (attempt {}, max restarts {})",
                   opt_.display_name.empty() ? opt_.argv[0] : opt_.display_name, attempt_,
                   opt_.plan.max_restarts));
  line("root cause (first failure in time):");
  line(fmt::format("  rank       : {} (local rank {})", f.rank, f.local_rank));
  if (!f.start_error.empty()) {
    line(fmt::format("  exit       : could not start: {}", f.start_error));
  } else {
    line(fmt::format("  pid        : {}", f.pid));
    line(fmt::format("  exit       : {}",
                     f.ended_by_teardown.empty() ? f.status.describe() : f.ended_by_teardown));
  }
  // A multi-line text (a DataLoader worker's traceback inside the message) keeps its lines,
  // bounded (text_block: 40 lines, 4 KiB, the last lines kept).
  const auto block = [&](std::string_view text, std::string_view indent) {
    out += text_block(text, "gpurun: " + std::string(indent));
  };
  auto report = read_error_file(f.error_file);
  if (report) {
    if (!report->problem.empty()) {  // the file exists but holds no usable report
      line(fmt::format("  error file : {} {}", f.error_file, report->problem));
    } else {
      line(fmt::format("  error file : {}", f.error_file));
      if (!report->timestamp.empty())
        line(fmt::format("  time       : {}", format_error_time(report->timestamp)));
      const std::string message = tidy_message(report->message);
      if (message.find('\n') == std::string::npos) {
        line(fmt::format("  message    : {}", message));
      } else {
        line("  message    :");
        block(message, "    ");
      }
      if (const auto device = device_oom_sentence(report->message))
        line(fmt::format("  memory     : {}", *device));
    }
    if (!report->traceback.empty()) {
      line("  traceback  :");
      block(report->traceback, "    ");
    }
  } else {
    line("  error file : <not written> (decorate the entry point with torch's @record to get one)");
  }
  if (f.tail.empty()) {
    line("  stderr     : <empty>");
  } else {
    line(fmt::format("  stderr     : last {} line{}:", f.tail.size(),
                     f.tail.size() == 1 ? "" : "s"));
    for (const auto& l : f.tail) line("    | " + l);
    if (!report || !report->problem.empty()) {  // no report: its stderr may say CUDA OOM
      std::string tail;
      for (const auto& l : f.tail) tail += l + "\n";
      if (const auto device = device_oom_sentence(tail))
        line(fmt::format("  memory     : {}", *device));
    }
  }
  for (const auto& o : f.others) line("  also failed: " + o);
  line(rule);
  console_.write(StreamId::kStderr, out);
}

void Supervisor::finish(int code, const std::string& why) {
  phase_ = Phase::kDone;
  stop_timer_.cancel();
  std::string reason = why;
  if (final_status)
    if (std::optional<std::pair<int, std::string>> r = final_status(code)) {
      code = r->first;
      reason = r->second;
    }
  exit_code_ = code;
  events_.emit("shutdown", JsonObject().add("exit_code", code).add("reason", reason));
  if (on_done) on_done(code);
}

void Supervisor::say_paused_snapshot() {
  // Paused (active_gpus = []): the training state lives only in the host snapshot, which
  // gpurun deletes at exit (main: remove_snapshot). Say so, with its size, before it goes.
  if (opt_.plan.run_dir.empty()) return;
  const std::string primary = snapshot_path(opt_.plan.run_dir);
  for (const std::string& path : {primary, snapshot_fallback_path(opt_.plan.run_dir)}) {
    if (path.empty()) continue;
    std::error_code ec;
    const auto bytes = std::filesystem::file_size(path, ec);
    if (ec) continue;
    say(fmt::format(
        "stopping while paused: the snapshot {} ({} bytes) is deleted at exit, so the paused "
        "training state is lost; to keep it, resume (a non-empty active_gpus) and let the job "
        "save a checkpoint before stopping it",
        path, bytes));
    return;
  }
  say(fmt::format(
      "stopping while paused: no snapshot at {}; the paused job's training state is lost",
      primary));
}

}  // namespace gpurun::supervisor
