// Supervisor: the signals gpurun receives — forwarded, turned into a stop at the next boundary
// (SIGTERM with --stop-timeout), a preemption warning (a checkpoint request), a reload (SIGHUP),
// a terminal resize; the teardown after a worker's failure, and its hold after a teardown
// error. The rest of the supervisor: supervisor.cpp.
#include "supervisor/supervisor.hpp"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "gpurun/check.hpp"
#include "supervisor/error_file.hpp"
#include "supervisor/supervisor_worker.hpp"

namespace gpurun::supervisor {

namespace {
/// "5 s", or "250 ms" when not whole seconds.
std::string duration_text(std::chrono::milliseconds d) {
  return d.count() % 1000 == 0 ? fmt::format("{} s", d.count() / 1000)
                               : fmt::format("{} ms", d.count());
}
}  // namespace

bool Supervisor::hold_teardown(const Worker& w) {
  if (controller_ || opt_.teardown_hold.count() <= 0 || !w.start_error.empty() ||
      shutdown_signal_ || phase_ != Phase::kRunning)
    return false;
  const FailureRecord r = record_of(w);
  if (!has_teardown_error(r)) return false;
  const bool others_running = std::any_of(workers_.begin(), workers_.end(), [&](const auto& o) {
    return o.get() != &w && o->proc && !o->exit;
  });
  if (!others_running) return false;
  holding_ = true;
  events_.emit("teardown_hold",
               JsonObject()
                   .add("attempt", attempt_)
                   .add("rank", w.rank)
                   .add("error", error_line(r))
                   .add("hold_ms", static_cast<int64_t>(opt_.teardown_hold.count())));
  say(fmt::format(
      "rank {} (pid {}) lost its connection to a peer ({}) and ended with {}: waiting up to {} "
      "for the rank that failed before stopping the others",
      w.rank, w.pid, error_line(r), w.exit ? w.exit->describe() : std::string("?"),
      duration_text(opt_.teardown_hold)));
  hold_timer_.expires_after(opt_.teardown_hold);
  hold_timer_.async_wait([this,
                          alive = std::weak_ptr<int>(alive_)](const boost::system::error_code& ec) {
    if (ec || alive.expired() || !holding_) return;
    begin_teardown(
        nullptr, fmt::format("no other worker failed within {} of rank {}'s "
                             "connection error; {}",
                             duration_text(opt_.teardown_hold), failure_->rank, failure_->reason));
    check_progress();
  });
  arm_poll();  // check_progress looks for an error file written meanwhile
  return true;
}

void Supervisor::check_hold(const Worker* exited) {
  if (!holding_) return;
  // The rank the hold waits for: one that failed of something other than a lost connection,
  // by its exit, or (still running: a slow exit) by its error file.
  if (exited && exited->exit && !exited->exit->success() &&
      !has_teardown_error(record_of(*exited))) {
    begin_teardown(exited, ended_with(*exited));
    return;
  }
  bool others_running = false;
  for (const auto& w : workers_) {
    if (!w->proc || w->exit) continue;
    others_running = true;
    const auto report = read_error_file(w->error_file);
    if (report && report->problem.empty() && !is_teardown_error(report->message)) {
      begin_teardown(w.get(),
                     fmt::format("rank {} (pid {}) failed ({}), as its error file {} says", w->rank,
                                 w->pid, error_line(record_of(*w)), w->error_file));
      return;
    }
  }
  if (!others_running) begin_teardown(nullptr, "");  // nobody left to wait for
}

void Supervisor::begin_teardown(const Worker* cause, const std::string& why) {
  holding_ = false;
  hold_timer_.cancel();
  teardown_at_ = WallClock::now();  // a worker that ends after this may be ended by gpurun
  say(fmt::format("{}; stopping the other workers (SIGTERM, SIGKILL after {} ms)",
                  why.empty() ? failure_->reason : why, opt_.grace_period.count()));
  if (on_failure) {
    LocalFailure f{attempt_, failure_->rank, failure_->local_rank, failure_->status.shell_code(),
                   failure_->reason};
    if (cause && cause->rank != failure_->rank) {  // the hold found the rank that failed
      f.rank = cause->rank;
      f.local_rank = cause->local_rank;
      if (cause->exit) f.code = cause->exit->shell_code();
      f.reason = why;
    }
    on_failure(f);
  }
  stop_workers(SIGTERM);
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
  // A stop signal ends the teardown hold at once: the failure's teardown, then the signal's.
  const bool stops = sig == SIGINT || sig == SIGQUIT || sig == SIGTERM ||
                     (sig == opt_.preempt_signal && sig != 0 && opt_.stop_on_preempt);
  if (holding_ && stops) begin_teardown(nullptr, "");
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
          !(controller_ && controller_->paused())) {
        stop_at_boundary(sig, /*signal_others_now=*/true);
        return;
      }
      shutdown_signal_ = sig;
      events_.emit("signal", JsonObject().add("signal", signal_name(sig)));
      {
        // A paused job's processes (parked, standbys) wait inside the runtime, where a Python
        // program's SIGINT handler never runs: nothing trains, so SIGTERM ends them at once.
        const bool paused = controller_ && controller_->paused();
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
