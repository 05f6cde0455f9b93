#include "energy/power_guard.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "energy/power_journal.hpp"
#include "gpurun/abstract_lock.hpp"
#include "gpurun/unique_fd.hpp"

namespace gpurun::energy {

namespace {

constexpr int kCommandFd = 3;  // the helper reads commands here
constexpr int kAckFd = 4;      // and answers here
constexpr auto kAckTimeout = std::chrono::seconds(10);
constexpr auto kExitTimeout = std::chrono::seconds(30);

/// The signals the helper ignores (it must outlive gpurun's own shutdown and terminal).
constexpr int kIgnored[] = {SIGINT, SIGTERM, SIGHUP, SIGPIPE};

std::string errno_text(int e) {
  return std::strerror(e);
}

/// write() all of `data` with SIGPIPE blocked for this thread, so a helper that died gives
/// EPIPE instead of killing the caller. Returns 0 or the errno.
int write_all_nosigpipe(int fd, const std::string& data) {
  sigset_t pipe_set, old;
  sigemptyset(&pipe_set);
  sigaddset(&pipe_set, SIGPIPE);
  sigset_t pending;
  sigemptyset(&pending);
  ::sigpending(&pending);
  const bool was_pending = sigismember(&pending, SIGPIPE) == 1;
  ::pthread_sigmask(SIG_BLOCK, &pipe_set, &old);
  int err = 0;
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      err = errno;
      break;
    }
    done += static_cast<size_t>(n);
  }
  if (err == EPIPE && !was_pending) {
    const timespec zero{};
    ::sigtimedwait(&pipe_set, nullptr, &zero);  // consume the SIGPIPE we caused
  }
  ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
  return err;
}

/// "700" or "612.5" (W) from milliwatts.
std::string watts(unsigned mw) {
  return fmt::format("{}", mw / 1000.0);
}

void say(const std::string& line) {
  const std::string text = "gpurun power guard: " + line + "\n";
  (void)!::write(2, text.data(), text.size());  // one write: line-atomic on a shared stderr
}

}  // namespace

PowerGuard::PowerGuard(const std::string& exe) {
  int cmd[2], ack[2];
  if (::pipe2(cmd, O_CLOEXEC) != 0)
    throw Error(fmt::format("power guard: pipe2 failed: {}", errno_text(errno)));
  if (::pipe2(ack, O_CLOEXEC) != 0) {
    const int e = errno;
    ::close(cmd[0]);
    ::close(cmd[1]);
    throw Error(fmt::format("power guard: pipe2 failed: {}", errno_text(e)));
  }
  // The helper's ends: dup'd into it as fds 3 and 4, closed here once it runs (or failed).
  const UniqueFd cmd_read(cmd[0]), ack_write(ack[1]);

  HelperOptions o;
  o.argv = {exe, "__power-guard"};
  o.stdin_stream = HelperStream::null();
  o.stdout_stream = HelperStream::null();  // stderr: gpurun's, for its "restored ..." lines
  o.fds = {{cmd[0], kCommandFd}, {ack[1], kAckFd}};
  // Own session: not in gpurun's process group or on its terminal, so neither a group kill
  // nor Ctrl-C reaches it. The ignored signals are blocked until power_guard_main() sets
  // SIG_IGN; every other disposition is reset to the default.
  o.group = HelperGroup::kOwnSession;
  o.blocked_signals.assign(std::begin(kIgnored), std::end(kIgnored));
  try {
    guard_.emplace(o);
  } catch (const HelperError& e) {
    ::close(cmd[1]);
    ::close(ack[0]);
    throw Error(fmt::format("power guard: cannot start '{} __power-guard': {}", exe,
                            errno_text(e.error_number())));
  }
  pid_ = guard_->pid();
  to_guard_ = cmd[1];
  from_guard_ = ack[0];
}

PowerGuard::~PowerGuard() {
  finish();
}

void PowerGuard::request(const std::string& line) {
  if (finished_ || to_guard_ < 0)
    throw Error(
        fmt::format("power guard (pid {}): already finished, cannot send '{}'", pid_, line));
  if (const int e = write_all_nosigpipe(to_guard_, line + "\n"); e != 0)
    throw Error(fmt::format("power guard (pid {}) is gone: sending '{}' failed: {}", pid_, line,
                            errno_text(e)));
  // The answer is one line; read it a byte at a time (a few bytes, rare calls).
  std::string answer;
  const auto deadline = std::chrono::steady_clock::now() + kAckTimeout;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0)
      throw Error(fmt::format("power guard (pid {}) did not acknowledge '{}' within {} s", pid_,
                              line, kAckTimeout.count()));
    pollfd p{from_guard_, POLLIN, 0};
    const int r = ::poll(&p, 1, static_cast<int>(left.count()));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0)
      throw Error(fmt::format("power guard (pid {}): poll failed: {}", pid_, errno_text(errno)));
    if (r == 0) continue;
    char c = 0;
    const ssize_t n = ::read(from_guard_, &c, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      throw Error(fmt::format("power guard (pid {}) exited before acknowledging '{}'", pid_, line));
    if (c == '\n') break;
    answer += c;
  }
  if (answer != "ok")
    throw Error(fmt::format("power guard (pid {}) refused '{}': {}", pid_, line, answer));
}

