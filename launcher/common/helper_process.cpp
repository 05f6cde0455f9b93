// gpurun::HelperProcess: posix_spawn with one set of rules for every helper program.
// Reference: include/gpurun/helper_process.hpp.
#include "gpurun/helper_process.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <fstream>
#include <mutex>
#include <thread>

#include <fmt/format.h>

extern char** environ;

namespace gpurun {

namespace {

// The registry of helpers whose owner waits for them (see reap_children_except).
std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}
std::set<int>& registry() {
  static std::set<int> s;
  return s;
}
void unregister(pid_t pid) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  registry().erase(pid);
}

std::string name_of(std::string_view entry) {
  return std::string(entry.substr(0, entry.find('=')));
}

/// gpurun's environment (or none) with `extra` added, each replacing an inherited name.
std::vector<std::string> environment_of(const HelperOptions& o) {
  std::set<std::string> replaced;
  for (const std::string& e : o.environment) replaced.insert(name_of(e));
  std::vector<std::string> out;
  if (o.inherit_environment)
    for (char** e = environ; *e; ++e)
      if (replaced.count(name_of(*e)) == 0) out.emplace_back(*e);
  out.insert(out.end(), o.environment.begin(), o.environment.end());
  return out;
}

/// posix_spawn's file actions and attributes, destroyed with it.
struct SpawnSetup {
  posix_spawn_file_actions_t actions;
  posix_spawnattr_t attr;
  SpawnSetup() {
    ::posix_spawn_file_actions_init(&actions);
    ::posix_spawnattr_init(&attr);
  }
  ~SpawnSetup() {
    ::posix_spawn_file_actions_destroy(&actions);
    ::posix_spawnattr_destroy(&attr);
  }
  SpawnSetup(const SpawnSetup&) = delete;
  SpawnSetup& operator=(const SpawnSetup&) = delete;
};

}  // namespace

HelperProcess::HelperProcess(const HelperOptions& o) {
  if (o.argv.empty() || o.argv[0].empty())
    throw HelperError("cannot start a helper program: no program given", EINVAL);
  name_ = o.argv[0];
  group_ = o.group;
  const auto fail = [&](const std::string& step, int e) {
    throw HelperError(fmt::format("cannot start {}: {}: {}", name_, step, std::strerror(e)), e);
  };

  // Every descriptor dup'd into the child comes from above the highest number it is given, so
  // no dup2 overwrites the source of a later one (a swap works too).
  int top = 2;
  for (const auto& m : o.fds) top = std::max(top, m.second);
  std::vector<UniqueFd> temporaries;  // lifted copies and the child's pipe ends: closed below
  const auto lift = [&](int fd) {
    if (fd > top) return fd;
    const int copy = ::fcntl(fd, F_DUPFD_CLOEXEC, top + 1);
    if (copy < 0) fail(fmt::format("cannot copy descriptor {}", fd), errno);
    temporaries.emplace_back(copy);
    return copy;
  };

  SpawnSetup s;
  const HelperStream* streams[3] = {&o.stdin_stream, &o.stdout_stream, &o.stderr_stream};
  for (int i = 0; i < 3; ++i) {
    const HelperStream& st = *streams[i];
    switch (st.kind) {
      case HelperStream::Kind::kInherit:
        break;
      case HelperStream::Kind::kNull:
        ::posix_spawn_file_actions_addopen(&s.actions, i, "/dev/null", i == 0 ? O_RDONLY : O_WRONLY,
                                           0);
        break;
      case HelperStream::Kind::kPipe: {
        int p[2];
        if (::pipe2(p, O_CLOEXEC) != 0) fail("cannot make a pipe", errno);
        const int child_end = i == 0 ? p[0] : p[1];
        pipes_[i] = UniqueFd(i == 0 ? p[1] : p[0]);
        temporaries.emplace_back(child_end);
        ::posix_spawn_file_actions_adddup2(&s.actions, lift(child_end), i);
        break;
      }
      case HelperStream::Kind::kFile:
        ::posix_spawn_file_actions_addopen(&s.actions, i, st.path.c_str(),
                                           O_WRONLY | O_CREAT | O_TRUNC, 0644);
        break;
      case HelperStream::Kind::kFd:
        ::posix_spawn_file_actions_adddup2(&s.actions, lift(st.fd), i);
        break;
      case HelperStream::Kind::kStdout:
        if (i != 2) throw HelperError("HelperStream::to_stdout() is for stderr only", EINVAL);
        ::posix_spawn_file_actions_adddup2(&s.actions, 1, 2);
        break;
    }
  }
  for (const auto& m : o.fds)
    ::posix_spawn_file_actions_adddup2(&s.actions, lift(m.first), m.second);  // clears CLOEXEC
  // Descriptors gpurun did not mark close-on-exec (e.g. a worker's pipe) stay out of the
  // helper, which would otherwise keep them open for as long as it lives. (Closing one that
  // is not open is no error for posix_spawn.)
  for (int fd = 3; fd <= top; ++fd)
    if (std::none_of(o.fds.begin(), o.fds.end(), [fd](const auto& m) { return m.second == fd; }))
      ::posix_spawn_file_actions_addclose(&s.actions, fd);
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 34))
  ::posix_spawn_file_actions_addclosefrom_np(&s.actions, top + 1);
