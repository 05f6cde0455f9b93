// Runs the real gpurun binary with tiny shell/python workers (tests/supervisor/workers).
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
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

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

/// A unique scratch directory, removed at the end of the test.
struct TempDir {
  fs::path path;
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "gpurun-it-XXXXXX").string();
    REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string str() const { return path.string(); }
};

/// One gpurun process with stdout/stderr captured to files.
struct Gpurun {
  pid_t pid = -1;
  fs::path out, err;
  std::optional<int> status;  // raw waitpid status

  Gpurun(const std::vector<std::string>& args, const std::map<std::string, std::string>& env,
         const fs::path& dir, const std::string& tag = "gpurun") {
    out = dir / (tag + ".stdout");
    err = dir / (tag + ".stderr");
    pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      int o = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      int e = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(o, 1);
      ::dup2(e, 2);
      for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
      std::vector<char*> argv;
      argv.push_back(const_cast<char*>(kGpurun.c_str()));
      for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      ::execv(kGpurun.c_str(), argv.data());
      ::_exit(126);
    }
  }
  ~Gpurun() {
    if (!status && pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  }
  /// Waits up to `limit`; true when gpurun exited.
  bool wait(std::chrono::milliseconds limit) {
    const auto end = Clock::now() + limit;
    while (!status) {
      int st = 0;
      pid_t r = ::waitpid(pid, &st, WNOHANG);
      if (r == pid) {
        status = st;
        break;
      }
      if (Clock::now() >= end) return false;
      std::this_thread::sleep_for(10ms);
    }
    return true;
  }
  /// Shell-style exit code (128+signal for a signal death); -1 if still running.
  int code() const {
    if (!status) return -1;
    return WIFSIGNALED(*status) ? 128 + WTERMSIG(*status) : WEXITSTATUS(*status);
  }
  std::string stdout_text() const { return slurp(out); }
  std::string stderr_text() const { return slurp(err); }
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

bool wait_for(const std::function<bool()>& pred, std::chrono::milliseconds limit) {
  const auto end = Clock::now() + limit;
  while (!pred()) {
    if (Clock::now() >= end) return false;
    std::this_thread::sleep_for(10ms);
  }
  return true;
}

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
          fs::absolute(logs).string() + "/envtest/attempt_0/" + std::to_string(r) + "/error.json");
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
    CHECK(slurp(logs + "/envtest/attempt_0/" + std::to_string(r) + "/stdout.log") ==
          "stdout of rank " + std::to_string(r) + "\n");
    CHECK(slurp(logs + "/envtest/attempt_0/" + std::to_string(r) + "/stderr.log") ==
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
  REQUIRE(wait_for([&] { return fs::exists(dir.path / "failed_at"); }, 20s));
  const auto failed = Clock::now();
  std::vector<pid_t> survivors;
  for (int r = 0; r < 2; ++r)
    survivors.push_back(std::stoi(slurp(dir.path / ("pid." + std::to_string(r)))));
  CHECK(wait_for([&] { return all_dead(survivors); }, 3s));  // grace 2 s + 1 s
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
  REQUIRE(wait_for(
      [&] {
        return fs::exists(dir.path / "ready.0") && fs::exists(dir.path / "ready.1") &&
               read_pids(dir.path, "pids.").size() == 8;
      },
      20s));
  std::this_thread::sleep_for(100ms);  // the grandchild's pid line lands right after ready
  const auto pids = read_pids(dir.path, "pids.");
  REQUIRE(pids.size() == 8);  // per rank: worker, child, subshell, grandchild
  CHECK(!all_dead(pids));
  ::kill(g.pid, SIGTERM);
  REQUIRE(g.wait(10s));
  CHECK(g.code() == 128 + SIGTERM);
  // gpurun returns only after every group is empty; allow init a moment to reap.
  CHECK(wait_for([&] { return all_dead(pids); }, 500ms));
  CHECK(g.stderr_text().find("received SIGTERM") != std::string::npos);
}

TEST_CASE("gpurun: kill -9 of gpurun -> every worker gone within 1 s") {
  TempDir dir;
  Gpurun g({"--nproc", "3", "--device", "cpu", "--master-port", "0", worker("loop.sh")},
           {{"OUT_DIR", dir.str()}}, dir.path);
  REQUIRE(wait_for([&] { return read_pids(dir.path, "pid.").size() == 3; }, 20s));
  const auto workers = read_pids(dir.path, "pid.");
  CHECK(!all_dead(workers));
  ::kill(g.pid, SIGKILL);
  REQUIRE(g.wait(5s));
  CHECK(wait_for([&] { return all_dead(workers); }, 1s));
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

TEST_CASE("gpurun: an explicitly requested busy port fails within 1 s naming the port") {
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
  const auto t0 = Clock::now();
  Gpurun g({"--nproc", "1", "--device", "cpu", "--master-port", port, worker("loop.sh")},
           {{"OUT_DIR", dir.str()}}, dir.path);
  REQUIRE(g.wait(5s));
  CHECK(Clock::now() - t0 < 1s);
  ::close(s);
  const std::string err = g.stderr_text();
  INFO(err);
  CHECK(g.code() == 1);
  CHECK(err.find(":" + port) != std::string::npos);
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