void PowerGuard::remember(const OriginalLimit& limit) {
  request(fmt::format("remember {} {}", limit.uuid, limit.milliwatts));
}

void PowerGuard::remember_clocks(const std::string& uuid) {
  request(fmt::format("clocks {}", uuid));
}

void PowerGuard::forget(const std::string& uuid) {
  request(fmt::format("forget {}", uuid));
}

bool PowerGuard::alive() const {
  if (finished_ || from_guard_ < 0) return false;
  pollfd p{from_guard_, POLLIN, 0};
  if (::poll(&p, 1, 0) <= 0) return true;  // nothing to read, no hang-up: still there
  if (p.revents & (POLLHUP | POLLERR)) return false;
  return true;  // an unread byte cannot happen between requests; not a death
}

namespace {

/// The machine-wide lock on one GPU's power limit: an abstract Unix socket named after the
/// GPU's UUID (`@gpurun-power/<uuid>`), bound and listening while held. Keyed by nothing but
/// the UUID — no directory, no environment variable, no file permissions — so every gpurun
/// on the machine (root or not, any configuration) contends for the same one; the kernel
/// frees it when its holder exits, kill -9 included. Returns the bound socket, or -1 with
/// `why` set: the holder's pid (SO_PEERCRED of a connection to it) when another guard holds it.
int lock_gpu(const std::string& uuid, std::string& why) {
  const std::string name = gpu_lock_name(uuid);
  sockaddr_un addr{};
  socklen_t len = 0;
  if (!gpurun::abstract_address(name, addr, len)) {
    why = fmt::format("the GPU UUID '{}' is too long for its power-limit lock", uuid);
    return -1;
  }
  if (const int fd = gpurun::take_abstract_lock(name); fd >= 0) return fd;
  const int bind_errno = errno;
  if (bind_errno != EADDRINUSE) {
    why = fmt::format("cannot take the power-limit lock @{}: {}", name, errno_text(bind_errno));
    return -1;
  }
  std::string holder = "unknown";
  const int probe = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (probe >= 0) {
    ucred cred{};
    socklen_t cred_len = sizeof cred;
    if (::connect(probe, reinterpret_cast<const sockaddr*>(&addr), len) == 0 &&
        ::getsockopt(probe, SOL_SOCKET, SO_PEERCRED, &cred, &cred_len) == 0 && cred.pid > 0)
      holder = std::to_string(cred.pid);
    ::close(probe);
  }
  why = fmt::format("{} is power-managed by another gpurun (its guard, pid {}, holds @{})", uuid,
                    holder, name);
  return -1;
}

}  // namespace

int PowerGuard::finish() {
  if (finished_) return exit_status_;
  finished_ = true;
  if (to_guard_ >= 0) ::close(to_guard_);  // EOF: the helper restores and exits
  to_guard_ = -1;
  if (guard_) {
    std::optional<int> status;
    try {
      status = guard_->wait_for(kExitTimeout);
    } catch (const HelperError&) {
      // reaped elsewhere: its status is unknown
    }
    if (status)
      exit_status_ = WIFEXITED(*status)     ? WEXITSTATUS(*status)
                     : WIFSIGNALED(*status) ? 128 + WTERMSIG(*status)
                                            : -1;
    else
      guard_->release();  // still running after kExitTimeout: it goes on in its own session
  }
  if (from_guard_ >= 0) ::close(from_guard_);
  from_guard_ = -1;
  return exit_status_;
}

