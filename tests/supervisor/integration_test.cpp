// Runs the real gpurun binary with tiny shell/python workers (tests/supervisor/workers).
#include <doctest/doctest.h>

#include "check_text.hpp"
#include "gpurun_process.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

const std::string kGpurun = GPURUN_BINARY;
const std::string kWorkers = GPURUN_TEST_WORKERS;

using gpurun::testing::slurp;
using gpurun::testing::TempDir;

/// One gpurun process with stdout/stderr captured to DIR/TAG.stdout and .stderr.
struct Gpurun : gpurun::testing::ChildProcess {
  /// `nofile`: RLIMIT_NOFILE {soft, hard} to start gpurun with.
  Gpurun(const std::vector<std::string>& args, const std::map<std::string, std::string>& env,
         const fs::path& dir, const std::string& tag = "gpurun",
         std::optional<rlimit> nofile = std::nullopt)
      : ChildProcess(with_binary(args), env, dir / (tag + ".stdout"), dir / (tag + ".stderr"),
                     nofile) {}

 private:
  static std::vector<std::string> with_binary(const std::vector<std::string>& args) {
    std::vector<std::string> argv{kGpurun};
    argv.insert(argv.end(), args.begin(), args.end());
    return argv;
  }
};

/// A pid counts as alive unless /proc has no entry or it is a zombie.
bool alive(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  if (!stat) return false;
  std::string line;
  std::getline(stat, line);
  const auto close = line.rfind(')');
  return close != std::string::npos && close + 2 < line.size() && line[close + 2] != 'Z';
}

std::vector<pid_t> read_pids(const fs::path& dir, const std::string& prefix) {
  std::vector<pid_t> pids;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().filename().string().rfind(prefix, 0) != 0) continue;
    std::istringstream in(slurp(e.path()));
    for (pid_t p; in >> p;) pids.push_back(p);
  }
  return pids;
}

using gpurun::testing::poll_until;

bool all_dead(const std::vector<pid_t>& pids) {
  for (pid_t p : pids)
    if (alive(p)) return false;
  return true;
}

std::map<std::string, std::string> parse_env_file(const fs::path& p) {
  std::map<std::string, std::string> env;
  std::istringstream in(slurp(p));
  for (std::string line; std::getline(in, line);) {
    auto eq = line.find('=');
    if (eq != std::string::npos) env[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return env;
}

std::string worker(const std::string& name) {
  return kWorkers + "/" + name;
}

/// The run directory gpurun announced with "gpurun: logs: <dir>" (--log-dir runs).
std::string announced_log_dir(const std::string& err) {
  const std::string tag = "gpurun: logs: ";
  const auto pos = err.find(tag);
  if (pos == std::string::npos) return {};
  return err.substr(pos + tag.size(), err.find('\n', pos) - pos - tag.size());
}

using gpurun::testing::count_of;

/// Pids of live processes whose command line contains `needle`.
std::vector<pid_t> pids_with_arg(const std::string& needle) {
  std::vector<pid_t> out;
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string cmd;
    try {  // a process that exits while read: its cmdline read fails (ESRCH), skip it
      cmd = slurp(e.path() / "cmdline");
    } catch (const std::exception&) {
      continue;
    }
    std::replace(cmd.begin(), cmd.end(), '\0', ' ');
    if (cmd.find(needle) != std::string::npos && alive(std::stoi(name)))
      out.push_back(std::stoi(name));
  }
  return out;
}

}  // namespace

