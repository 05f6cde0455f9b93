#include "supervisor/posix_spawner.hpp"

#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <optional>

#include <fmt/format.h>
#include <boost/asio/read.hpp>
#include <boost/asio/readable_pipe.hpp>

#include "common/error.hpp"
#include "supervisor/boost_process.hpp"

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
  if (signal != 0) return fmt::format("signal {} ({})", signal_name(signal), signal);
  return fmt::format("exit code {}", code);
}

namespace {

namespace asio = boost::asio;
namespace bp = boost::process::v2;

/// Boost.Process initializer: environment, own process group, parent-death signal.
struct WorkerInit {
  pid_t parent = ::getpid();
  const char* const* envp = nullptr;

  template <typename Launcher>
  bp::error_code on_setup(Launcher& launcher, const bp::filesystem::path&, const char* const*(&)) {
    launcher.env = envp;
    return {};
  }

  // Runs in the child between fork and exec: async-signal-safe calls only.
  template <typename Launcher>
  bp::error_code on_exec_setup(Launcher&, const bp::filesystem::path&, const char* const*(&)) {
    if (::setpgid(0, 0) != 0) return bp::error_code(errno, bp::system_category());
    if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0)
      return bp::error_code(errno, bp::system_category());
    if (::getppid() != parent) ::_exit(127);  // gpurun died before prctl took effect
    // Ignored dispositions survive exec: give the worker a clean slate.
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    for (int sig : {SIGPIPE, SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGUSR2, SIGCHLD})
      ::sigaction(sig, &dfl, nullptr);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    return {};
  }
};

/// State shared with pending Asio handlers; outlives the handle if needed.
struct PosixWorkerState : std::enable_shared_from_this<PosixWorkerState> {
  explicit PosixWorkerState(asio::io_context& io) : out(io), err(io) {}

  asio::readable_pipe out;
  asio::readable_pipe err;
  std::optional<bp::process> proc;
  std::array<char, 64 * 1024> out_buf{};
  std::array<char, 64 * 1024> err_buf{};
  WorkerCallbacks cb;
  bool detached = false;  // handle destroyed: drop notifications

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
  bool group_alive() const override { return ::killpg(pid_, 0) == 0 || errno == EPERM; }

 private:
  std::shared_ptr<PosixWorkerState> state_;
  int pid_;
};

}  // namespace

std::unique_ptr<WorkerProcess> PosixSpawner::spawn(const SpawnRequest& req,
                                                   WorkerCallbacks callbacks) {
  GPURUN_CHECK(!req.argv.empty(), "empty argv for rank {}", req.rank);
  auto state = std::make_shared<PosixWorkerState>(io_);
  state->cb = std::move(callbacks);

  std::vector<std::string> env_strings;
  env_strings.reserve(req.env.size());
  for (const auto& [k, v] : req.env) env_strings.push_back(k + "=" + v);
  std::vector<const char*> envp;
  envp.reserve(env_strings.size() + 1);
  for (const auto& s : env_strings) envp.push_back(s.c_str());
  envp.push_back(nullptr);

  WorkerInit init;
  init.envp = envp.data();
  std::vector<std::string> args(req.argv.begin() + 1, req.argv.end());
  try {
    state->proc.emplace(io_.get_executor(), bp::filesystem::path(req.argv[0]), args,
                        bp::process_stdio{{}, state->out, state->err}, init);
  } catch (const boost::system::system_error& e) {
    throw ProcessError(
        fmt::format("cannot start rank {} ('{}'): {}", req.rank, req.argv[0], e.code().message()));
  }
  const int pid = state->proc->id();
  state->read(StreamId::kStdout);
  state->read(StreamId::kStderr);
  state->wait();
  return std::make_unique<PosixWorker>(std::move(state), pid);
}

}  // namespace gpurun::supervisor
