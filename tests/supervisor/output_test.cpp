// The real gpurun binary's console, log files and stop signals as a user meets them: under a
// pseudo-terminal the test opens (progress bars), with a file size limit on the log files, and
// SIGQUIT. Workers: tests/supervisor/workers.
#include <doctest/doctest.h>

#include "check_text.hpp"
#include "gpurun_process.hpp"

#include <fcntl.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

// GPURUN_TEST_BINARY runs these tests against another build (e.g. an older gpurun, to see
// them fail without a fix).
const std::string kGpurun =
    std::getenv("GPURUN_TEST_BINARY") ? std::getenv("GPURUN_TEST_BINARY") : GPURUN_BINARY;
const std::string kWorkers = GPURUN_TEST_WORKERS;

using gpurun::testing::slurp;
using gpurun::testing::TempDir;

std::string worker(const std::string& name) {
  return kWorkers + "/" + name;
}

using gpurun::testing::count_of;

/// The run directory gpurun announced with "gpurun: logs: <dir>" (--log-dir runs).
std::string announced_log_dir(const std::string& err) {
  const std::string tag = "gpurun: logs: ";
  const auto pos = err.find(tag);
  if (pos == std::string::npos) return {};
  const auto end = err.find_first_of("\r\n", pos);
  return err.substr(pos + tag.size(), end - pos - tag.size());
}

/// gpurun with its stdout and stderr read by the test while it runs: two pipes, or one
/// pseudo-terminal (raw, so the test sees gpurun's bytes unchanged) as gpurun's
/// controlling terminal and fds 0-2, like a user's terminal.
struct Console {
  pid_t pid = -1;
  int out_fd = -1, err_fd = -1;  // the same fd (the pty master) in terminal mode
  std::string out, err;          // terminal mode: everything in `out`
  std::optional<int> status;
  bool out_eof = false, err_eof = false;

  struct Setup {
    bool terminal = false;
    winsize size{33, 111, 0, 0};
    std::function<void()> in_child;  // runs in the child just before exec
  };

  Console(const std::vector<std::string>& args, const std::map<std::string, std::string>& env,
          Setup setup) {
    std::vector<std::string> argv{kGpurun};
    argv.insert(argv.end(), args.begin(), args.end());
    int op[2] = {-1, -1}, ep[2] = {-1, -1}, master = -1, slave = -1;
    if (setup.terminal) {
      termios raw{};
      ::cfmakeraw(&raw);
      REQUIRE(::openpty(&master, &slave, nullptr, &raw, &setup.size) == 0);
    } else {
      REQUIRE(::pipe2(op, O_CLOEXEC) == 0);
      REQUIRE(::pipe2(ep, O_CLOEXEC) == 0);
    }
    pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      if (setup.terminal) {
        ::setsid();
        ::ioctl(slave, TIOCSCTTY, 0);
        ::dup2(slave, 0);
        ::dup2(slave, 1);
        ::dup2(slave, 2);
      } else {
        ::dup2(op[1], 1);
        ::dup2(ep[1], 2);
      }
      for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
      if (setup.in_child) setup.in_child();
      std::vector<char*> a;
      for (auto& s : argv) a.push_back(s.data());
      a.push_back(nullptr);
      ::execv(a[0], a.data());
      ::_exit(126);
    }
    if (setup.terminal) {
      ::close(slave);
      out_fd = err_fd = master;
      err_eof = true;
    } else {
      ::close(op[1]);
      ::close(ep[1]);
      out_fd = op[0];
      err_fd = ep[0];
    }
  }
  ~Console() {
    if (!status && pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
    if (out_fd >= 0) ::close(out_fd);
    if (err_fd >= 0 && err_fd != out_fd) ::close(err_fd);
  }
  Console(const Console&) = delete;
  Console& operator=(const Console&) = delete;

  /// Reads what is there (waiting up to `wait`). EOF, or EIO at a pty master (the hang-up
  /// once gpurun and the workers closed the terminal), ends a stream.
  void pump(std::chrono::milliseconds wait) {
    pollfd fds[2];
    int n = 0;
    if (!out_eof) fds[n++] = {out_fd, POLLIN, 0};
    if (!err_eof) fds[n++] = {err_fd, POLLIN, 0};
    if (n == 0) {
      std::this_thread::sleep_for(wait);
      return;
    }
    if (::poll(fds, static_cast<nfds_t>(n), static_cast<int>(wait.count())) <= 0) return;
    for (int i = 0; i < n; ++i) {
      if (fds[i].revents == 0) continue;
      char buf[65536];
      const ssize_t got = ::read(fds[i].fd, buf, sizeof buf);
      const bool is_out = fds[i].fd == out_fd;
      if (got > 0) {
        (is_out ? out : err).append(buf, static_cast<size_t>(got));
      } else if (got == 0 || errno != EINTR) {
        (is_out ? out_eof : err_eof) = true;
      }
    }
  }
  /// Pumps until `pred` holds; false after `limit`.
  bool until(const std::function<bool()>& pred, std::chrono::milliseconds limit) {
    const auto end = Clock::now() + limit;
    while (!pred()) {
      if (Clock::now() >= end) return false;
      pump(20ms);
    }
    return true;
  }
  /// Reads to the end of both streams and reaps gpurun; false after `limit`.
  bool finish(std::chrono::milliseconds limit) {
    const auto end = Clock::now() + limit;
    while (!status || !out_eof || !err_eof) {
      if (Clock::now() >= end) return false;
      pump(20ms);
      int st = 0;
      if (!status && ::waitpid(pid, &st, WNOHANG) == pid) status = st;
    }
    return true;
  }
  bool exited() const { return status && WIFEXITED(*status); }
  int code() const { return exited() ? WEXITSTATUS(*status) : -1; }
};

}  // namespace

