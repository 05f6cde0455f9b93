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
#include "gpurun/env_names.hpp"
#include "supervisor/error_file.hpp"

namespace gpurun::supervisor {

namespace asio = boost::asio;

/// One output stream of a worker: its splitter, log file and console routing.
struct Supervisor::Stream {
  bool open = true;  // not yet at EOF
  LineSplitter lines;
  UniqueFd file;
  std::string path;     // the log file's path (for the write-failure warning)
  bool console = true;  // shown on the console
  bool drawn = false;   // a redraw of this stream is the console's open line
};

struct Supervisor::Worker {
  int rank = 0;
  int local_rank = 0;
  int pid = -1;
  std::unique_ptr<WorkerProcess> proc;
  std::optional<ExitStatus> exit;
  Stream out;
  Stream err;
  std::deque<std::string> err_tail;
  std::string prefix;
  std::string error_file;
  std::string start_error;  // why the process could not be started (no pid, no exit status)
  bool killed = false;      // kill_slot() ended it: the controller's own doing, no failure
};

Supervisor::Stream& Supervisor::stream(Worker& w, StreamId id) {
  return id == StreamId::kStdout ? w.out : w.err;
}

struct Supervisor::Failure {
  int rank = 0;
  int local_rank = 0;
  int pid = -1;
  ExitStatus status;
  std::string reason;
  std::string error_file;
  std::string start_error;  // non-empty: the worker never ran
  std::vector<std::string> tail;
  bool peer = false;  // stop_for_peer: another node failed (no local summary)
};

int display_columns(std::string_view text) {
  int n = 0;
  for (const char c : text)  // one per UTF-8 sequence: every byte but the continuation bytes
    n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

std::string expand_prefix(const std::string& tmpl, int rank, int local_rank,
                          const std::string& role) {
  std::string out;
  for (size_t i = 0; i < tmpl.size();) {
    auto take = [&](std::string_view var, const std::string& value) {
      if (std::string_view(tmpl).substr(i, var.size()) != var) return false;
      out += value;
      i += var.size();
      return true;
    };
    if (take("${rank}", std::to_string(rank)) ||
        take("${local_rank}", std::to_string(local_rank)) || take("${role_name}", role))
      continue;
    out.push_back(tmpl[i++]);
  }
  return out;
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
      stop_timer_(io) {
  GPURUN_CHECK(!opt_.argv.empty(), "empty worker command");
  GPURUN_CHECK(opt_.plan.nproc >= 1, "nproc {}", opt_.plan.nproc);
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

void Supervisor::open_logs(Worker& w, bool append) {
  const int out_bits =
      opt_.redirects.for_local_rank(w.local_rank) | opt_.tee.for_local_rank(w.local_rank);
  const bool rank_on_console =
      (!opt_.ranks_filter || opt_.ranks_filter->count(w.rank) > 0) &&
      (!opt_.local_ranks_filter || opt_.local_ranks_filter->count(w.local_rank) > 0);
  auto shown = [&](int bit) {
    const bool redirected = (opt_.redirects.for_local_rank(w.local_rank) & bit) != 0;
    const bool teed = (opt_.tee.for_local_rank(w.local_rank) & bit) != 0;
    return rank_on_console && (!redirected || teed);
  };
  w.out.console = shown(StdSpec::kStdout);
  w.err.console = shown(StdSpec::kStderr);
  // A stream shown on a terminal is forwarded in redraw mode (its "\r" segments at once), and
  // its worker gets a pseudo-terminal for it (launch()).
  w.out.lines = LineSplitter(64 * 1024, w.out.console && console_.is_terminal(StreamId::kStdout));
  w.err.lines = LineSplitter(64 * 1024, w.err.console && console_.is_terminal(StreamId::kStderr));

  const std::string dir = fmt::format("{}/attempt_{}/{}", opt_.plan.run_dir, attempt_, w.rank);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    say(fmt::format("warning: cannot create log directory '{}': {}", dir, ec.message()));
    return;
  }
  auto open = [&](Stream& s, const char* name) {
    s.path = dir + "/" + name;
    int fd = ::open(s.path.c_str(), O_WRONLY | O_CREAT | (append ? O_APPEND : O_TRUNC) | O_CLOEXEC,
                    0644);
    if (fd < 0) say(fmt::format("warning: cannot open '{}': {}", s.path, std::strerror(errno)));
    s.file = UniqueFd(fd);
  };
  if (opt_.keep_logs || (out_bits & StdSpec::kStdout)) open(w.out, "stdout.log");
  if (opt_.keep_logs || (out_bits & StdSpec::kStderr)) open(w.err, "stderr.log");
}

void Supervisor::start_attempt() {
  if (on_attempt_start) on_attempt_start(attempt_);
  workers_.clear();
  retired_.clear();
  failure_.reset();
  absorbed_failure_.reset();
  phase_ = Phase::kRunning;
  grace_armed_ = killed_ = drain_expired_ = kill_expired_ = false;

  for (int local = 0; local < opt_.plan.nproc; ++local) {
    auto w = std::make_unique<Worker>();
    w->local_rank = local;
    w->rank = opt_.plan.node_rank * opt_.plan.nproc + local;
    w->prefix = expand_prefix(opt_.prefix_template, w->rank, w->local_rank, opt_.plan.role);
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

int Supervisor::spawn_slot(int local_rank, const EnvMap& overlay) {
  GPURUN_CHECK(local_rank >= 0 && local_rank < static_cast<int>(workers_.size()), "slot {} of {}",
               local_rank, workers_.size());
  auto& slot = workers_[static_cast<size_t>(local_rank)];
  GPURUN_CHECK(slot->exit.has_value(), "slot {} still has process {}", local_rank, slot->pid);
  const bool respawn = slot->proc != nullptr;
  auto w = std::make_unique<Worker>();
  w->local_rank = local_rank;
  w->rank = slot->rank;
  w->prefix = slot->prefix;
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

namespace {
std::string errno_name(int err) {
  const char* name = ::strerrorname_np(err);
  return name ? name : std::to_string(err);
}
}  // namespace

size_t Supervisor::write_log(Worker& w, StreamId id, std::string_view bytes) {
  Stream& s = stream(w, id);
  size_t done = 0;
  int err = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(s.file.get(), bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      err = n < 0 ? errno : EIO;  // 0 bytes for a non-empty write: no progress is possible
      break;
    }
    done += static_cast<size_t>(n);  // a short write (the disk filled up): write the rest
  }
  if (done == bytes.size()) return done;
  // Reported once per file; the file is closed and the stream goes to the console instead, so
  // nothing is lost (the caller shows the bytes from `done` on, whole lines).
  const char* what = id == StreamId::kStdout ? "stdout" : "stderr";
  say(fmt::format(
      "warning: writing {} failed: {} ({}); rank {}'s {} {}", s.path, std::strerror(err),
      errno_name(err), w.rank, what,
      s.console ? "is on the console only from now on" : "goes to the console from now on"));
  s.file.reset();
  return done;
}

void Supervisor::on_output(Worker& w, StreamId id, std::string_view bytes) {
  Stream& s = stream(w, id);
  auto sink = [&](std::string_view text, Piece piece) { on_piece(w, id, text, piece); };
  // Redraw mode writes the file from the pieces (each line's final text, on_piece); else the
  // file gets the raw bytes.
  if (s.file && !s.lines.redraws()) {
    const size_t written = write_log(w, id, bytes);
    if (written < bytes.size()) {
      s.lines.feed_pieces(bytes.substr(0, written), sink);  // in the file: as before
      s.console = true;  // the line the write cut, and everything after it
      s.lines.feed_pieces(bytes.substr(written), sink);
      return;
    }
  }
  s.lines.feed_pieces(bytes, sink);
}

void Supervisor::on_piece(Worker& w, StreamId id, std::string_view text, Piece piece) {
  Stream& s = stream(w, id);
  const int source = w.rank * 2 + (id == StreamId::kStderr ? 1 : 0);
  if (piece == Piece::kRedraw) {
    // A progress bar's new state: "\r<prefix>text", the line left open for the next one.
    if (!s.console) return;
    std::string line;
    line.reserve(w.prefix.size() + text.size() + 1);
    line += '\r';
    line += w.prefix;
    line += text;
    console_.write_from(id, line, source, /*open=*/true);
    s.drawn = true;
    return;
  }
  if (s.file && s.lines.redraws()) {
    // Redraw mode: the file gets each line's final text, without the intermediate states.
    std::string bytes(text);
    if (piece == Piece::kLine) bytes += '\n';
    write_log(w, id, bytes);  // on failure: the console has the line already
  }
  if (id == StreamId::kStderr && opt_.stderr_tail_lines > 0) {
    w.err_tail.emplace_back(text);
    if (w.err_tail.size() > opt_.stderr_tail_lines) w.err_tail.pop_front();
  }
  if (!s.console) return;
  std::string line;
  line.reserve(w.prefix.size() + text.size() + 2);
  if (s.drawn) line += '\r';  // the line's final state overwrites its last redraw
  line += w.prefix;
  line += text;
  line += '\n';
  console_.write_from(id, line, source, /*open=*/false);
  s.drawn = false;
}

void Supervisor::on_stream_closed(Worker& w, StreamId id) {
  Stream& s = stream(w, id);
  s.lines.flush_pieces([&](std::string_view text, Piece piece) { on_piece(w, id, text, piece); });
  s.open = false;
  check_progress();
}

void Supervisor::on_exit(Worker& w, ExitStatus status) {
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
      absorbed_failure_->reason =
          fmt::format("rank {} (pid {}) ended with {}", w.rank, w.pid, status.describe());
    }
  }
  if (!absorbed && !status.success() && phase_ == Phase::kRunning && !shutdown_signal_)
    record_failure(w, status,
                   fmt::format("rank {} (pid {}) ended with {}", w.rank, w.pid, status.describe()));
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
  say(fmt::format("{}; stopping the other workers (SIGTERM, SIGKILL after {} ms)", failure_->reason,
                  opt_.grace_period.count()));
  if (on_failure)
    on_failure(LocalFailure{attempt_, w.rank, w.local_rank, status.shell_code(), failure_->reason});
  stop_workers(SIGTERM);
}

void Supervisor::stop_for_peer(const std::string& reason) {
  if (phase_ != Phase::kRunning || failure_ || shutdown_signal_) return;
  failure_ = std::make_unique<Failure>();
  failure_->rank = -1;
  failure_->local_rank = -1;
  failure_->status = ExitStatus{1, 0};
  failure_->reason = reason;
  failure_->peer = true;
  events_.emit("peer_failure", JsonObject().add("attempt", attempt_).add("reason", reason));
  say(fmt::format("{}; stopping this node's workers (SIGTERM, SIGKILL after {} ms)", reason,
                  opt_.grace_period.count()));
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
    grace_timer_.expires_after(opt_.grace_period);
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
                            opt_.grace_period.count()));
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
  if (phase_ == Phase::kDone || phase_ == Phase::kGated) return;
  // Elastic mode, paused: no process runs, yet the job waits for a resume.
  if (phase_ == Phase::kRunning && controller_ && !failure_ && !shutdown_signal_ &&
      controller_->holds_job_open())
    return;
  const bool all_exited = std::all_of(workers_.begin(), workers_.end(),
                                      [](const auto& w) { return w->exit.has_value(); });
  if (!all_exited) {
    if (phase_ == Phase::kStopping) arm_poll();
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
  grace_timer_.cancel();
  kill_timer_.cancel();
  poll_timer_.cancel();
  drain_timer_.cancel();
  for (auto& w : workers_) {
    for (StreamId id : {StreamId::kStdout, StreamId::kStderr})
      stream(*w, id).lines.flush_pieces(
          [&](std::string_view text, Piece piece) { on_piece(*w, id, text, piece); });
    w->out.file.reset();
    w->err.file.reset();
  }
  if (failure_ && !failure_->peer) {
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
  // Start from a fresh stack: we may be inside a callback of a worker of this attempt.
  asio::post(io_, [this, alive = std::weak_ptr<int>(alive_)] {
    if (!alive.expired()) start_attempt();
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

void Supervisor::print_summary() {
  const Failure& f = *failure_;
  std::string out;
  auto line = [&](const std::string& s) { out += "gpurun: " + s + "\n"; };
  const std::string rule(60, '=');
  line(rule);
  line(fmt::format("{} FAILED (attempt {}, max restarts {})",
                   opt_.display_name.empty() ? opt_.argv[0] : opt_.display_name, attempt_,
                   opt_.plan.max_restarts));
  line("root cause (first observed failure):");
  line(fmt::format("  rank       : {} (local rank {})", f.rank, f.local_rank));
  if (!f.start_error.empty()) {
    line(fmt::format("  exit       : could not start: {}", f.start_error));
  } else {
    line(fmt::format("  pid        : {}", f.pid));
    line(fmt::format("  exit       : {}", f.status.describe()));
  }
  auto report = read_error_file(f.error_file);
  if (report) {
    if (!report->problem.empty()) {  // the file exists but holds no usable report
      line(fmt::format("  error file : {} {}", f.error_file, report->problem));
    } else {
      line(fmt::format("  error file : {}", f.error_file));
      if (!report->timestamp.empty())
        line(fmt::format("  time       : {}", format_error_time(report->timestamp)));
      line(fmt::format("  message    : {}", report->message));
    }
    if (!report->traceback.empty()) {
      line("  traceback  :");
      LineSplitter split;
      auto emit = [&](std::string_view l) { line("    " + std::string(l)); };
      split.feed(report->traceback, emit);
      split.flush(emit);
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
  }
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

std::string Supervisor::preempt_dir() const {
  return opt_.plan.run_dir.empty() ? std::string() : opt_.plan.run_dir + "/preempt";
}

bool Supervisor::uses_runtime(const Worker& w) const {
  if (controller_) return true;  // elastic workers follow the control protocol's boundaries
  if (w.pid <= 0 || preempt_dir().empty()) return false;
  std::error_code ec;
  return std::filesystem::exists(fmt::format("{}/runtime.{}", preempt_dir(), w.pid), ec);
}

void Supervisor::on_preempt_signal(int sig) {
  events_.emit("signal", JsonObject().add("signal", signal_name(sig)).add("preempt", true));
  if (controller_) {
    // Elastic: the next decision carries the request; a raw signal could reach a joiner that
    // is still starting (no handler yet) and kill it.
    controller_->on_checkpoint_request();
    say(fmt::format(
        "received {} (preemption warning): every worker sees a checkpoint request at its next "
        "boundary",
        signal_name(sig)));
  } else {
    signal_all(sig);
    say(fmt::format(
        "received {} (preemption warning): forwarded to every worker; workers on the gpurun "
        "runtime see a checkpoint request at their next boundary",
        signal_name(sig)));
  }
  if (opt_.stop_on_preempt) stop_at_boundary(sig, /*signal_others_now=*/false);
}

void Supervisor::stop_at_boundary(int sig, bool signal_others_now) {
  shutdown_signal_ = sig;
  if (sig == SIGTERM) events_.emit("signal", JsonObject().add("signal", signal_name(sig)));
  const std::string why = fmt::format("gpurun received {}", signal_name(sig));
  if (!preempt_dir().empty()) {
    // The static runtime's request: read at every boundary (all ranks agree on it there).
    const std::string path = preempt_dir() + "/stop";
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
      say(fmt::format("warning: cannot write {}: {}", path, std::strerror(errno)));
    } else {
      const std::string text = signal_name(sig) + "\n";
      [[maybe_unused]] const ssize_t n = ::write(fd, text.data(), text.size());
      ::close(fd);
    }
  }
  const bool boundary_ahead = controller_ ? controller_->on_stop_request(why) : true;
  std::vector<Worker*> others;
  int runtime = 0;
  for (auto& w : workers_) {
    if (!w->proc || w->exit) continue;
    if (boundary_ahead && uses_runtime(*w))
      ++runtime;
    else
      others.push_back(w.get());
  }
  if (runtime == 0 && signal_others_now) {  // nobody to wait for: the plain shutdown
    say(fmt::format("received {}: forwarding it to the workers (SIGKILL after {} ms)",
                    signal_name(sig), opt_.grace_period.count()));
    stop_workers(sig);
    check_progress();
    return;
  }
  if (signal_others_now)
    for (Worker* w : others) {
      try {
        w->proc->signal_group(sig);
      } catch (const Error& e) {
        say(fmt::format("warning: {}", e.what()));
      }
    }
  say(fmt::format(
      "received {}: asking {} worker{} on the gpurun runtime to stop at {} next boundary; {} after "
      "{} ms, SIGKILL {} ms later{}",
      signal_name(sig), runtime, runtime == 1 ? "" : "s", runtime == 1 ? "its" : "their",
      signal_name(SIGTERM), opt_.stop_timeout.count(), opt_.grace_period.count(),
      others.empty() || !signal_others_now
          ? std::string()
          : fmt::format("; {} sent now to the {} other worker{}", signal_name(sig), others.size(),
                        others.size() == 1 ? "" : "s")));
  stop_timer_.expires_after(opt_.stop_timeout);
  stop_timer_.async_wait(
      [this, alive = std::weak_ptr<int>(alive_)](const boost::system::error_code& ec) {
        if (ec || alive.expired() || phase_ != Phase::kRunning) return;
        std::vector<int> left;
        for (auto& w : workers_)
          if (w->proc && !w->exit) left.push_back(w->rank);
        say(fmt::format(
            "--stop-timeout of {} ms over: rank{} {} did not stop at a boundary; sending {} "
            "(SIGKILL after {} ms)",
            opt_.stop_timeout.count(), left.size() == 1 ? "" : "s", fmt::join(left, ", "),
            signal_name(SIGTERM), opt_.grace_period.count()));
        stop_workers(SIGTERM);
        check_progress();
      });
  check_progress();
}

void Supervisor::handle_signal(int sig) {
  if (phase_ == Phase::kDone || phase_ == Phase::kGated) return;  // gated: the gate's holder
  if (sig == opt_.preempt_signal && sig != 0 && !shutdown_signal_) {
    on_preempt_signal(sig);
    return;
  }
  switch (sig) {
    case SIGINT:
    case SIGQUIT:
    case SIGTERM:
      if (shutdown_signal_) {
        say(fmt::format("received {} again: sending SIGKILL to every worker process group",
                        signal_name(sig)));
        killed_ = true;
        stop_timer_.cancel();
        signal_all(SIGKILL);
        grace_timer_.cancel();
        kill_timer_.expires_after(opt_.kill_timeout);
        kill_timer_.async_wait(
            [this, alive = std::weak_ptr<int>(alive_)](const boost::system::error_code& ec) {
              if (ec || alive.expired()) return;
              kill_expired_ = true;
              check_progress();
            });
        arm_poll();
        return;
      }
      if (sig == SIGTERM && phase_ == Phase::kRunning && opt_.stop_timeout.count() > 0 &&
          !(controller_ && controller_->holds_job_open())) {
        stop_at_boundary(sig, /*signal_others_now=*/true);
        return;
      }
      shutdown_signal_ = sig;
      events_.emit("signal", JsonObject().add("signal", signal_name(sig)));
      {
        // A paused job's processes (parked, standbys) wait inside the runtime, where a Python
        // program's SIGINT handler never runs: nothing trains, so SIGTERM ends them at once.
        const bool paused = controller_ && controller_->holds_job_open();
        const int forward = paused ? SIGTERM : sig;
        say(paused && forward != sig
                ? fmt::format("received {}: the job is paused: ending its waiting processes with "
                              "SIGTERM (SIGKILL after {} ms)",
                              signal_name(sig), opt_.grace_period.count())
                : fmt::format("received {}: forwarding it to the workers (SIGKILL after {} ms)",
                              signal_name(sig), opt_.grace_period.count()));
        if (paused) say_paused_snapshot();
        if (phase_ == Phase::kRunning) {
          stop_workers(forward);
        } else {
          signal_all(forward);
        }
      }
      check_progress();
      return;
    case SIGUSR1:
    case SIGUSR2:
      signal_all(sig);
      return;
    case SIGWINCH:  // gpurun's terminal was resized: so are the workers' (less the prefix)
      for (auto& w : workers_)
        if (w->proc && !w->exit) w->proc->terminal_resized();
      return;
    case SIGHUP:
      if (controller_) {
        controller_->on_reload_request();
      } else {
        say("received SIGHUP: no --config given; ignoring it");
      }
      return;
    default:
      return;
  }
}

}  // namespace gpurun::supervisor