#endif

  sigset_t mask, defaults;
  sigemptyset(&mask);
  sigfillset(&defaults);
  for (int sig : o.blocked_signals) {
    sigaddset(&mask, sig);
    sigdelset(&defaults, sig);
  }
  ::posix_spawnattr_setsigmask(&s.attr, &mask);
  ::posix_spawnattr_setsigdefault(&s.attr, &defaults);
  short flags = POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF;
  if (o.group == HelperGroup::kOwnGroup) {
    ::posix_spawnattr_setpgroup(&s.attr, 0);
    flags |= POSIX_SPAWN_SETPGROUP;
  } else if (o.group == HelperGroup::kOwnSession) {
    flags |= POSIX_SPAWN_SETSID;
  }
  ::posix_spawnattr_setflags(&s.attr, flags);

  std::vector<std::string> args = o.argv, env = environment_of(o);
  std::vector<char*> argv, envp;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (std::string& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);

  int rc = 0;
  {
    // Registered before any reap can see it: reap_children_except leaves it to us.
    std::lock_guard<std::mutex> lock(registry_mutex());
    pid_t pid = -1;
    rc = o.search_path
             ? ::posix_spawnp(&pid, name_.c_str(), &s.actions, &s.attr, argv.data(), envp.data())
             : ::posix_spawn(&pid, name_.c_str(), &s.actions, &s.attr, argv.data(), envp.data());
    if (rc == 0) {
      pid_ = pid;
      registry().insert(pid);
    }
  }
  if (rc != 0) {
    for (UniqueFd& p : pipes_) p.reset();
    throw HelperError(fmt::format("cannot start {}: {}", name_, std::strerror(rc)), rc);
  }
#ifdef SYS_pidfd_open
  // Ours and not reaped: the pid cannot name another process yet.
  if (const long fd = ::syscall(SYS_pidfd_open, pid_, 0); fd >= 0)
    pidfd_ = UniqueFd(static_cast<int>(fd));
#endif
}

HelperProcess::~HelperProcess() {
  end();
}

void HelperProcess::end() noexcept {
  if (pid_ <= 0 || status_ || released_) return;
  try {
    kill_and_wait();
  } catch (const HelperError&) {
    // reaped elsewhere: nothing left to do
  }
}

HelperProcess::HelperProcess(HelperProcess&& other) noexcept {
  *this = std::move(other);
}

HelperProcess& HelperProcess::operator=(HelperProcess&& other) noexcept {
  if (this == &other) return *this;
  end();
  pid_ = std::exchange(other.pid_, -1);
  group_ = other.group_;
  name_ = std::move(other.name_);
  for (int i = 0; i < 3; ++i) pipes_[i] = std::move(other.pipes_[i]);
  pidfd_ = std::move(other.pidfd_);
  status_ = std::exchange(other.status_, std::nullopt);
  released_ = std::exchange(other.released_, false);
  return *this;
}