TEST_CASE("gpurun under a terminal: workers get a tty, \\r redraws arrive at once, prefixed") {
  TempDir dir;
  const std::string logs = dir.str() + "/logs";
  Console::Setup setup;
  setup.terminal = true;
  Console c({"--nproc", "1", "--device", "cpu", "--master-port", "0", "--log-dir", logs,
             worker("progress.sh")},
            {{"OUT_DIR", dir.str()}}, setup);
  // The worker's stderr line first: the bar starts only after it is shown ("ready").
  const bool err_shown =
      c.until([&] { return c.out.find("[rank0]: stderr tty\n") != std::string::npos; }, 5s);
  CHECK(err_shown);
  { std::ofstream(dir.path / "ready") << ""; }
  // The first state of the bar shows while the worker still runs (it waits for "go").
  const bool live =
      c.until([&] { return c.out.find("\r[rank0]: step 1/3") != std::string::npos; }, 5s);
  CHECK(live);
  { std::ofstream(dir.path / "go") << ""; }
  REQUIRE(c.finish(30s));
  INFO(c.out);
  CHECK(c.code() == 0);
  CHECK(c.out.find("[rank0]: stdout tty\n") != std::string::npos);
  CHECK(c.out.find("[rank0]: stderr tty\n") != std::string::npos);
  // gpurun's window size less the prefix ("[rank0]: ", 9 columns): a bar that fills the
  // worker's terminal fits on one line of gpurun's (issue 25 item 8: it wrapped at every redraw).
  CHECK(c.out.find("[rank0]: size 33 102\n") != std::string::npos);
  CHECK(c.out.find("[rank0]: flags -opost -echo \n") != std::string::npos);  // bytes unchanged
  // Each state redraws in place with the prefix; the line's end ("\n") ends it.
  CHECK(c.out.find("\r[rank0]: step 1/3\r[rank0]: step 2/3\r[rank0]: step 3/3\n") !=
        std::string::npos);
  // The bytes written just before the worker exited (no newline; EIO at the pty master).
  CHECK(c.out.find("[rank0]: last bytes\n") != std::string::npos);
  // The log has clean text: each line's final state, no "\r", no "\r\n".
  const std::string run = announced_log_dir(c.out);
  REQUIRE_FALSE(run.empty());
  const std::string log = slurp(run + "/attempt_0/0/stdout.log");
  CHECK(log.find('\r') == std::string::npos);
  CHECK(log.find("stdout tty\nsize 33 102\n") == 0);
  CHECK(log.find("step 3/3\nlast bytes") != std::string::npos);
  CHECK(slurp(run + "/attempt_0/0/stderr.log") == "stderr tty\n");
}

TEST_CASE("gpurun under a terminal: a resize reaches every worker's terminal, less the prefix") {
  TempDir dir;
  Console::Setup setup;
  setup.terminal = true;
  Console c({"--nproc", "2", "--device", "cpu", "--master-port", "0", worker("winch.sh")},
            {{"OUT_DIR", dir.str()}}, setup);
  const bool started = c.until(
      [&] {
        return c.out.find("[rank0]: size 33 102\n") != std::string::npos &&
               c.out.find("[rank1]: size 33 102\n") != std::string::npos;
      },
      10s);
  INFO(c.out);
  REQUIRE(started);
  // (winch.sh installs its trap before it says its size.)
  // The user's terminal becomes 40 x 80: the kernel sends gpurun SIGWINCH.
  winsize size{40, 80, 0, 0};
  REQUIRE(::ioctl(c.out_fd, TIOCSWINSZ, &size) == 0);
  const bool followed = c.until(
      [&] {
        return c.out.find("[rank0]: resized 40 71\n") != std::string::npos &&
               c.out.find("[rank1]: resized 40 71\n") != std::string::npos;
      },
      10s);
  CHECK(followed);
  { std::ofstream(dir.path / "done") << ""; }
  REQUIRE(c.finish(30s));
  CHECK(c.code() == 0);
}

