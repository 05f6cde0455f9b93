#include "supervisor/posix_spawner.hpp"

#include "supervisor/owned_children.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <climits>
#include <cstring>
#include <fstream>
#include <optional>
#include <set>
#include <tuple>

#include <fmt/format.h>
#include <boost/asio/read.hpp>
#include <boost/asio/readable_pipe.hpp>

#include "gpurun/check.hpp"
#include "gpurun/sanitizers.hpp"
#include "gpurun/unique_fd.hpp"
#include "supervisor/boost_process.hpp"

// AddressSanitizer builds (GPURUN_SANITIZE=address): the clone child's stack is ours, see
// CloneLauncher::launch.
#ifdef GPURUN_ASAN
#include <sanitizer/asan_interface.h>
#define GPURUN_ASAN_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define GPURUN_ASAN_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

namespace gpurun::supervisor {

std::string signal_name(int sig) {
  switch (sig) {
    case SIGHUP:
      return "SIGHUP";
    case SIGINT:
      return "SIGINT";
    case SIGQUIT:
      return "SIGQUIT";
    case SIGILL:
      return "SIGILL";
    case SIGTRAP:
      return "SIGTRAP";
    case SIGABRT:
      return "SIGABRT";
    case SIGBUS:
      return "SIGBUS";
    case SIGFPE:
      return "SIGFPE";
    case SIGKILL:
      return "SIGKILL";
    case SIGUSR1:
      return "SIGUSR1";
    case SIGSEGV:
      return "SIGSEGV";
    case SIGUSR2:
      return "SIGUSR2";
    case SIGPIPE:
      return "SIGPIPE";
    case SIGALRM:
      return "SIGALRM";
    case SIGTERM:
      return "SIGTERM";
    case SIGCHLD:
      return "SIGCHLD";
    case SIGCONT:
      return "SIGCONT";
    case SIGSTOP:
      return "SIGSTOP";
    case SIGXCPU:
      return "SIGXCPU";
    case SIGXFSZ:
      return "SIGXFSZ";
    case SIGSYS:
      return "SIGSYS";
    default:
      return fmt::format("signal {}", sig);
  }
}

std::string ExitStatus::describe() const {
  const std::string why = cause.empty() ? std::string() : ": " + cause;
  if (signal != 0) return fmt::format("signal {} ({}){}", signal_name(signal), signal, why);
  return fmt::format("exit code {}{}", code, why);
}

namespace {

namespace asio = boost::asio;
namespace bp = boost::process::v2;

/// Boost.Process initializer: environment, own process group, parent-death signal.
struct WorkerInit {
  pid_t parent = ::getpid();
  const char* const* envp = nullptr;
  std::optional<rlimit> nofile;  // RLIMIT_NOFILE to give the worker

  template <typename Launcher>
  bp::error_code on_setup(Launcher& launcher, const bp::filesystem::path&, const char* const*(&)) {
    launcher.env = envp;
    return {};
  }