std::string HelperProcess::read_stdout() {
  std::string out;
  const int fd = pipes_[1].get();
  if (fd < 0) return out;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n > 0) {
      out.append(buf, static_cast<size_t>(n));
    } else if (n == 0) {
      return out;
    } else if (errno == EAGAIN) {
      pollfd p{fd, POLLIN, 0};
      ::poll(&p, 1, -1);
    } else if (errno != EINTR) {
      const int e = errno;
      throw HelperError(fmt::format("reading the output of {} (pid {}) failed: {}", name_, pid_,
                                    std::strerror(e)),
                        e);
    }
  }
}

void HelperProcess::reaped(int status) {
  status_ = status;
  unregister(pid_);
  pidfd_.reset();
}

std::optional<int> HelperProcess::try_wait() {
  if (status_ || released_ || pid_ <= 0) return status_;
  for (;;) {
    int status = 0;
    const pid_t r = ::waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      reaped(status);
      return status_;
    }
    if (r == 0) return std::nullopt;
    if (errno == EINTR) continue;
    const int e = errno;
    release();  // reaped elsewhere (or never ours): nothing more to wait for
    throw HelperError(
        fmt::format("waiting for {} (pid {}) failed: {}", name_, pid_, std::strerror(e)), e);
  }
}

std::optional<int> HelperProcess::wait_for(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    if (const std::optional<int> s = try_wait(); s || released_) return s;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return std::nullopt;
    if (pidfd_) {
      pollfd p{pidfd_.get(), POLLIN, 0};
      ::poll(&p, 1, static_cast<int>(std::min<long long>(left.count() + 1, INT_MAX)));
    } else {  // a kernel before 5.3: no pidfd
      std::this_thread::sleep_for(std::min(left, std::chrono::milliseconds(5)));
    }
  }
}

int HelperProcess::wait() {
  for (;;) {
    if (const std::optional<int> s = wait_for(std::chrono::hours(1))) return *s;
    if (released_ || pid_ <= 0) return -1;
  }
}

int HelperProcess::kill_and_wait() {
  if (status_ || released_ || pid_ <= 0) return status_.value_or(-1);
  // Not reaped yet, so neither the pid nor its group id can have been reused.
  ::kill(group_ == HelperGroup::kInherit ? pid_ : -pid_, SIGKILL);
  return wait();
}

void HelperProcess::release() {
  if (pid_ <= 0 || status_ || released_) return;
  released_ = true;
  unregister(pid_);
  pidfd_.reset();
}

std::optional<std::string> output_of(const std::vector<std::string>& argv,
                                     std::optional<std::chrono::milliseconds> timeout) {
  HelperOptions o;
  o.argv = argv;
  o.search_path = true;
  o.stdout_stream = HelperStream::pipe();
  o.stderr_stream = HelperStream::null();
  if (timeout) {
    o.stdin_stream = HelperStream::null();
    o.group = HelperGroup::kOwnGroup;  // the kill reaches what it started too
  }
  try {
    HelperProcess p(o);
    std::optional<int> status;
    if (timeout) {
      status = p.wait_for(*timeout);
      if (!status) return std::nullopt;  // the destructor kills its group and reaps it
    }
    std::string out = p.read_stdout();
    if (!status) status = p.wait();
    if (WIFEXITED(*status) && WEXITSTATUS(*status) == 0) return out;
  } catch (const HelperError&) {
    // not installed, not executable, or reaped elsewhere: no answer
  }
  return std::nullopt;
}

void reap_children_except(const std::set<int>& keep) {
  std::vector<int> children;
  if (DIR* tasks = ::opendir("/proc/self/task")) {
    while (const dirent* e = ::readdir(tasks)) {
      if (e->d_name[0] == '.') continue;
      std::ifstream in(std::string("/proc/self/task/") + e->d_name + "/children");
      for (int pid; in >> pid;) children.push_back(pid);
    }
    ::closedir(tasks);
  }
  std::lock_guard<std::mutex> lock(registry_mutex());
  for (int pid : children)
    if (keep.count(pid) == 0 && registry().count(pid) == 0) ::waitpid(pid, nullptr, WNOHANG);
}

}  // namespace gpurun