TEST_CASE("gpurun with pipes as its output: workers get pipes, a \\r line is forwarded whole") {
  TempDir dir;
  { std::ofstream(dir.path / "ready") << ""; }
  { std::ofstream(dir.path / "go") << ""; }
  Console c({"--nproc", "1", "--device", "cpu", "--master-port", "0", worker("progress.sh")},
            {{"OUT_DIR", dir.str()}}, {});
  REQUIRE(c.finish(30s));
  CHECK(c.code() == 0);
  CHECK(c.out ==
        "[rank0]: stdout pipe\n[rank0]: \rstep 1/3\rstep 2/3\rstep 3/3\n[rank0]: last bytes\n");
  CHECK(c.err.find("[rank0]: stderr pipe\n") != std::string::npos);
}

TEST_CASE(
    "gpurun: logs cut by a file size limit -> one warning per file, the rest on the console") {
  TempDir dir;
  const std::string logs = dir.str() + "/logs";
  constexpr rlim_t kLimit = 16 * 1024;
  Console::Setup setup;
  // Like a full --log-dir disk, without root: RLIMIT_FSIZE makes the log writes short, then
  // EFBIG (SIGXFSZ left at its default: gpurun must not die of it). The console is a pipe.
  setup.in_child = [] {
    rlimit lim{kLimit, kLimit};
    ::setrlimit(RLIMIT_FSIZE, &lim);
  };
  Console c({"--nproc", "1", "--device", "cpu", "--master-port", "0", "--log-dir", logs,
             "--redirects", "3", worker("many_lines.sh"), "3000"},
            {{"OUT_DIR", dir.str()}}, setup);
  REQUIRE(c.finish(60s));
  INFO(c.err.substr(0, 2000));
  CHECK(c.exited());
  CHECK(c.code() == 0);
  const std::string run = announced_log_dir(c.err);
  REQUIRE_FALSE(run.empty());
  for (const std::string stream : {"stdout", "stderr"}) {
    CAPTURE(stream);
    const std::string path = run + "/attempt_0/0/" + stream + ".log";
    const std::string warning = "gpurun: warning: writing " + path +
                                " failed: File too large (EFBIG); rank 0's " + stream +
                                " goes to the console from now on\n";
    CHECK(count_of(c.err, warning) == 1);
    const std::string file = slurp(path);
    CHECK(file.size() == kLimit);  // filled to the limit (the last write was short)
    // Every line is in the file or, whole and prefixed, on the console: nothing is lost.
    const std::string& console = stream == "stdout" ? c.out : c.err;
    const std::string tag = stream == "stdout" ? "out" : "err";
    std::set<int> seen;
    std::istringstream in(file);
    for (std::string l; std::getline(in, l) && !in.eof();) seen.insert(std::stoi(l.substr(4)));
    std::istringstream con(console);
    for (std::string l; std::getline(con, l);)
      if (l.rfind("[rank0]: " + tag + " ", 0) == 0) seen.insert(std::stoi(l.substr(13)));
    CHECK(seen.size() == 3000);
    CHECK(console.find("[rank0]: " + tag + " 0001\n") == std::string::npos);  // not duplicated
    CHECK(console.find("[rank0]: " + tag + " 3000\n") != std::string::npos);
  }
  CHECK(count_of(c.err, "gpurun: warning: writing") == 2);
}

TEST_CASE("gpurun: SIGQUIT is forwarded to every worker; gpurun exits 131 after they stop") {
  TempDir dir;
  Console::Setup setup;
  // A job started in the background by a shell ignores SIGQUIT: gpurun must still act on it.
  setup.in_child = [] { ::signal(SIGQUIT, SIG_IGN); };
  Console c({"--nproc", "2", "--device", "cpu", "--master-port", "0", "--grace-period", "5",
             worker("trap_quit.sh")},
            {{"OUT_DIR", dir.str()}}, setup);
  REQUIRE(c.until([&] { return fs::exists(dir.path / "pid.0") && fs::exists(dir.path / "pid.1"); },
                  10s));  // trap_quit.sh installs its trap before it writes its pid
  REQUIRE(::kill(c.pid, SIGQUIT) == 0);
  const auto sent = Clock::now();
  REQUIRE(c.finish(20s));
  INFO(c.err);
  CHECK(c.exited());  // not killed by the signal
  CHECK(c.code() == 131);
  CHECK(Clock::now() - sent < 4s);  // the workers stopped on the signal, no SIGKILL needed
  CHECK(c.err.find("gpurun: received SIGQUIT: forwarding it to the workers") != std::string::npos);
  CHECK(slurp(dir.path / "sig.0") == "QUIT\n");
  CHECK(slurp(dir.path / "sig.1") == "QUIT\n");
}