TEST_CASE("gpurun: environment per rank, logs and event log") {
  TempDir dir;
  const std::string logs = dir.str() + "/logs";
  Gpurun g({"--nproc", "3", "--device", "cpu", "--master-port", "0", "--run-id", "envtest",
            "--max-restarts", "1", "--log-dir", logs, "--event-log", dir.str() + "/events.jsonl",
            worker("dump_env.sh")},
           {{"OUT_DIR", dir.str()}, {"CUDA_VISIBLE_DEVICES", "GPU-abc, 7"}}, dir.path);
  REQUIRE(g.wait(30s));
  INFO(g.stderr_text());
  REQUIRE(g.code() == 0);
  // The run's unique directory under --log-dir, announced once.
  const std::string run_dir = announced_log_dir(g.stderr_text());
  REQUIRE(!run_dir.empty());
  CHECK(count_of(g.stderr_text(), "gpurun: logs: ") == 1);
  CHECK(fs::path(run_dir).parent_path() == fs::absolute(logs));
  CHECK(fs::path(run_dir).filename().string().rfind("envtest_", 0) == 0);
  std::set<std::string> ports;
  for (int r = 0; r < 3; ++r) {
    auto env = parse_env_file(dir.path / ("env." + std::to_string(r)));
    CAPTURE(r);
    CHECK(env["RANK"] == std::to_string(r));
    CHECK(env["LOCAL_RANK"] == std::to_string(r));
    CHECK(env["WORLD_SIZE"] == "3");
    CHECK(env["LOCAL_WORLD_SIZE"] == "3");
    CHECK(env["GROUP_RANK"] == "0");
    CHECK(env["GROUP_WORLD_SIZE"] == "1");
    CHECK(env["ROLE_RANK"] == std::to_string(r));
    CHECK(env["ROLE_WORLD_SIZE"] == "3");
    CHECK(env["ROLE_NAME"] == "default");
    CHECK(env["MASTER_ADDR"] == "127.0.0.1");
    CHECK(env["TORCHELASTIC_USE_AGENT_STORE"] == "True");
    CHECK(env["TORCHELASTIC_RUN_ID"] == "envtest");
    CHECK(env["TORCHELASTIC_RESTART_COUNT"] == "0");
    CHECK(env["TORCHELASTIC_MAX_RESTARTS"] == "1");
    CHECK(env["TORCHELASTIC_ERROR_FILE"] ==
          run_dir + "/attempt_0/" + std::to_string(r) + "/error.json");
    CHECK(env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1");
    CHECK(env["OMP_NUM_THREADS"] == "1");
    CHECK(env["GPURUN_RUN_ID"] == "envtest");
    CHECK(env["GPURUN_SLOT"] == std::to_string(r));
    CHECK(env["GPURUN_DEVICE"] == "cpu");
    CHECK(env["GPURUN_STORE_ADDR"] == "127.0.0.1");
    CHECK(env["GPURUN_STORE_PORT"] == env["MASTER_PORT"]);
    CHECK(env["CUDA_VISIBLE_DEVICES"] == "GPU-abc, 7");
    CHECK(env["OUT_DIR"] == dir.str());  // inherited
    CHECK(env.count("GPURUN_GPU_ID") == 0);
    ports.insert(env["MASTER_PORT"]);
    CHECK(slurp(run_dir + "/attempt_0/" + std::to_string(r) + "/stdout.log") ==
          "stdout of rank " + std::to_string(r) + "\n");
    CHECK(slurp(run_dir + "/attempt_0/" + std::to_string(r) + "/stderr.log") ==
          "stderr of rank " + std::to_string(r) + "\n");
  }
  REQUIRE(ports.size() == 1);
  CHECK(*ports.begin() != "0");
  CHECK(*ports.begin() != "29500");
  const std::string out = g.stdout_text();
  for (int r = 0; r < 3; ++r)
    CHECK(out.find("[rank" + std::to_string(r) + "]: stdout of rank " + std::to_string(r) + "\n") !=
          std::string::npos);
  CHECK(g.stderr_text().find("[rank2]: stderr of rank 2\n") != std::string::npos);

  // Event log: one JSON object per line, in order.
  std::istringstream ev(slurp(dir.path / "events.jsonl"));
  std::vector<std::string> events;
  for (std::string line; std::getline(ev, line);) {
    CHECK(line.rfind("{\"ts\": \"", 0) == 0);
    auto pos = line.find("\"event\": \"");
    REQUIRE(pos != std::string::npos);
    events.push_back(line.substr(pos + 10, line.find('"', pos + 10) - pos - 10));
  }
  REQUIRE(events.size() == 8);
  CHECK(events.front() == "start");
  CHECK(std::count(events.begin(), events.end(), "worker_started") == 3);
  CHECK(std::count(events.begin(), events.end(), "worker_exited") == 3);
  CHECK(events.back() == "shutdown");
}

TEST_CASE("gpurun: GPU slots follow CUDA_VISIBLE_DEVICES; too many slots is exit 2") {
  TempDir dir;
  Gpurun g({"--nproc", "2", "--master-port", "0", worker("dump_env.sh")},
           {{"OUT_DIR", dir.str()}, {"CUDA_VISIBLE_DEVICES", "MIG-xyz, 5 ,6"}}, dir.path);
  REQUIRE(g.wait(30s));
  INFO(g.stderr_text());
  REQUIRE(g.code() == 0);
  CHECK(parse_env_file(dir.path / "env.0")["GPURUN_GPU_ID"] == "MIG-xyz");
  CHECK(parse_env_file(dir.path / "env.1")["GPURUN_GPU_ID"] == "5");
  CHECK(parse_env_file(dir.path / "env.1")["GPURUN_DEVICE"] == "cuda");

  Gpurun bad({"--nproc", "4", "--master-port", "0", worker("dump_env.sh")},
             {{"OUT_DIR", dir.str()}, {"CUDA_VISIBLE_DEVICES", "0,1"}}, dir.path, "bad");
  REQUIRE(bad.wait(10s));
  CHECK(bad.code() == 2);
  CHECK(bad.stderr_text().find("--nproc 4 needs 4 GPUs but only 2 are visible") !=
        std::string::npos);

  Gpurun usage({"--nproc", "two", "x"}, {}, dir.path, "usage");
  REQUIRE(usage.wait(10s));
  CHECK(usage.code() == 2);
  CHECK(usage.stderr_text() ==
        "gpurun: error: invalid value 'two' for --nproc: expected a positive integer, auto, gpu "
        "or cpu\n");
}

TEST_CASE("gpurun: a worker exiting 7 makes gpurun exit 7 and name the rank") {
  TempDir dir;
  Gpurun g({"--nproc", "2", "--device", "cpu", "--master-port", "0", "--grace-period", "2",
            worker("fail_rank.sh")},
           {{"OUT_DIR", dir.str()}, {"FAIL_RANK", "1"}, {"FAIL_CODE", "7"}}, dir.path);
  REQUIRE(g.wait(30s));
  const std::string err = g.stderr_text();
  INFO(err);
  CHECK(g.code() == 7);
  CHECK(err.find("rank 1 (pid ") != std::string::npos);
  CHECK(err.find("ended with exit code 7") != std::string::npos);
  CHECK(err.find("| rank 1 is failing on purpose") != std::string::npos);
}

TEST_CASE("gpurun: a worker's TORCHELASTIC_ERROR_FILE is the root cause in the summary") {
  TempDir dir;
  Gpurun g({"--nproc", "2", "--device", "cpu", "--master-port", "0", "--grace-period", "2",
            "python3", worker("error_file.py")},
           {}, dir.path);
  REQUIRE(g.wait(30s));
  const std::string err = g.stderr_text();
  INFO(err);
  CHECK(g.code() == 1);
  CHECK(err.find("root cause (first failure in time):") != std::string::npos);
  CHECK(err.find("rank       : 0 (local rank 0)") != std::string::npos);
  CHECK(err.find("message    : ValueError: loss is NaN at step 12") != std::string::npos);
  CHECK(err.find("File \"train.py\", line 3") != std::string::npos);  // the traceback
  CHECK(err.find("<not written>") == std::string::npos);
}

TEST_CASE("gpurun: a worker killing itself with SIGSEGV gives 139") {
  TempDir dir;
  Gpurun g(
      {"--nproc", "2", "--device", "cpu", "--master-port", "0", "--grace-period", "2",
       worker("fail_rank.sh")},
      {{"OUT_DIR", dir.str()}, {"FAIL_RANK", "0"}, {"FAIL_CODE", "1"}, {"FAIL_SIGNAL", "SEGV"}},
      dir.path);
  REQUIRE(g.wait(30s));
  INFO(g.stderr_text());
  CHECK(g.code() == 139);
  CHECK(g.stderr_text().find("signal SIGSEGV (11)") != std::string::npos);
}

TEST_CASE("gpurun: one rank failing -> the others are gone within grace + 1 s") {
  TempDir dir;
  Gpurun g({"--nproc", "3", "--device", "cpu", "--master-port", "0", "--grace-period", "2",
            worker("fail_rank.sh")},
           {{"OUT_DIR", dir.str()},
            {"FAIL_RANK", "2"},
            {"FAIL_CODE", "5"},
            {"IGNORE_TERM", "1"}},  // survivors ignore SIGTERM: only SIGKILL ends them
           dir.path);
  REQUIRE(poll_until([&] { return fs::exists(dir.path / "failed_at"); }, 20s));
  const auto failed = Clock::now();
  std::vector<pid_t> survivors;
  for (int r = 0; r < 2; ++r)
    survivors.push_back(std::stoi(slurp(dir.path / ("pid." + std::to_string(r)))));
  CHECK(poll_until([&] { return all_dead(survivors); }, 3s));  // grace 2 s + 1 s
  const auto gone = Clock::now() - failed;
  CHECK(gone >= 1500ms);  // they ignored SIGTERM, so it took the SIGKILL after the grace period
  REQUIRE(g.wait(10s));
  CHECK(g.code() == 5);
}

TEST_CASE("gpurun: SIGTERM leaves no process of the job, children included") {
  TempDir dir;
  Gpurun g({"--nproc", "2", "--device", "cpu", "--master-port", "0", "--grace-period", "2",
            worker("with_children.sh")},
           {{"OUT_DIR", dir.str()}}, dir.path);
  REQUIRE(poll_until(
      [&] {
        return fs::exists(dir.path / "ready.0") && fs::exists(dir.path / "ready.1") &&
               read_pids(dir.path, "pids.").size() == 8;
      },
      20s));  // the grandchild's pid line may land after ready: 8 lines, not the files, decide
  const auto pids = read_pids(dir.path, "pids.");
  REQUIRE(pids.size() == 8);  // per rank: worker, child, subshell, grandchild
  CHECK(!all_dead(pids));
  ::kill(g.pid, SIGTERM);
  REQUIRE(g.wait(10s));
  CHECK(g.code() == 128 + SIGTERM);
  // gpurun returns only after every group is empty; allow init a moment to reap.
  CHECK(poll_until([&] { return all_dead(pids); }, 500ms));
  CHECK(g.stderr_text().find("received SIGTERM") != std::string::npos);
}

TEST_CASE("gpurun: kill -9 of gpurun -> every worker gone within 1 s") {
  TempDir dir;
  // TMPDIR inside the test's own directory: the run dir that kill -9 leaves is removed with it.
  const fs::path tmp = dir.path / "tmp";
  fs::create_directories(tmp);
  Gpurun g({"--nproc", "3", "--device", "cpu", "--master-port", "0", worker("loop.sh")},
           {{"OUT_DIR", dir.str()}, {"TMPDIR", tmp.string()}}, dir.path);
  REQUIRE(poll_until([&] { return read_pids(dir.path, "pid.").size() == 3; }, 20s));
  const auto workers = read_pids(dir.path, "pid.");
  CHECK(!all_dead(workers));
  ::kill(g.pid, SIGKILL);
  REQUIRE(g.wait(5s));
  CHECK(poll_until([&] { return all_dead(workers); }, 1s));

  // The dead run's temporary dir is left behind; the next gpurun removes it.
  const fs::path runs = tmp / ("gpurun-" + std::to_string(::getuid())) / "runs";
  auto entries = [&] {
    size_t n = 0;
    for (const auto& e : fs::directory_iterator(runs)) n += e.is_directory() ? 1 : 0;
    return n;
  };
  CHECK(entries() == 1);
  Gpurun next({"--nproc", "1", "--device", "cpu", "--master-port", "0", "true"},
              {{"TMPDIR", tmp.string()}}, dir.path, "next");
  REQUIRE(next.wait(20s));
  CHECK(next.code() == 0);
  CHECK(entries() == 0);
}

TEST_CASE("gpurun: --max-restarts 2 -> exactly two restarts, same count on every rank") {
  TempDir dir;
  Gpurun g({"--nproc", "3", "--device", "cpu", "--master-port", "0", "--max-restarts", "2",
            "--grace-period", "2", "--event-log", dir.str() + "/events.jsonl",
            worker("restart_count.sh")},
           {{"OUT_DIR", dir.str()}}, dir.path);
  REQUIRE(g.wait(60s));
  INFO(g.stderr_text());
  CHECK(g.code() == 3);
  for (int attempt = 0; attempt < 3; ++attempt)
    for (int r = 0; r < 3; ++r) {
      CAPTURE(attempt);
      CAPTURE(r);
      const auto p = dir.path / ("count." + std::to_string(r) + "." + std::to_string(attempt));
      REQUIRE(fs::exists(p));
      CHECK(slurp(p) == std::to_string(attempt) + "\n");
    }
  for (int r = 0; r < 3; ++r)
    CHECK_FALSE(fs::exists(dir.path / ("count." + std::to_string(r) + ".3")));
  const std::string ev = slurp(dir.path / "events.jsonl");
  size_t restarts = 0;
  for (size_t pos = 0; (pos = ev.find("\"event\": \"restart\"", pos)) != std::string::npos; ++pos)
    ++restarts;
  CHECK(restarts == 2);
  CHECK(ev.find("\"event\": \"shutdown\", \"exit_code\": 3") != std::string::npos);
}

TEST_CASE("gpurun: an explicitly requested busy port fails at start naming the port") {
  TempDir dir;
  int s = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(s >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  REQUIRE(::bind(s, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  REQUIRE(::listen(s, 1) == 0);
  socklen_t len = sizeof addr;
  ::getsockname(s, reinterpret_cast<sockaddr*>(&addr), &len);
  const std::string port = std::to_string(ntohs(addr.sin_port));
  Gpurun g({"--nproc", "1", "--device", "cpu", "--master-port", port, worker("loop.sh")},
           {{"OUT_DIR", dir.str()}}, dir.path);
  // At start, not after a retry: one line naming the address, and no worker ran (loop.sh
  // writes its pid file first thing).
  REQUIRE(g.wait(5s));
  ::close(s);
  const std::string err = g.stderr_text();
  INFO(err);
  CHECK(g.code() == 1);
  CHECK(err == "gpurun: error: cannot listen on 127.0.0.1:" + port + ": Address already in use\n");
  CHECK_FALSE(fs::exists(dir.path / "pid.0"));
  CHECK(read_pids(dir.path, "pid.").empty());  // no worker was started
}

TEST_CASE("gpurun: --master-port 0 -> two concurrent jobs, each store outliving a worker") {
  TempDir a, b;
  Gpurun ja({"--nproc", "2", "--device", "cpu", "--master-port", "0", "--run-id", "job-a",
             worker("store_client.py")},
            {{"OUT_DIR", a.str()}}, a.path);
  Gpurun jb({"--nproc", "2", "--device", "cpu", "--master-port", "0", "--run-id", "job-b",
             worker("store_client.py")},
            {{"OUT_DIR", b.str()}}, b.path);
  REQUIRE(ja.wait(60s));
  REQUIRE(jb.wait(60s));
  INFO(ja.stderr_text());
  INFO(jb.stderr_text());
  CHECK(ja.code() == 0);
  CHECK(jb.code() == 0);
  CHECK(slurp(a.path / "rank0.result") == "value-from-rank-1");
  CHECK(slurp(b.path / "rank0.result") == "value-from-rank-1");
}

TEST_CASE("gpurun: SIGINT during a large launch stops spawning and tears down what started") {
  TempDir dir;
  // A unique argument marks this job's workers in /proc.
  const std::string mark = "30." + std::to_string(::getpid()) + "1";
  Gpurun g({"--nproc", "1000", "--device", "cpu", "--master-port", "0", "--grace-period", "5",
            "sleep", mark},
           {{"TMPDIR", dir.str()}}, dir.path);
  // SIGINT mid-launch: once a few dozen of the 1000 run.
  REQUIRE(poll_until([&] { return pids_with_arg(mark).size() >= 30; }, 20s));
  ::kill(g.pid, SIGINT);
  const auto t0 = Clock::now();
  REQUIRE(g.wait(10s));  // before the fix: only after all 1000 were spawned
  INFO(g.stderr_text());
  CHECK(Clock::now() - t0 < 5s);
  CHECK(g.code() == 130);
  CHECK(pids_with_arg(mark).empty());
}

TEST_CASE("gpurun: --nproc beyond the fd limit is refused up front; the soft limit is raised") {
  TempDir dir;
  Gpurun low({"--nproc", "30", "--device", "cpu", "--master-port", "0", worker("loop.sh")},
             {{"OUT_DIR", dir.str()}}, dir.path, "low", rlimit{40, 40});
  REQUIRE(low.wait(10s));
  const std::string err = low.stderr_text();
  INFO(err);
  CHECK(low.code() == 2);
  CHECK(err.find("gpurun: error: --nproc 30 needs about 152 file descriptors (4 per worker + 32) "
                 "but the limit (RLIMIT_NOFILE, hard limit 40) is 40") != std::string::npos);
  CHECK(count_of(err, "\n") == 1);
  CHECK(read_pids(dir.path, "pid.").empty());  // nothing started

  // Soft 40, hard 4096: gpurun raises its own soft limit; workers get the original 40.
  Gpurun raised({"--nproc", "30", "--device", "cpu", "--master-port", "0", worker("nofile.sh")},
                {{"OUT_DIR", dir.str()}}, dir.path, "raised", rlimit{40, 4096});
  REQUIRE(raised.wait(30s));
  INFO(raised.stderr_text());
  CHECK(raised.code() == 0);
  CHECK(slurp(dir.path / "nofile.29") == "40\n");
}

TEST_CASE("gpurun: the same run id twice under --log-dir keeps both runs' logs") {
  TempDir dir;
  const std::string logs = dir.str() + "/logs";
  std::vector<std::string> seen;
  for (int i = 0; i < 2; ++i) {
    Gpurun g({"--nproc", "1", "--device", "cpu", "--master-port", "0", "--log-dir", logs, "sh",
              "-c", "echo run " + std::to_string(i)},
             {}, dir.path, "run" + std::to_string(i));
    REQUIRE(g.wait(20s));
    CHECK(g.code() == 0);
    seen.push_back(announced_log_dir(g.stderr_text()));
  }
  REQUIRE(seen.size() == 2);
  CHECK(seen[0] != seen[1]);
  CHECK(fs::path(seen[0]).filename().string().rfind("none_", 0) == 0);
  CHECK(slurp(seen[0] + "/attempt_0/0/stdout.log") == "run 0\n");
  CHECK(slurp(seen[1] + "/attempt_0/0/stdout.log") == "run 1\n");
}

TEST_CASE("gpurun: a run id with '/' is a usage error and writes nothing") {
  TempDir dir;
  const std::string logs = dir.str() + "/a/b/logs";
  Gpurun g({"--nproc", "1", "--device", "cpu", "--master-port", "0", "--log-dir", logs, "--run-id",
            "../../escaped", "true"},
           {}, dir.path);
  REQUIRE(g.wait(10s));
  CHECK(g.code() == 2);
  CHECK(g.stderr_text().find("for --run-id: a run id names a directory under --log-dir and "
                             "cannot contain '/'") != std::string::npos);
  CHECK_FALSE(fs::exists(dir.path / "a"));
}

TEST_CASE("gpurun: --redirects without --log-dir warns and keeps the files") {
  TempDir dir;
  Gpurun g({"--nproc", "1", "--device", "cpu", "--master-port", "0", "--redirects", "1", "sh", "-c",
            "echo hidden"},
           {{"TMPDIR", dir.str()}}, dir.path);
  REQUIRE(g.wait(20s));
  const std::string err = g.stderr_text();
  INFO(err);
  CHECK(g.code() == 0);
  CHECK(g.stdout_text().empty());
  const std::string tag =
      "gpurun: warning: --redirects/--tee without --log-dir: the log files go to ";
  const auto pos = err.find(tag);
  REQUIRE(pos != std::string::npos);
  CHECK(count_of(err, tag) == 1);
  const std::string where =
      err.substr(pos + tag.size(), err.find(' ', pos + tag.size()) - pos - tag.size());
  CHECK(err.find("gpurun: log files kept in " + where + "\n") != std::string::npos);
  CHECK(slurp(where + "/attempt_0/0/stdout.log") == "hidden\n");
  // Kept logs are not "stale": a later run leaves them alone.
  Gpurun next({"--nproc", "1", "--device", "cpu", "--master-port", "0", "true"},
              {{"TMPDIR", dir.str()}}, dir.path, "next");
  REQUIRE(next.wait(20s));
  CHECK(fs::exists(where + "/attempt_0/0/stdout.log"));
}

TEST_CASE("gpurun: orphans of a failed worker are reaped; no wait for the grace period") {
  TempDir dir;
  Gpurun g({"--nproc", "2", "--device", "cpu", "--master-port", "0", "--grace-period", "10",
            worker("orphan_fail.sh")},
           {{"OUT_DIR", dir.str()}}, dir.path);
  REQUIRE(poll_until([&] { return fs::exists(dir.path / "child.0"); }, 20s));
  const auto t0 = Clock::now();
  REQUIRE(g.wait(20s));
  const std::string err = g.stderr_text();
  INFO(err);
  CHECK(Clock::now() - t0 < 3s);  // not the 10 s grace period
  CHECK(g.code() == 3);
  CHECK(err.find("grace period") == std::string::npos);
  CHECK(err.find("survived SIGKILL") == std::string::npos);
  CHECK(all_dead(read_pids(dir.path, "child.")));
}

TEST_CASE("gpurun: a directory or a non-executable file as the command is named as such (127)") {
  TempDir dir;
  Gpurun d({"--device", "cpu", "--master-port", "0", dir.str()}, {}, dir.path, "dir");
  REQUIRE(d.wait(10s));
  CHECK(d.code() == 127);
  CHECK(d.stderr_text() ==
        "gpurun: error: worker command '" + dir.str() + "' is a directory, not a program\n");
  const fs::path text = dir.path / "train.txt";
  std::ofstream(text) << "not a program\n";
  fs::permissions(text, fs::perms::owner_read | fs::perms::owner_write);
  Gpurun f({"--device", "cpu", "--master-port", "0", text.string()}, {}, dir.path, "file");
  REQUIRE(f.wait(10s));
  CHECK(f.code() == 127);
  CHECK(f.stderr_text().find("' is not executable (mode 0600: chmod +x it") != std::string::npos);
}

TEST_CASE("gpurun: a missing .py script exits 127; the event log records argv as typed") {
  TempDir dir;
  Gpurun g({"--device", "cpu", "--master-port", "0", "no_such_script.py"}, {}, dir.path);
  REQUIRE(g.wait(10s));
  CHECK(g.code() == 127);
  CHECK(g.stderr_text() ==
        "gpurun: error: worker script 'no_such_script.py' not found or not readable\n");

  Gpurun ev({"--device", "cpu", "--master-port", "0", "--event-log", dir.str() + "/ev.jsonl", "sh",
             "-c", "true"},
            {}, dir.path, "ev");
  REQUIRE(ev.wait(20s));
  CHECK(ev.code() == 0);
  const std::string log = slurp(dir.path / "ev.jsonl");
  INFO(log);
  CHECK(log.find("\"cmd\": [\"sh\", \"-c\", \"true\"], \"executable\": \"/") != std::string::npos);
}

TEST_CASE("gpurun: a --master-addr that does not resolve fails at once, naming it") {
  TempDir dir;
  // RFC 6761: names under .invalid never resolve (no DNS needed to know it). "At once" is the
  // message (not a connect timeout's) and no worker started, not a time.
  Gpurun g({"--nproc", "1", "--device", "cpu", "--master-port", "0", "--master-addr",
            "nosuchhost.invalid", worker("dump_env.sh")},
           {{"OUT_DIR", dir.str()}}, dir.path);
  REQUIRE(g.wait(10s));
  CHECK(g.code() == 2);
  CHECK(g.stderr_text() ==
        "gpurun: error: --master-addr 'nosuchhost.invalid' does not resolve: Name or service not "
        "known\n");
  CHECK_FALSE(fs::exists(dir.path / "env.0"));  // nothing started

  Gpurun bracket({"--nproc", "1", "--device", "cpu", "--master-port", "0", "--master-addr",
                  "[node0]", worker("dump_env.sh")},
                 {{"OUT_DIR", dir.str()}}, dir.path, "bracket");
  REQUIRE(bracket.wait(10s));
  CHECK(bracket.code() == 2);
  CHECK(bracket.stderr_text() ==
        "gpurun: error: --master-addr '[node0]' does not resolve: brackets enclose only an IPv6 "
        "address, e.g. [::1]\n");
}

TEST_CASE("gpurun: IPv4, IPv6 (bare and bracketed) and host names reach the workers verbatim") {
  for (const std::string addr : {"127.0.0.1", "::1", "[::1]", "localhost"}) {
    CAPTURE(addr);
    TempDir dir;
    const auto start = Clock::now();
    Gpurun g({"--nproc", "1", "--device", "cpu", "--master-port", "0", "--master-addr", addr,
              worker("dump_env.sh")},
             {{"OUT_DIR", dir.str()}}, dir.path);
    REQUIRE(g.wait(30s));
    INFO(g.stderr_text());
    CHECK(g.code() == 0);
    CHECK(Clock::now() - start < 5s);
    const auto env = parse_env_file(dir.path / "env.0");
    CHECK(env.at("MASTER_ADDR") == addr);
    CHECK(env.at("GPURUN_STORE_ADDR") == addr);
  }
}

// ---- preemption (docs/cli.md#preemption) -----------------------------------------------------

namespace {
std::string sigs_of(const fs::path& dir, int rank) {
  const fs::path p = dir / ("sig." + std::to_string(rank));
  return fs::exists(p) ? slurp(p) : std::string();
}
bool started(const fs::path& dir, int n) {
  for (int r = 0; r < n; ++r) {  // the pid line written completely
    const fs::path p = dir / ("pid." + std::to_string(r));
    if (!fs::exists(p) || slurp(p).find('\n') == std::string::npos) return false;
  }
  return true;
}
}  // namespace

TEST_CASE("gpurun preemption: SIGTERM stops runtime workers at a boundary before any SIGTERM") {
  TempDir dir;
  // Rank 0 and 1 on the runtime, rank 2 a plain program: it gets SIGTERM at once.
  Gpurun g({"--nproc", "3", "--device", "cpu", "--master-port", "0", "--stop-timeout", "30",
            "--grace-period", "30", "--event-log", (dir.path / "events.jsonl").string(),
            worker("preempt.sh")},
           {{"OUT_DIR", dir.str()}, {"MODE", "runtime"}, {"MODE_2", "plain"}}, dir.path);
  REQUIRE(poll_until([&] { return started(dir.path, 3); }, 20s));
  ::kill(g.pid, SIGTERM);
  REQUIRE(g.wait(10s));  // well inside --stop-timeout: nobody waited for it
  CHECK(g.code() == 128 + SIGTERM);
  CHECK(fs::exists(dir.path / "stopped.0"));
  CHECK(fs::exists(dir.path / "stopped.1"));
  CHECK(sigs_of(dir.path, 0).empty());  // no SIGTERM reached the runtime workers
  CHECK(sigs_of(dir.path, 1).empty());
  CHECK(sigs_of(dir.path, 2) == "TERM\n");  // the plain worker: at once, as before
  const std::string err = g.stderr_text();
  CHECK(err.find("asking 2 workers on the gpurun runtime to stop at their next boundary") !=
        std::string::npos);
  const std::string events = slurp(dir.path / "events.jsonl");
  CHECK(count_of(events, "\"event\": \"worker_exited\"") == 3);
  CHECK(count_of(events, "\"code\": 0") == 2);  // ranks 0 and 1; rank 2 exited 143
}

TEST_CASE("gpurun preemption: no boundary -> SIGTERM after --stop-timeout, SIGKILL after grace") {
  TempDir dir;
  Gpurun g({"--nproc", "1", "--device", "cpu", "--master-port", "0", "--stop-timeout", "1.5",
            "--grace-period", "1", worker("preempt.sh")},
           {{"OUT_DIR", dir.str()}, {"MODE", "stuck"}}, dir.path);
  REQUIRE(poll_until([&] { return started(dir.path, 1); }, 20s));
  const pid_t wpid = std::stoi(slurp(dir.path / "pid.0"));
  const auto t0 = Clock::now();
  ::kill(g.pid, SIGTERM);
  CHECK(poll_until([&] { return sigs_of(dir.path, 0) == "TERM\n"; }, 5s));
  CHECK(Clock::now() - t0 >= 1500ms);  // not inside --stop-timeout
  REQUIRE(g.wait(10s));
  CHECK(g.code() == 128 + SIGTERM);
  CHECK(!alive(wpid));  // it ignored SIGTERM: SIGKILL ended it
  const std::string err = g.stderr_text();
  CHECK(err.find("--stop-timeout of 1500 ms over: rank 0 did not stop at a boundary") !=
        std::string::npos);
  CHECK(err.find("grace period of 1000 ms over: sending SIGKILL") != std::string::npos);
}

TEST_CASE("gpurun preemption: --preempt-signal URG is forwarded; a second SIGTERM kills at once") {
  TempDir dir;
  Gpurun g({"--nproc", "1", "--device", "cpu", "--master-port", "0", "--preempt-signal", "SIGURG",
            "--stop-timeout", "30", "--grace-period", "30", worker("preempt.sh")},
           {{"OUT_DIR", dir.str()}, {"MODE", "stuck"}}, dir.path);
  REQUIRE(poll_until([&] { return started(dir.path, 1); }, 20s));
  ::kill(g.pid, SIGURG);
  CHECK(poll_until([&] { return sigs_of(dir.path, 0) == "URG\n"; }, 5s));
  ::kill(g.pid, SIGTERM);
  REQUIRE(poll_until(
      [&] { return g.stderr_text().find("received SIGTERM: asking") != std::string::npos; }, 5s));
  ::kill(g.pid, SIGTERM);
  REQUIRE(g.wait(5s));  // neither --stop-timeout nor --grace-period waited for
  CHECK(g.code() == 128 + SIGTERM);
  CHECK(g.stderr_text().find("preemption warning") != std::string::npos);
}

TEST_CASE("gpurun preemption: --requeue runs scontrol requeue $SLURM_JOB_ID, exit 75") {
  TempDir dir;
  fs::create_directories(dir.path / "bin");
  const fs::path scontrol = dir.path / "bin" / "scontrol";
  std::ofstream(scontrol) << "#!/bin/sh\necho \"$@\" >> " << (dir.path / "scontrol.args").string()
                          << "\n";
  fs::permissions(scontrol, fs::perms::owner_all);
  std::ofstream(dir.path / "slurm.conf") << "ClusterName=test\n# KillWait=99\nKillWait=20 "
                                            "SlurmdTimeout=300\n";
  const std::map<std::string, std::string> slurm = {
      {"OUT_DIR", dir.str()},
      {"SLURM_JOB_ID", "4242"},
      {"SLURM_CONF", (dir.path / "slurm.conf").string()},
      {"PATH", (dir.path / "bin").string() + ":/usr/bin:/bin"}};

  SUBCASE("after SIGTERM") {
    Gpurun g({"--nproc", "2", "--device", "cpu", "--master-port", "0", "--requeue",
              worker("preempt.sh")},
             slurm, dir.path);
    REQUIRE(poll_until([&] { return started(dir.path, 2); }, 20s));
    ::kill(g.pid, SIGTERM);
    REQUIRE(g.wait(10s));
    CHECK(g.code() == 75);
    CHECK(slurp(dir.path / "scontrol.args") == "requeue 4242\n");
    const std::string err = g.stderr_text();
    // Under Slurm the defaults share KillWait - 2 s: 9 s + 9 s.
    CHECK(err.find("KillWait=20 s from") != std::string::npos);
    CHECK(err.find("--stop-timeout 9 s, then SIGTERM, SIGKILL after --grace-period 9 s") !=
          std::string::npos);
    CHECK(err.find("--requeue: job 4242 requeued") != std::string::npos);
  }
  SUBCASE("after the preempt signal: the runtime workers stop at their boundary") {
    Gpurun g({"--nproc", "1", "--device", "cpu", "--master-port", "0", "--requeue",
              worker("preempt.sh")},
             slurm, dir.path);
    REQUIRE(poll_until([&] { return started(dir.path, 1); }, 20s));
    ::kill(g.pid, SIGUSR2);
    REQUIRE(g.wait(10s));
    CHECK(g.code() == 75);
    CHECK(fs::exists(dir.path / "stopped.0"));
    CHECK(sigs_of(dir.path, 0) == "USR2\n");  // the warning itself, no SIGTERM
    CHECK(slurp(dir.path / "scontrol.args") == "requeue 4242\n");
  }
  SUBCASE("no scontrol on PATH: said, and the exit status stays 143") {
    fs::remove(scontrol);
    // A PATH with only what the worker needs (this machine may have a real scontrol).
    fs::create_symlink("/bin/sleep", dir.path / "bin" / "sleep");
    std::map<std::string, std::string> env = slurm;
    env["PATH"] = (dir.path / "bin").string();
    Gpurun g({"--nproc", "1", "--device", "cpu", "--master-port", "0", "--requeue",
              worker("preempt.sh")},
             env, dir.path);
    REQUIRE(poll_until([&] { return started(dir.path, 1); }, 20s));
    ::kill(g.pid, SIGTERM);
    REQUIRE(g.wait(10s));
    CHECK(g.code() == 128 + SIGTERM);
    CHECK(g.stderr_text().find("--requeue: not requeued: scontrol is not on PATH") !=
          std::string::npos);
  }
}