  // Runs in the child between clone and exec, on the parent's memory: system calls only,
  // no allocation, no locks.
  template <typename Launcher>
  bp::error_code on_exec_setup(Launcher&, const bp::filesystem::path&, const char* const*(&)) {
    if (::setpgid(0, 0) != 0) return bp::error_code(errno, bp::system_category());
    if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0)
      return bp::error_code(errno, bp::system_category());
    if (::getppid() != parent) ::_exit(127);           // gpurun died before prctl took effect
    if (nofile) ::setrlimit(RLIMIT_NOFILE, &*nofile);  // the limit gpurun was started with
    // Ignored dispositions survive exec: give the worker a clean slate.
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    for (int sig : {SIGPIPE, SIGINT, SIGQUIT, SIGTERM, SIGHUP, SIGUSR1, SIGUSR2, SIGCHLD, SIGXFSZ})
      ::sigaction(sig, &dfl, nullptr);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    return {};
  }
};

/// Boost.Process launcher that starts the child with clone(CLONE_VM | CLONE_VFORK) on a
/// private stack, the way glibc's posix_spawn does, instead of fork(). fork() copies
/// gpurun's page tables (64 KiB read buffers per worker) and Boost's default launcher
/// re-registers every Asio descriptor in the child (notify_fork), so each spawn cost
/// O(workers already started): 2,000 workers took 77 s. Here a spawn costs the exec plus
/// copying the descriptor table. The child never touches the Asio reactor: it runs the
/// initializers' on_exec_setup (async-signal-safe calls), closes every descriptor above
/// stderr and execs; all signals stay blocked until handlers are reset to SIG_DFL.
struct CloneLauncher : bp::posix::default_launcher {
  template <typename Executor, typename... Inits>
  bp::basic_process<Executor> launch(Executor exec, bp::error_code& ec,
                                     const bp::filesystem::path& exe,
                                     const std::vector<std::string>& args, Inits&... inits) {
    const char* const* argv = build_argv_(exe, args);
    ec = bp::posix::detail::on_setup(*this, exe, argv, inits...);
    if (ec) {
      bp::posix::detail::on_error(*this, exe, argv, ec, inits...);
      return bp::basic_process<Executor>(exec);
    }
    struct Child {
      CloneLauncher* self;
      const bp::filesystem::path* exe;
      const char* const* argv;
      std::tuple<Inits&...> inits;
      int error;     // errno of the failed step, written by the child before it exits
      int error_fd;  // -1, or under ThreadSanitizer the pipe that carries `error`

      static void set_error(Child& c, int error) {  // in the child
        c.error = error;
        if (c.error_fd >= 0) (void)!::write(c.error_fd, &error, sizeof error);
      }
    } child{this, &exe, argv, std::tuple<Inits&...>(inits...), 0, -1};
#ifdef GPURUN_TSAN
    // ThreadSanitizer cannot follow a child that shares gpurun's memory: its clone interceptor
    // updates the runtime's per-thread state from both sides, and the parent then fails the
    // runtime's CHECK "!thr->slot". Under TSan (only) the child gets its own copy of the
    // memory, a fork on this stack, and sends the errno of a failed step through a
    // close-on-exec pipe (closed unread when exec succeeds) instead of writing `child.error`.
    constexpr int kCloneFlags = SIGCHLD;
    int error_pipe[2];
    if (::pipe2(error_pipe, O_CLOEXEC) != 0) {
      ec.assign(errno, bp::system_category());
      bp::posix::detail::on_error(*this, exe, argv, ec, inits...);
      return bp::basic_process<Executor>(exec);
    }
    const UniqueFd error_read(error_pipe[0]);
    UniqueFd error_write(error_pipe[1]);
    child.error_fd = error_write.get();
#else
    constexpr int kCloneFlags = CLONE_VM | CLONE_VFORK | SIGCHLD;
#endif

    constexpr size_t kStackBytes = 256 * 1024;
    void* stack = ::mmap(nullptr, kStackBytes, PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
    if (stack == MAP_FAILED) {
      ec.assign(errno, bp::system_category());
      bp::posix::detail::on_error(*this, exe, argv, ec, inits...);
      return bp::basic_process<Executor>(exec);
    }
    // ASan keeps shadow memory per address, not per mapping: the child's instrumented frames
    // poison redzones on this stack and it leaves by exec/_exit without unwinding them, so
    // the next spawn's mmap (often the same address) started on stale poison and ASan's own
    // sigaltstack call in the child reported a stack-buffer-overflow. Start and end clean.
    GPURUN_ASAN_UNPOISON(stack, kStackBytes);
    // A signal handler must not run in the child (it shares our memory): block all
    // signals across clone; the child resets handlers before unblocking.
    sigset_t all, old;
    sigfillset(&all);
    ::pthread_sigmask(SIG_SETMASK, &all, &old);
    auto entry = +[](void* arg) -> int {
      auto& c = *static_cast<Child*>(arg);
      for (int sig = 1; sig < NSIG; ++sig) {
        struct sigaction sa {};
        if (::sigaction(sig, nullptr, &sa) != 0) continue;
        if (sa.sa_handler == SIG_IGN || sa.sa_handler == SIG_DFL) continue;
        sa = {};
        sa.sa_handler = SIG_DFL;
        ::sigaction(sig, &sa, nullptr);
      }
      const char* const* cmd = c.argv;
      bp::error_code e = std::apply(
          [&](auto&... in) {
            return bp::posix::detail::on_exec_setup(*c.self, *c.exe, cmd, in...);
          },
          c.inits);
      if (e) {
        Child::set_error(c, e.value() != 0 ? e.value() : EINVAL);
        ::_exit(127);
      }
      // Descriptors gpurun did not mark CLOEXEC (not the error pipe, which is above them).
      ::syscall(SYS_close_range, 3u, c.error_fd >= 0 ? unsigned(c.error_fd) - 1 : ~0u, 0u);
      if (c.error_fd >= 0) ::syscall(SYS_close_range, unsigned(c.error_fd) + 1, ~0u, 0u);
      ::execve(c.exe->c_str(), const_cast<char* const*>(cmd),
               const_cast<char* const*>(c.self->env));
      Child::set_error(c, errno);
      ::_exit(127);
    };
    pid = ::clone(entry, static_cast<char*>(stack) + kStackBytes, kCloneFlags, &child);
    const int clone_errno = errno;
#ifdef GPURUN_TSAN
    error_write.reset();
    if (pid >= 0) {
      int error = 0;
      ssize_t n;
      while ((n = ::read(error_read.get(), &error, sizeof error)) < 0 && errno == EINTR) {
      }
      if (n == static_cast<ssize_t>(sizeof error)) child.error = error;
    }
#endif
    ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
    GPURUN_ASAN_UNPOISON(stack, kStackBytes);
    ::munmap(stack, kStackBytes);
    if (pid < 0) {
      ec.assign(clone_errno, bp::system_category());
    } else if (child.error != 0) {
      ::waitpid(pid, nullptr, 0);  // it exited before exec: reap it here
      ec.assign(child.error, bp::system_category());
    }
    if (ec) {
      bp::posix::detail::on_error(*this, exe, argv, ec, inits...);
      return bp::basic_process<Executor>(exec);
    }
    bp::basic_process<Executor> proc(exec, pid);
    bp::posix::detail::on_success(*this, exe, argv, ec, inits...);
    return proc;
  }
};

/// A pseudo-terminal for one output stream of a worker: the master (read by gpurun) and the
/// slave (the worker's fd 1 or 2), both close-on-exec, neither anyone's controlling terminal.
struct Pty {
  int master = -1;  // handed to an Asio pipe, which closes it
  UniqueFd slave;
};

/// Gives the pty `fd` (master or slave) the window size of gpurun's fd `like_fd` less
/// `margin` columns (the console prefix; at least 1 column is left). Nothing when `like_fd`
/// is not a terminal or reports no width.
void copy_window_size(int like_fd, int fd, int margin) {
  winsize ws{};
  if (::ioctl(like_fd, TIOCGWINSZ, &ws) != 0) return;
  if (ws.ws_col > 0 && margin > 0)
    ws.ws_col = static_cast<unsigned short>(ws.ws_col > margin ? ws.ws_col - margin : 1);
  ::ioctl(fd, TIOCSWINSZ, &ws);
}

/// Opens a pty whose slave is raw (cfmakeraw: no output processing, so no "\n" -> "\r\n"
/// translation, and no echo) and has the window size of gpurun's fd `like_fd`, less `margin`
/// columns, when that is a terminal. nullopt when none can be opened (no /dev/ptmx, the pty
/// limit reached).
std::optional<Pty> open_pty(int like_fd, int margin) {
  UniqueFd master(::posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC));
  if (!master) return std::nullopt;
  if (::grantpt(master.get()) != 0 || ::unlockpt(master.get()) != 0) return std::nullopt;
  char name[128];
  if (::ptsname_r(master.get(), name, sizeof name) != 0) return std::nullopt;
  UniqueFd slave(::open(name, O_RDWR | O_NOCTTY | O_CLOEXEC));
  if (!slave) return std::nullopt;
  termios t{};
  if (::tcgetattr(slave.get(), &t) == 0) {
    ::cfmakeraw(&t);
    ::tcsetattr(slave.get(), TCSANOW, &t);
  }
  copy_window_size(like_fd, slave.get(), margin);
  Pty p;
  p.master = ::fcntl(master.get(), F_DUPFD_CLOEXEC, 3);  // a copy the caller owns
  if (p.master < 0) return std::nullopt;
  p.slave = std::move(slave);
  return p;
}

}  // namespace

