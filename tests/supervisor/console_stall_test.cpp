// A console nobody reads (`gpurun … | less` paused, Ctrl-S, a slow `tee`) must not stall
// supervision (issue 44 item 1): the real gpurun binary with its stdout a pipe the test does
// not read. Without gpurun's console writer thread each case hangs or loses the job.
// Workers: tests/supervisor/workers/flood.sh.
#include <doctest/doctest.h>

#include "check_text.hpp"
#include "gpurun_process.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <thread>
#include <vector>

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

const std::string kGpurun =
    std::getenv("GPURUN_TEST_BINARY") ? std::getenv("GPURUN_TEST_BINARY") : GPURUN_BINARY;
const std::string kFlood = std::string(GPURUN_TEST_WORKERS) + "/flood.sh";

using gpurun::testing::free_port;
using gpurun::testing::slurp;
using gpurun::testing::TempDir;

/// gpurun with stdout a pipe the test reads only when it chooses to, stderr a file (or, with
/// an empty path, the same pipe).
struct StalledGpurun {
  pid_t pid = -1;
  int out_r = -1;
  fs::path err;
  std::optional<int> status;

  StalledGpurun(std::vector<std::string> args, const std::map<std::string, std::string>& env,
                fs::path err_file)
      : err(std::move(err_file)) {
    args.insert(args.begin(), kGpurun);
    int p[2];
    REQUIRE(::pipe2(p, O_CLOEXEC) == 0);
    pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      // No err file: stderr is the same pipe (`2>&1 |`).
      const int e = err.empty() ? p[1] : ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(p[1], 1);
      ::dup2(e, 2);
      for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
      std::vector<char*> a;
      for (auto& s : args) a.push_back(s.data());
      a.push_back(nullptr);
      ::execv(a[0], a.data());
      ::_exit(126);
    }
    ::close(p[1]);
    out_r = p[0];
  }
  ~StalledGpurun() {
    if (!status && pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
    ::close(out_r);
  }
  /// Waits up to `limit` without reading stdout; true when gpurun exited.
  bool wait(std::chrono::milliseconds limit) {
    return gpurun::testing::poll_until(
        [this] {
          int st = 0;
          if (!status && ::waitpid(pid, &st, WNOHANG) == pid) status = st;
          return status.has_value();
        },
        limit);
  }
  /// Reads stdout to its end and reaps gpurun (the reader is back).
  std::string read_to_end() {
    std::string out;
    char buf[65536];
    for (;;) {
      const ssize_t n = ::read(out_r, buf, sizeof buf);
      if (n > 0) {
        out.append(buf, static_cast<size_t>(n));
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      break;
    }
    wait(60s);
    return out;
  }
  int code() const {
    return !status ? -1 : WIFSIGNALED(*status) ? 128 + WTERMSIG(*status) : WEXITSTATUS(*status);
  }
  std::string stderr_text() const { return slurp(err); }
};

bool wait_for(const fs::path& file, std::chrono::milliseconds limit) {
  return gpurun::testing::poll_until([&] { return fs::exists(file); }, limit);
}

using gpurun::testing::count_of;

}  // namespace

TEST_CASE(
    "console stall: nobody reads stdout; the worker's output keeps flowing and SIGTERM "
    "ends the job at once") {
  TempDir dir;
  StalledGpurun g(
      {"--nproc", "1", "--device", "cpu", "--master-port", "0", "--grace-period", "2", kFlood},
      {{"OUT_DIR", dir.str()}, {"FLOOD_SLEEP", "60"}}, dir.path / "err");
  // 4 MB through gpurun into a pipe nobody reads: gpurun keeps reading its worker (before the
  // writer thread it blocked in write(2) after 64 KiB, and so did the worker).
  const bool printed = wait_for(dir.path / "printed.0", 30s);
  INFO(g.stderr_text());
  CHECK(printed);
  REQUIRE(::kill(g.pid, SIGTERM) == 0);
  // Grace period 2 s, and 2 s for the console's last lines: well inside 10 s. Before the
  // writer thread gpurun never saw the signal.
  const bool ended = g.wait(10s);
  CHECK(ended);
  CHECK(g.code() == 128 + SIGTERM);
  CHECK_FALSE(fs::exists(dir.path / "finished.0"));  // the worker was stopped, not waited for
}