int power_guard_main() {
  for (int sig : kIgnored) ::signal(sig, SIG_IGN);
  sigset_t mask;
  sigemptyset(&mask);
  ::sigprocmask(SIG_SETMASK, &mask, nullptr);
  auto is_pipe = [](int fd) {
    struct stat st {};
    return ::fstat(fd, &st) == 0 && S_ISFIFO(st.st_mode);
  };
  if (!is_pipe(kCommandFd) || !is_pipe(kAckFd)) {
    say("started without its pipes (fds 3 and 4); gpurun starts it itself, do not run it by hand");
    return 2;
  }

  // Remembered originals, in the order gpurun reported them, and the lock held on each GPU:
  // one guard (one gpurun) at a time may change a GPU's limit, until it has restored it —
  // a second job would otherwise take the first one's limit for the original. Each is also in
  // the power journal (power_journal.hpp) until it is back, for when this guard is killed too.
  struct Held {
    std::string uuid;
    unsigned mw = 0;      // original power limit (0: the limit was not changed)
    bool clocks = false;  // gpurun locked its clocks: reset them
  };
  std::vector<Held> held;
  std::map<std::string, int> locks;  // uuid -> its lock_gpu() socket
  const std::filesystem::path journal = journal_path();
  const std::string host = host_name();
  bool journal_failed = false;
  auto journal_write = [&](const Held& h, bool remove) {
    JournalEntry e;
    e.host = host;
    e.uuid = h.uuid;
    e.original_mw = h.mw;
    e.clocks_locked = h.clocks;
    e.guard_pid = ::getpid();
    e.since_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                     std::chrono::system_clock::now().time_since_epoch())
                     .count();
    try {
      update_journal(journal, e, remove);
    } catch (const Error& ex) {
      if (!std::exchange(journal_failed, true))
        say(
            fmt::format("warning: {}; a kill -9 of both gpurun and this guard would leave the "
                        "GPUs as changed until someone restores them",
                        ex.what()));
    }
  };
  auto reply = [](const std::string& text) {
    const std::string line = text + "\n";
    (void)!::write(kAckFd, line.data(), line.size());  // gpurun gone: EPIPE, ignored
  };
  auto find = [&](const std::string& uuid) -> Held* {
    for (Held& h : held)
      if (h.uuid == uuid) return &h;
    return nullptr;
  };
  auto handle = [&](const std::string& line) {
    std::istringstream in(line);
    std::string verb, uuid;
    in >> verb >> uuid;
    if (verb == "remember" || verb == "clocks") {
      unsigned long mw = 0;
      if (verb == "remember" && (uuid.empty() || !(in >> mw) || mw == 0 || mw > 0xFFFFFFFFul))
        return reply("error 'remember' needs a GPU UUID and a limit in milliwatts: " + line);
      if (uuid.empty()) return reply("error 'clocks' needs a GPU UUID: " + line);
      Held* h = find(uuid);
      if (h == nullptr) {
        std::string why;
        const int fd = lock_gpu(uuid, why);
        if (fd < 0) return reply("error " + why);
        locks[uuid] = fd;
        held.push_back(Held{uuid});
        h = &held.back();
      }
      if (verb == "remember" && h->mw == 0) h->mw = static_cast<unsigned>(mw);
      if (verb == "clocks") h->clocks = true;
      journal_write(*h, /*remove=*/false);  // before gpurun changes anything
      return reply("ok");
    }
    if (verb == "forget" && !uuid.empty()) {
      if (Held* h = find(uuid)) journal_write(*h, /*remove=*/true);
      std::erase_if(held, [&](const Held& h) { return h.uuid == uuid; });
      if (auto it = locks.find(uuid); it != locks.end()) {  // restored by gpurun: free the GPU
        ::close(it->second);
        locks.erase(it);
      }
      return reply("ok");
    }
    reply("error unknown command: " + line);
  };

  std::string buffer;
  char chunk[4096];
  for (;;) {
    const ssize_t n = ::read(kCommandFd, chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // EOF: gpurun finished or died
    buffer.append(chunk, static_cast<size_t>(n));
    size_t nl;
    while ((nl = buffer.find('\n')) != std::string::npos) {
      handle(buffer.substr(0, nl));
      buffer.erase(0, nl + 1);
    }
  }
  ::close(kCommandFd);
  ::close(kAckFd);
  if (held.empty()) return 0;

  std::string why_not;
  const auto nvml = Nvml::open(why_not);
  if (!nvml) {
    for (const Held& h : held)
      say(fmt::format("could not restore {}: {} (it stays in the power journal {})", h.uuid,
                      why_not, journal.string()));
    return 1;
  }
  bool failed = false;
  for (const Held& h : held) {
    try {
      const NvmlDevice d = nvml->device_by_uuid(h.uuid);
      if (h.clocks) {
        nvml->reset_gpu_locked_clocks(d);
        say(fmt::format("reset the locked clocks of {}", h.uuid));
      }
      if (h.mw != 0 && nvml->power_limit_mw(d) == h.mw) {
        say(fmt::format("{} already at its original {} W", h.uuid, watts(h.mw)));
      } else if (h.mw != 0) {
        nvml->set_power_limit_mw(d, h.mw);
        say(fmt::format("restored {} to {} W", h.uuid, watts(h.mw)));
      }
      journal_write(h, /*remove=*/true);
    } catch (const std::exception& e) {
      say(fmt::format("could not restore {}{}: {} (it stays in the power journal {})", h.uuid,
                      h.mw != 0 ? fmt::format(" to {} W", watts(h.mw)) : std::string(), e.what(),
                      journal.string()));
      failed = true;
    }
  }
  return failed ? 1 : 0;
}

}  // namespace gpurun::energy