/// Reaps children of gpurun that are not workers: processes a worker left behind are
/// re-parented to gpurun (PR_SET_CHILD_SUBREAPER) and would otherwise stay zombies,
/// which keep their process group "alive" for killpg(pgid, 0). Worker pids are left to
/// Boost.Process's own wait.
struct PosixSpawner::Reaper {
  std::set<int> workers;  // started and not yet reaped by Boost.Process
  std::chrono::steady_clock::time_point last{};

  void reap_orphans() {
    const auto now = std::chrono::steady_clock::now();
    if (now - last < std::chrono::milliseconds(5)) return;  // once per burst of polls
    last = now;
    reap_children_except(workers);  // nor a [notify] command (owned_children.hpp)
  }
};

namespace {

/// State shared with pending Asio handlers; outlives the handle if needed.
struct PosixWorkerState : std::enable_shared_from_this<PosixWorkerState> {
  explicit PosixWorkerState(asio::io_context& io) : out(io), err(io) {}

  asio::readable_pipe out;
  asio::readable_pipe err;
  std::optional<bp::process> proc;
  std::array<char, 64 * 1024> out_buf{};
  std::array<char, 64 * 1024> err_buf{};
  WorkerCallbacks cb;
  std::shared_ptr<PosixSpawner::Reaper> reaper;
  int pid = -1;
  bool detached = false;  // handle destroyed: drop notifications
  bool out_pty = false;   // `out` / `err` read a pty master (terminal_resized resizes it)
  bool err_pty = false;
  int pty_margin = 0;  // SpawnRequest::pty_margin_columns