TEST_CASE(
    "console stall: a reader that pauses and comes back: the job finishes, exit 0, and "
    "one line says what it missed") {
  TempDir dir;
  // 13 MB on the console: more than the 8 MiB gpurun keeps for a reader.
  StalledGpurun g({"--nproc", "1", "--device", "cpu", "--master-port", "0", kFlood},
                  {{"OUT_DIR", dir.str()}, {"FLOOD_LINES", "120000"}}, dir.path / "err");
  // The worker finishes while nobody reads; gpurun waits for its reader at exit, as any
  // program writing to a pipe does.
  const bool finished = wait_for(dir.path / "finished.0", 30s);
  CHECK(finished);
  const std::string out = g.read_to_end();
  const std::string err = g.stderr_text();
  INFO(err);
  REQUIRE(g.status.has_value());
  CHECK(g.code() == 0);
  // Every line either shown (whole, prefixed) or counted in the one notice.
  const std::string line = "[rank0]: flood " + std::string(93, '0') + "\n";
  const size_t shown = count_of(out, line);
  CHECK(out.size() == shown * line.size());
  const std::string tag = "gpurun: warning: the console was not read for a while";
  REQUIRE(count_of(err, tag) == 1);
  const size_t at = err.find("pipe): ", err.find(tag)) + 7;
  const size_t dropped = std::stoul(err.substr(at));
  CHECK(shown + dropped == 120000);
  CHECK(dropped > 0);
  CHECK(err.find("--log-dir keeps every worker line in files", at) != std::string::npos);
}

TEST_CASE(
    "console stall: node 1's stdout not read for 8 s (node timeout 2 s): both nodes "
    "finish every worker, exit 0") {
  TempDir dir;
  const std::string port = free_port();
  const std::map<std::string, std::string> env{
      {"OUT_DIR", dir.str()}, {"FLOOD_SLEEP", "4"}, {"FLOOD_LINES", "120000"}};
  auto node = [&](int rank) {
    return std::vector<std::string>{
        "--nnodes",       "2",         "--node-rank",   std::to_string(rank),
        "--master-addr",  "127.0.0.1", "--master-port", port,
        "--nproc",        "1",         "--device",      "cpu",
        "--node-timeout", "2",         kFlood};
  };
  gpurun::testing::ChildProcess n0(
      [&] {
        auto a = node(0);
        a.insert(a.begin(), kGpurun);
        return a;
      }(),
      env, dir.path / "n0.out", dir.path / "n0.err");
  StalledGpurun n1(node(1), env, dir.path / "n1.err");
  // Node 1's reader sleeps 8 s: four node timeouts. Before the writer thread node 1's gpurun
  // stopped sending heartbeats once its stdout filled, and node 0 ended the job after 2 s.
  std::this_thread::sleep_for(8s);
  const std::string out1 = n1.read_to_end();
  const bool n0_done = n0.wait(30s);
  INFO("node 0 stderr:\n" << n0.stderr_text() << "\nnode 1 stderr:\n" << n1.stderr_text());
  REQUIRE(n0_done);
  CHECK(n0.code() == 0);
  CHECK(n1.code() == 0);
  CHECK(fs::exists(dir.path / "finished.0"));
  CHECK(fs::exists(dir.path / "finished.1"));
  CHECK(n1.stderr_text().find("the console was not read for a while") != std::string::npos);
  CHECK_FALSE(out1.empty());
}

TEST_CASE(
    "console stall: SIGTERM while gpurun waits at exit for a stalled reader: the job's "
    "status, the notice, an exit within 2 s") {
  TempDir dir;
  StalledGpurun g({"--nproc", "1", "--device", "cpu", "--master-port", "0", kFlood},
                  {{"OUT_DIR", dir.str()}, {"FLOOD_LINES", "120000"}}, dir.path / "err");
  // The worker is done; gpurun waits for its reader, who does not read.
  REQUIRE(wait_for(dir.path / "finished.0", 30s));
  // gpurun reaps the worker and reaches its exit (drain_at_exit): nothing outside shows when
  std::this_thread::sleep_for(500ms);
  REQUIRE(::kill(g.pid, SIGTERM) == 0);
  // Before: the default action of SIGTERM ended gpurun at once (status 143, no notice).
  const bool ended = g.wait(10s);
  const std::string err = g.stderr_text();
  INFO(err);
  REQUIRE(ended);
  CHECK(g.code() == 0);  // the job's status: every worker exited 0
  CHECK(count_of(err, "gpurun: warning: the console was not read for a while") == 1);
}

TEST_CASE(
    "console stall: gpurun's own lines are never dropped (stdout and stderr one pipe, "
    "2>&1)") {
  TempDir dir;
  StalledGpurun g({"--nproc", "1", "--device", "cpu", "--master-port", "0", kFlood},
                  {{"OUT_DIR", dir.str()}, {"FLOOD_LINES", "120000"}, {"FLOOD_CODE", "3"}}, "");
  REQUIRE(wait_for(dir.path / "finished.0", 30s));
  const std::string out = g.read_to_end();
  REQUIRE(g.status.has_value());
  CHECK(g.code() == 3);
  // Worker lines were dropped and counted, but the failure gpurun reports is there whole.
  CHECK(count_of(out, "gpurun: warning: the console was not read for a while") == 1);
  CHECK(count_of(out, "gpurun: rank 0 (pid ") >= 1);
  CHECK(count_of(out, "ended with exit code 3") >= 1);
  CHECK(count_of(out, "FAILED") == 1);
}
