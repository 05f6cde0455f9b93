// [notify] command runner. Reference: docs/sharing.md#notifications.
#include "supervisor/notifier.hpp"

#include "gpurun/helper_process.hpp"
#include "gpurun/unique_fd.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>

#include <fmt/format.h>
#include <boost/json.hpp>

namespace gpurun::supervisor {

namespace json = boost::json;

bool notify_wants(std::string_view event, std::string_view record) {
  if (event == "lease" || event == "lease_end" || event == "yield" || event == "yield_end" ||
      event == "early_stop" || event == "shutdown")
    return true;
  if (event != "decision" && event != "worker_exited") return false;
  boost::system::error_code ec;
  const json::value v = json::parse(record, ec);
  if (ec || !v.is_object()) return false;
  const json::object& o = v.as_object();
  if (event == "decision") {
    const json::value* k = o.if_contains("kind");
    return k && k->is_string() && (k->as_string() == "resize" || k->as_string() == "exit");
  }
  if (const json::value* own = o.if_contains("ended_by_gpurun");
      own && own->is_bool() && own->as_bool())
    return false;  // gpurun ended it (a cancelled standby or warm joiner): no failure
  const json::value* code = o.if_contains("code");
  return o.contains("signal") || (code && code->is_int64() && code->as_int64() != 0);
}

Notifier::Notifier(std::string command, std::chrono::milliseconds timeout,
                   std::function<void(const std::string&)> warn)
    : command_(std::move(command)), timeout_(timeout), warn_(std::move(warn)) {
  thread_ = std::thread([this] { run(); });
}

Notifier::~Notifier() {
  size_t waiting = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    drain_deadline_ = std::chrono::steady_clock::now() + timeout_;
    waiting = queue_.size();
  }
  if (waiting > 0 && warn_)
    warn_(fmt::format(
        "notify: running the {} queued notify command{} before exiting (at most "
        "timeout_s = {} s in all)",
        waiting, waiting == 1 ? "" : "s", static_cast<double>(timeout_.count()) / 1000.0));
  cv_.notify_all();
  thread_.join();
}

void Notifier::post(std::string_view event, std::string_view record) {
  if (!notify_wants(event, record)) return;
  bool say_drop = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    if (queue_.size() >= kMaxQueued) {
      say_drop = dropped_++ == 0 && failures_ == 0;
    } else {
      queue_.emplace_back(std::string(event), std::string(record));
    }
  }
  if (say_drop && warn_)
    warn_(
        fmt::format("notify: {} events wait for the command already; '{}' and later ones "
                    "are dropped while it is this far behind (later drops are not reported)",
                    kMaxQueued, event));
  cv_.notify_one();
}

std::pair<int, int> Notifier::failures() const {
  std::lock_guard<std::mutex> lock(mu_);
  return {failures_, dropped_};
}

void Notifier::run() {
  for (;;) {
    std::pair<std::string, std::string> item;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and everything ran
      if (stopping_ && std::chrono::steady_clock::now() >= drain_deadline_) {
        const size_t left = queue_.size();
        queue_.clear();
        lock.unlock();
        if (warn_)
          warn_(fmt::format("notify: {} event{} not sent: gpurun is ending", left,
                            left == 1 ? "" : "s"));
        return;
      }
      item = std::move(queue_.front());
      queue_.pop_front();
      if (gave_up_) continue;  // the command was not found: not run again (said once)
    }
    run_one(item.first, item.second);
  }
}

void Notifier::failed(const std::string& why) {
  bool first = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    first = failures_++ == 0;
  }
  if (first && warn_)
    warn_(fmt::format("notify: {}; the job goes on (later failures are not reported)", why));
}

void Notifier::forward_stderr(const std::string& event, const std::string& shown,
                              std::size_t hidden) {
  if (!warn_ || (shown.empty() && hidden == 0)) return;
  std::string_view rest = shown;
  while (!rest.empty()) {
    const std::size_t nl = rest.find('\n');
    const std::string_view line = rest.substr(0, nl);
    rest = nl == std::string_view::npos ? std::string_view() : rest.substr(nl + 1);
    warn_(fmt::format("notify: [{}] {}", event, line));
  }
  if (hidden > 0)
    warn_(fmt::format(
        "notify: [{}] and {} more bytes of the command's stderr, not shown (only the first {} "
        "bytes of each run are)",
        event, hidden, kMaxStderrBytes));
}

