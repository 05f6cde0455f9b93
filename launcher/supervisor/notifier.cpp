// [notify] command runner. Reference: docs/sharing.md#notifications.
#include "supervisor/notifier.hpp"

#include "gpurun/unique_fd.hpp"
#include "supervisor/owned_children.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include <fmt/format.h>
#include <boost/json.hpp>

extern char** environ;

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
  // Its stderr through a pipe of ours: forwarded bounded (kMaxStderrBytes a run), never a
  // flood on gpurun's own stderr, never a command blocked on a full pipe (read all along).
  int err[2];
  if (::pipe2(err, O_CLOEXEC) != 0) {
    ::close(in[0]);
    ::close(in[1]);
    return failed(fmt::format("cannot make a pipe for '{}': {}", event, std::strerror(errno)));
  }
  ::fcntl(err[0], F_SETFL, ::fcntl(err[0], F_GETFL) | O_NONBLOCK);
  std::string shown;
  std::size_t hidden = 0;
  const auto read_err = [&] {
    char buf[16384];
    for (;;) {
      const ssize_t n = ::read(err[0], buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return;  // EAGAIN (nothing now), or EOF
      const std::size_t take =
          std::min(static_cast<std::size_t>(n), kMaxStderrBytes - shown.size());
      shown.append(buf, take);
      hidden += static_cast<std::size_t>(n) - take;
    }
  };
  posix_spawn_file_actions_t fa;
  posix_spawnattr_t attr;
  posix_spawn_file_actions_init(&fa);
  posix_spawnattr_init(&attr);
  posix_spawn_file_actions_adddup2(&fa, in[0], STDIN_FILENO);
  posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, err[1], STDERR_FILENO);
  posix_spawnattr_setpgroup(&attr, 0);  // its own group: a timeout kills what it started too
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK);
  std::vector<std::string> env_text;
  for (char** e = environ; *e; ++e)
    if (std::strncmp(*e, "GPURUN_NOTIFY_EVENT=", 20) != 0) env_text.emplace_back(*e);
  env_text.push_back("GPURUN_NOTIFY_EVENT=" + event);
  std::vector<char*> envp;
  for (auto& s : env_text) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::string sh = "/bin/sh", dash_c = "-c", cmd = command_;
  char* argv[] = {sh.data(), dash_c.data(), cmd.data(), nullptr};
  pid_t pid = -1;
  int rc = 0;
  // Registered as ours before any reap can see it: the spawner's orphan reaper leaves it be.
  spawn_owned_child([&] {
    rc = ::posix_spawn(&pid, "/bin/sh", &fa, &attr, argv, envp.data());
    return rc == 0 ? static_cast<int>(pid) : -1;
  });
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  ::close(in[0]);
  ::close(err[1]);
  const UniqueFd err_fd(err[0]);
  if (rc != 0) {
    ::close(in[1]);
    return failed(fmt::format("cannot start /bin/sh for '{}': {}", event, std::strerror(rc)));
  }
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
  bool exited = false;
  while (!exited) {
    if (in[1] >= 0 && done < text.size()) {
      const ssize_t n =
          ::send(in[1], text.data() + done, text.size() - done, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) done += static_cast<size_t>(n);
      if (n < 0 && errno != EAGAIN && errno != EINTR) done = text.size();  // EPIPE: it left
    }
    if (in[1] >= 0 && done >= text.size()) {
      ::close(in[1]);
      in[1] = -1;
    }
    read_err();
    const pid_t w = ::waitpid(pid, &status, WNOHANG);
    if (w == pid) {
      exited = true;
      break;
    }
    if (w < 0 && errno == ECHILD) {  // reaped elsewhere after all: its status is unknown
      release_owned_child(pid);
      if (in[1] >= 0) ::close(in[1]);
      read_err();
      return forward_stderr(event, shown, hidden);
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      ::kill(-pid, SIGKILL);       // the command's own process group (setpgroup above); still ours:
      ::waitpid(pid, &status, 0);  // not reaped, so the pid cannot have been reused
      release_owned_child(pid);
      if (in[1] >= 0) ::close(in[1]);
      read_err();
      forward_stderr(event, shown, hidden);
      return failed(fmt::format("the command for '{}' ran past timeout_s = {} and was killed",
                                event, static_cast<double>(timeout_.count()) / 1000.0));
    }
    pollfd p{err_fd.get(), POLLIN, 0};
    ::poll(&p, 1, 10);
  }
  release_owned_child(pid);
  if (in[1] >= 0) ::close(in[1]);
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