  void read(StreamId id) {
    auto& pipe = id == StreamId::kStdout ? out : err;
    auto& buf = id == StreamId::kStdout ? out_buf : err_buf;
    pipe.async_read_some(asio::buffer(buf), [self = shared_from_this(), id, &buf](
                                                const boost::system::error_code& ec, size_t n) {
      if (n > 0 && !self->detached && self->cb.on_output)
        self->cb.on_output(id, std::string_view(buf.data(), n));
      if (ec) {
        if (!self->detached && self->cb.on_stream_closed) self->cb.on_stream_closed(id);
        return;
      }
      self->read(id);
    });
  }

  void wait() {
    proc->async_wait([self = shared_from_this()](const boost::system::error_code& ec, int) {
      ExitStatus st;
      if (ec) {
        st.code = 255;  // cannot learn the status; report a failure rather than success
      } else {
        const int raw = self->proc->native_exit_code();
        if (WIFSIGNALED(raw))
          st.signal = WTERMSIG(raw);
        else
          st.code = WEXITSTATUS(raw);
      }
      self->reaper->workers.erase(self->pid);
      self->reaper->reap_orphans();
      if (!self->detached && self->cb.on_exit) self->cb.on_exit(st);
    });
  }
};

class PosixWorker : public WorkerProcess {
 public:
  PosixWorker(std::shared_ptr<PosixWorkerState> state, int pid)
      : state_(std::move(state)), pid_(pid) {}
  ~PosixWorker() override {
    state_->detached = true;
    boost::system::error_code ignored;
    state_->out.close(ignored);
    state_->err.close(ignored);
  }
  int pid() const override { return pid_; }
  bool signal_group(int sig) override {
    if (::killpg(pid_, sig) == 0) return true;
    if (errno == ESRCH) return false;
    throw ProcessError(fmt::format("cannot send {} to process group {}: {}", signal_name(sig), pid_,
                                   std::strerror(errno)));
  }
  bool group_alive() const override {
    state_->reaper->reap_orphans();  // a zombie gpurun has not reaped still counts for killpg
    return ::killpg(pid_, 0) == 0 || errno == EPERM;
  }
  void terminal_resized() override {
    bool any = false;
    if (state_->out_pty && state_->out.is_open()) {
      copy_window_size(STDOUT_FILENO, state_->out.native_handle(), state_->pty_margin);
      any = true;
    }
    if (state_->err_pty && state_->err.is_open()) {
      copy_window_size(STDERR_FILENO, state_->err.native_handle(), state_->pty_margin);
      any = true;
    }
    if (any) ::killpg(pid_, SIGWINCH);  // ESRCH (gone meanwhile) is fine
  }