void Notifier::run_one(const std::string& event, const std::string& record) {
  // A socket pair, not a pipe: send(MSG_NOSIGNAL) to a command that left without reading
  // is EPIPE, never SIGPIPE, whatever the process's SIGPIPE disposition.
  int in[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, in) != 0)
    return failed(fmt::format("cannot make a socket for '{}': {}", event, std::strerror(errno)));
  ::shutdown(in[0], SHUT_WR);
  UniqueFd child_in(in[0]), to_command(in[1]);
  HelperOptions o;
  o.argv = {"/bin/sh", "-c", command_};
  o.environment = {"GPURUN_NOTIFY_EVENT=" + event};
  o.stdin_stream = HelperStream::from_fd(child_in.get());
  o.stdout_stream = HelperStream::null();
  // Its stderr through a pipe of ours: forwarded bounded (kMaxStderrBytes a run), never a
  // flood on gpurun's own stderr, never a command blocked on a full pipe (read all along).
  o.stderr_stream = HelperStream::pipe();
  o.group = HelperGroup::kOwnGroup;  // its own group: a timeout kills what it started too
  std::optional<HelperProcess> command;
  try {
    command.emplace(o);
  } catch (const HelperError& e) {
    return failed(
        fmt::format("cannot start /bin/sh for '{}': {}", event, std::strerror(e.error_number())));
  }
  child_in.reset();
  const int err = command->pipe(2).get();
  ::fcntl(err, F_SETFL, ::fcntl(err, F_GETFL) | O_NONBLOCK);
  std::string shown;
  std::size_t hidden = 0;
  const auto read_err = [&] {
    char buf[16384];
    for (;;) {
      const ssize_t n = ::read(err, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return;  // EAGAIN (nothing now), or EOF
      const std::size_t take =
          std::min(static_cast<std::size_t>(n), kMaxStderrBytes - shown.size());
      shown.append(buf, take);
      hidden += static_cast<std::size_t>(n) - take;
    }
  };
  // The record and a newline; a command that does not read it is fine. Non-blocking, so a
  // full socket never holds the notifier past the timeout.
  const std::string text = record + "\n";
  auto deadline = std::chrono::steady_clock::now() + timeout_;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ && drain_deadline_ < deadline) deadline = drain_deadline_;
  }
  size_t done = 0;
  int status = 0;
  for (;;) {
    if (to_command && done < text.size()) {
      const ssize_t n = ::send(to_command.get(), text.data() + done, text.size() - done,
                               MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) done += static_cast<size_t>(n);
      if (n < 0 && errno != EAGAIN && errno != EINTR) done = text.size();  // EPIPE: it left
    }
    if (done >= text.size()) to_command.reset();
    read_err();
    std::optional<int> exit;
    try {
      exit = command->try_wait();
    } catch (const HelperError&) {  // reaped elsewhere after all: its status is unknown
      to_command.reset();
      read_err();
      return forward_stderr(event, shown, hidden);
    }
    if (exit) {
      status = *exit;
      break;
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      command->kill_and_wait();  // the command's own process group
      to_command.reset();
      read_err();
      forward_stderr(event, shown, hidden);
      return failed(fmt::format("the command for '{}' ran past timeout_s = {} and was killed",
                                event, static_cast<double>(timeout_.count()) / 1000.0));
    }
    pollfd p{err, POLLIN, 0};
    ::poll(&p, 1, 10);
  }
  to_command.reset();
  read_err();  // what is there now (a process it left running may hold the pipe: not waited for)
  forward_stderr(event, shown, hidden);
  if (WIFEXITED(status) && (WEXITSTATUS(status) == 127 || WEXITSTATUS(status) == 126)) {
    // The shell could not run it: every later event would fail the same way.
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++failures_;
      gave_up_ = true;
    }
    if (warn_)
      warn_(fmt::format(
          "notify: the command for '{}' exited with {} ({}): it is not run again for later "
          "events; the job goes on (fix [notify] command)",
          event, WEXITSTATUS(status),
          WEXITSTATUS(status) == 127 ? "not found" : "found but not executable"));
    return;
  }
  if (WIFSIGNALED(status))
    return failed(
        fmt::format("the command for '{}' was killed by signal {}", event, WTERMSIG(status)));
  if (WIFEXITED(status) && WEXITSTATUS(status) != 0)
    return failed(fmt::format("the command for '{}' exited with {}", event, WEXITSTATUS(status)));
}

}  // namespace gpurun::supervisor