 private:
  std::shared_ptr<PosixWorkerState> state_;
  int pid_;
};

}  // namespace

PosixSpawner::PosixSpawner(boost::asio::io_context& io, PosixSpawnerOptions options)
    : io_(io), options_(options), reaper_(std::make_shared<Reaper>()) {
  // Orphans of the job become our children (and zombies we reap), not init's.
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
}

PosixSpawner::~PosixSpawner() = default;

std::unique_ptr<WorkerProcess> PosixSpawner::spawn(const SpawnRequest& req,
                                                   WorkerCallbacks callbacks) {
  GPURUN_CHECK(!req.argv.empty(), "empty argv for rank {}", req.rank);
  auto state = std::make_shared<PosixWorkerState>(io_);
  state->cb = std::move(callbacks);
  state->reaper = reaper_;

  std::vector<std::string> env_strings;
  env_strings.reserve(req.env.size());
  for (const auto& [k, v] : req.env) env_strings.push_back(k + "=" + v);
  std::vector<const char*> envp;
  envp.reserve(env_strings.size() + 1);
  for (const auto& s : env_strings) envp.push_back(s.c_str());
  envp.push_back(nullptr);

  WorkerInit init;
  init.envp = envp.data();
  init.nofile = options_.worker_nofile;
  std::vector<std::string> args(req.argv.begin() + 1, req.argv.end());
  // Pseudo-terminals where asked (and possible); else pipes. The master is read like a pipe;
  // the slave is the worker's, closed here once it is started (so that the worker's exit
  // shows as a hang-up at the master).
  const int margin = req.pty_margin_columns;
  std::optional<Pty> out_pty = req.stdout_pty ? open_pty(STDOUT_FILENO, margin) : std::nullopt;
  std::optional<Pty> err_pty = req.stderr_pty ? open_pty(STDERR_FILENO, margin) : std::nullopt;
  state->out_pty = out_pty.has_value();
  state->err_pty = err_pty.has_value();
  state->pty_margin = margin;
  bp::error_code ec;
  for (auto [pty, pipe] : {std::pair{&out_pty, &state->out}, std::pair{&err_pty, &state->err}}) {
    if (!*pty) continue;
    if (!ec) pipe->assign((*pty)->master, ec);  // the pipe owns the master from here
    if (ec || !pipe->is_open()) ::close((*pty)->master);
  }
  if (!ec) {
    using OutBinding = bp::detail::process_output_binding;
    using ErrBinding = bp::detail::process_error_binding;
    bp::process_stdio stdio{{},
                            out_pty ? OutBinding(out_pty->slave.get()) : OutBinding(state->out),
                            err_pty ? ErrBinding(err_pty->slave.get()) : ErrBinding(state->err)};
    ec = stdio.out.ec ? stdio.out.ec : stdio.err.ec;  // pipe creation (EMFILE, ENFILE)
    CloneLauncher launcher;
    if (!ec)
      state->proc.emplace(launcher.launch(io_.get_executor(), ec, bp::filesystem::path(req.argv[0]),
                                          args, stdio, init));
  }
  if (ec)
    throw ProcessError(
        fmt::format("cannot start rank {} ('{}'): {}", req.rank, req.argv[0], ec.message()));
  const int pid = state->proc->id();
  state->pid = pid;
  reaper_->workers.insert(pid);
  state->read(StreamId::kStdout);
  state->read(StreamId::kStderr);
  state->wait();
  return std::make_unique<PosixWorker>(std::move(state), pid);
}

}  // namespace gpurun::supervisor
