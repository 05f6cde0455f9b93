// The real gpurun binary in elastic mode (--config) with fake workers
// (fake_worker.cpp) on --device cpu: the test rewrites config.toml between
// epochs and checks what every worker read and what the event log says.
#include <doctest/doctest.h>

#include "elastic_run.hpp"
#include "gpurun_process.hpp"
#include "supervisor/notifier.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
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

#include <boost/json.hpp>

#include "gpurun/control/decision.hpp"

namespace fs = std::filesystem;
namespace json = boost::json;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using gpurun::control::Decision;

namespace {

const std::string kGpurun = GPURUN_BINARY;
const std::string kWorker = GPURUN_FAKE_WORKER;
constexpr auto kHangGuard = 60s;

using gpurun::testing::slurp;

using gpurun::testing::write_file;

using gpurun::testing::TempDir;

/// gpurun --device cpu --nproc N --config DIR/config.toml --event-log DIR/events.jsonl
///        fake_worker DIR EPOCH_MS, output captured in DIR.
struct Run : gpurun::testing::ElasticRun {
  /// `config` nullopt: a plain run (no --config) of `command` instead of fake_worker.
  Run(const fs::path& d, int nproc, const std::optional<std::string>& config, int epoch_ms = 150,
      std::vector<std::string> extra = {}, std::string device = "cpu",
      std::map<std::string, std::string> env = {}, std::vector<std::string> command = {})
      : ElasticRun(kGpurun, d, nproc, config,
                   command.empty()
                       ? std::vector<std::string>{kWorker, d.string(), std::to_string(epoch_ms)}
                       : command,
                   extra, device, env) {}

  /// Makes every worker finish at an epoch well ahead of now, then waits for gpurun.
  int finish() {
    long max_epoch = 0;
    for (auto& e : events("decision")) max_epoch = std::max<long>(max_epoch, e["epoch"].as_int64());
    write_file(dir / "stop", std::to_string(max_epoch + 3));
    if (!wait(kHangGuard)) FAIL("gpurun did not finish\n" << diag());
    return code();
  }

  /// store key -> every distinct value any worker read under it.
  std::map<std::string, std::set<std::string>> reads() const {
    std::map<std::string, std::set<std::string>> out;
    for (const auto& f : fs::directory_iterator(dir)) {
      if (f.path().filename().string().rfind("reads.", 0) != 0) continue;
      std::istringstream in(slurp(f.path()));
      for (std::string line; std::getline(in, line);) {
        auto sp = line.find(' ');
        out[line.substr(0, sp)].insert(line.substr(sp + 1));
      }
    }
    return out;
  }
  /// Per slot, the gpurun variables each of its processes started with (env.<gpu>.<pid>).
  std::map<int, std::vector<std::map<std::string, std::string>>> envs() const {
    std::map<int, std::vector<std::map<std::string, std::string>>> out;
    for (const auto& f : fs::directory_iterator(dir)) {
      const std::string name = f.path().filename().string();
      if (name.rfind("env.", 0) != 0) continue;
      std::map<std::string, std::string> vars;
      std::istringstream in(slurp(f.path()));
      for (std::string line; std::getline(in, line);) {
        auto eq = line.find('=');
        vars[line.substr(0, eq)] = line.substr(eq + 1);
      }
      out[std::stoi(name.substr(4, name.find('.', 4) - 4))].push_back(vars);
    }
    return out;
  }
  /// Every store key count a worker saw after reading a decision (keys.<gpu>.<pid>).
  std::vector<long> key_counts() const {
    std::vector<long> out;
    for (const auto& f : fs::directory_iterator(dir)) {
      if (f.path().filename().string().rfind("keys.", 0) != 0) continue;
      std::istringstream in(slurp(f.path()));
      for (long n; in >> n;) out.push_back(n);
    }
    return out;
  }
  /// Every key was read with identical bytes by all its readers.
  void check_reads_identical() const {
    auto r = reads();
    CHECK(!r.empty());
    for (const auto& kv : r) {  // named: clang 14 cannot capture a binding in INFO's lambda
      INFO("key " << kv.first);
      CHECK(kv.second.size() == 1);
    }
  }
  /// A grow to `target`: its joiners may be admitted over several resizes, as each gets ready
  /// (docs/control-protocol.md#warm-joiners: no boundary waits for a slow joiner; seen under
  /// ASan). Waits from resize #`n` on until the active set is `target`; every step only adds
  /// GPUs. Returns the last of them and the union of their joiners; `n` ends at its number.
  std::pair<json::object, std::set<int64_t>> wait_grown(size_t& n, const std::string& target) {
    std::set<int64_t> joiners;
    for (size_t before = 0;; ++n) {
      json::object d = wait_resize(n);
      const auto& active = d.at("active").as_array();
      CHECK(active.size() > before);  // a grow never drops a member on the way
      before = active.size();
      for (const auto& j : d.at("joiners").as_array()) joiners.insert(j.as_int64());
      if (json::serialize(d.at("active")) == target) return {d, joiners};
      if (n >= 16) FAIL("no resize reached " << target << "\n" << diag());
    }
  }
};

std::string ids(const json::object& e, const char* field) {
  return json::serialize(e.at(field));
}

std::string config(const std::string& active, const std::string& mode = "release",
                   int deadline_s = 30) {
  std::string c;
  if (!active.empty()) c += "active_gpus = " + active + "\n";
  c += "[park]\nmode = \"" + mode +
       "\"\n[boundary]\nevery = \"epoch\"\ndeadline_s = " + std::to_string(deadline_s) + "\n";
  return c;
}

/// `gpurun status ARGS` against the runs registered under DIR/xdg: (exit status, output).
std::pair<int, std::string> gpurun_status(const fs::path& dir, const std::string& args) {
  const std::string cmd =
      "XDG_RUNTIME_DIR=" + (dir / "xdg").string() + " " + kGpurun + " status " + args + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  const int rc = ::pclose(p);
  return {WEXITSTATUS(rc), out};
}

/// Index of the first event named `name` (with `field` == `value` when given) at or after `from`.
size_t find_event(const std::vector<json::object>& evs, size_t from, const std::string& name,
                  const std::string& field = "", const std::string& value = "") {
  for (size_t i = from; i < evs.size(); ++i) {
    if (evs[i].at("event").as_string() != name) continue;
    if (!field.empty() && json::serialize(evs[i].at(field)) != value) continue;
    return i;
  }
  return evs.size();
}

}  // namespace

TEST_CASE("elastic release mode: shrink, grow, bad config, swap, pause and resume") {
  TempDir tmp;
  Run run(tmp.path, 4, config(""));
  json::object start = run.wait_resize(1);
  CHECK(start["kind"].as_string() == "start");
  CHECK(ids(start, "active") == "[0,1,2,3]");
  run.wait_continues(1);

  write_file(tmp.path / "config.toml", config("[0, 1]"));  // shrink 4 -> 2
  auto shrink = run.wait_resize(2);
  CHECK(ids(shrink, "active") == "[0,1]");
  CHECK(ids(shrink, "leavers") == "[2,3]");
  CHECK(shrink["state_source"].as_int64() == 0);
  run.wait_continues(1);

  write_file(tmp.path / "config.toml", "active_gpus = [0, 9]\n");  // bad: 9 out of range
  run.wait_for("config_rejected", [&] { return !run.events("config_rejected").empty(); });
  run.wait_continues(2);  // training carries on with the last good config
  CHECK(run.resizes().size() == 2);

  write_file(tmp.path / "config.toml", config("[0, 1, 2, 3]"));  // grow 2 -> 4
  size_t n = 3;
  CHECK(run.wait_grown(n, "[0,1,2,3]").second == std::set<int64_t>{2, 3});
  run.wait_continues(1);

  write_file(tmp.path / "config.toml", config("[2, 3]"));  // shrink to [2,3] ...
  auto to23 = run.wait_resize(++n);
  CHECK(ids(to23, "active") == "[2,3]");
  CHECK(to23["state_source"].as_int64() == 2);  // rank 2 of the old generation = gpu 2 stays
  run.wait_continues(1);
  write_file(tmp.path / "config.toml", config("[0, 1]"));  // ... then swap [2,3] -> [0,1]
  auto swap = run.wait_resize(++n);
  CHECK(ids(swap, "leavers") == "[2,3]");
  if (ids(swap, "active") == "[0,1]") {
    CHECK(ids(swap, "joiners") == "[0,1]");
    CHECK(swap["state_source"].as_int64() == 0);  // a leaver hands the state off
  } else {
    // A warm joiner that was not ready at that boundary (a loaded machine: seen under ASan) is
    // admitted at a later one; no boundary waits for it (docs/control-protocol.md#warm-joiners).
    CHECK((ids(swap, "active") == "[0]" || ids(swap, "active") == "[1]"));
    auto rest = run.wait_resize(++n);
    CHECK(ids(rest, "active") == "[0,1]");
  }
  run.wait_continues(1);

  write_file(tmp.path / "config.toml", config("[]"));  // pause
  auto pause = run.wait_resize(++n);
  CHECK(ids(pause, "active") == "[]");
  // Paused: every worker exited (release) yet gpurun keeps running.
  run.wait_for("both leavers parked", [&] {
    size_t parked = 0;
    for (auto& e : run.events("worker_state"))
      if (e["to"].as_string() == "PARKED" &&
          e["generation"].as_int64() == pause["generation"].as_int64())
        ++parked;
    return parked >= 2;
  });
  std::this_thread::sleep_for(500ms);
  CHECK(!run.wait(0ms));

  write_file(tmp.path / "config.toml", config("[1, 3]"));  // resume on other GPUs
  auto resume = run.wait_resize(++n);
  CHECK(ids(resume, "active") == "[1,3]");
  CHECK(resume["state_source"].as_int64() == -1);  // from the host snapshot
  CHECK(resume["round"].as_int64() == -1);
  run.wait_continues(2);

  CHECK(run.finish() == 0);
  run.check_reads_identical();
  // The event log tells the story in order.
  auto evs = run.events();
  size_t i = find_event(evs, 0, "config_loaded");
  i = find_event(evs, i, "decision", "active", "[0,1]");
  i = find_event(evs, i, "worker_state", "to", "\"OFFLOADING\"");
  i = find_event(evs, i, "config_rejected");
  i = find_event(evs, i, "decision", "active", "[0,1,2,3]");
  i = find_event(evs, i, "worker_state", "to", "\"REJOINING\"");
  i = find_event(evs, i, "decision", "active", "[]");
  i = find_event(evs, i, "decision", "active", "[1,3]");
  CHECK(i < evs.size());
  auto shutdown = run.events("shutdown");
  REQUIRE(shutdown.size() == 1);
  CHECK(shutdown[0]["exit_code"].as_int64() == 0);
}

TEST_CASE("elastic hold mode: leavers stay parked and are woken, not respawned") {
  TempDir tmp;
  Run run(tmp.path, 3, config("", "hold"));
  run.wait_resize(1);
  run.wait_continues(1);
  write_file(tmp.path / "config.toml", config("[0]", "hold"));
  auto shrink = run.wait_resize(2);
  CHECK(ids(shrink, "leavers") == "[1,2]");
  run.wait_for("leavers parked", [&] {
    size_t n = 0;
    for (auto& e : run.events("worker_state")) n += e["to"].as_string() == "PARKED";
    return n >= 2;
  });
  const size_t spawned = run.events("worker_started").size();
  CHECK(spawned == 3);
  write_file(tmp.path / "config.toml", config("[0, 1, 2]", "hold"));
  auto grow = run.wait_resize(3);
  CHECK(ids(grow, "joiners") == "[1,2]");
  run.wait_continues(2);
  CHECK(run.events("worker_started").size() == spawned);  // woken, not respawned
  CHECK(run.finish() == 0);
  run.check_reads_identical();
}

TEST_CASE("elastic failures: a dying joiner and a stalled worker are removed, the job goes on") {
  TempDir tmp;
  Run run(tmp.path, 4, config("[0, 1]", "release", 2));
  run.wait_resize(1);
  run.wait_continues(1);

  write_file(tmp.path / "die_gpu2", "");
  write_file(tmp.path / "config.toml", config("[0, 1, 2]", "release", 2));
  auto grow = run.wait_resize(2);
  CHECK(ids(grow, "joiners") == "[2]");
  // Gpu 2 dies as a joiner: the next decision is redone without it.
  auto redo = run.wait_resize(3);
  CHECK(ids(redo, "active") == "[0,1]");
  CHECK(ids(redo, "failed") == "[2]");
  run.wait_continues(1);

  write_file(tmp.path / "stall_gpu1", "");
  auto stalled = run.wait_resize(4);  // after deadline_s = 2
  CHECK(ids(stalled, "active") == "[0]");
  CHECK(ids(stalled, "failed") == "[1]");
  run.wait_continues(1);

  CHECK(run.finish() == 0);
  run.check_reads_identical();
  bool stall_event = false, joiner_event = false;
  for (auto& e : run.events("worker_state")) {
    if (e["to"].as_string() != "FAILED") continue;
    const std::string reason(e["reason"].as_string());
    if (e["gpu"].as_int64() == 1 &&
        reason.find("stalled past the boundary deadline") != std::string::npos)
      stall_event = true;
    if (e["gpu"].as_int64() == 2 && e["generation"].as_int64() == grow["generation"].as_int64())
      joiner_event = true;
  }
  CHECK(stall_event);
  CHECK(joiner_event);
  // Both removals are said on the console, not only in the event log.
  std::ifstream err(tmp.path / "gpurun.stderr");
  const std::string console((std::istreambuf_iterator<char>(err)), {});
  INFO(console);
  // The joiner dies right after joining: the supervisor may see its exit before or after it
  // saw the joined key, and says "rank 2 of generation 1" or "joining generation 1".
  CHECK((console.find("gpu 2 (rank 2 of generation 1, pid") != std::string::npos ||
         console.find("gpu 2 (joining generation 1, pid") != std::string::npos));
  CHECK(console.find("the job goes on without it") != std::string::npos);
  CHECK(console.find("gpu 1 (rank 1, pid") != std::string::npos);  // the stall
  // The job went on without it and exits 0: its final line says so.
  const std::string last = console.substr(console.rfind('\n', console.size() - 2) + 1);
  CHECK(last.find("gpurun: finished (exit 0); note: 1 rank was killed at a deadline") == 0);
  CHECK(last.find("gpu 1 (rank 1 of generation") != std::string::npos);
}

TEST_CASE("gpurun status --json and the table against a live run") {
  TempDir tmp;
  Run run(tmp.path, 3, config("[0, 2]"));
  run.wait_resize(1);
  run.wait_continues(1);
  auto capture = [&](const std::string& args) {
    const std::string cmd = "XDG_RUNTIME_DIR=" + (tmp.path / "xdg").string() + " " + kGpurun +
                            " status " + args + " 2>&1";
    FILE* p = ::popen(cmd.c_str(), "r");
    std::string out;
    char buf[4096];
    while (size_t n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
    const int rc = ::pclose(p);
    return std::make_pair(WEXITSTATUS(rc), out);
  };
  const auto text_out = capture("--json");
  const int rc = text_out.first;
  const std::string& text = text_out.second;  // named: for INFO's lambda (clang 14)
  INFO(text);
  REQUIRE(rc == 0);
  auto root = json::parse(text).as_object();
  CHECK(root["run_id"].as_string() == "ctl-test");
  CHECK(json::serialize(root["current_active"]) == "[0,2]");
  CHECK(json::serialize(root["desired_active"]) == "[0,2]");
  auto& slots = root["slots"].as_array();
  REQUIRE(slots.size() == 3);
  CHECK(slots[0].as_object()["state"].as_string() == "ACTIVE");
  CHECK(slots[1].as_object()["state"].as_string() == "PARKED");
  CHECK(slots[1].as_object()["pid"].as_int64() == -1);
  CHECK(slots[2].as_object()["rank"].as_int64() == 1);
  CHECK(slots[2].as_object()["pid"].as_int64() > 0);

  const auto table_out = capture("--run-id ctl-test");
  const int rc2 = table_out.first;
  const std::string& table = table_out.second;  // named: for INFO's lambda (clang 14)
  INFO(table);
  CHECK(rc2 == 0);
  CHECK(table.find("ACTIVE") != std::string::npos);
  CHECK(table.find("PARKED") != std::string::npos);
  std::ofstream(tmp.path / "status-table.txt") << table;

  auto [rc3, none] = capture("--run-id no-such-run");
  CHECK(rc3 == 1);
  CHECK(none.find("no running gpurun with run id 'no-such-run'") != std::string::npos);

  CHECK(run.finish() == 0);
  // Registration and status are gone with the run.
  auto [rc4, after] = capture("");
  CHECK(rc4 == 1);
}

TEST_CASE("a bad config at start is a usage error naming file:line:col; nothing starts") {
  TempDir tmp;
  Run run(tmp.path, 2, "active_gpus = [0, 5]\n");
  REQUIRE(run.wait(kHangGuard));
  CHECK(run.code() == 2);
  const std::string err = slurp(tmp.path / "gpurun.stderr");
  CHECK(err.find("gpurun: error: " + (tmp.path / "config.toml").string() + ":1:") !=
        std::string::npos);
  CHECK(err.find("active_gpus") != std::string::npos);
  CHECK(run.events("worker_started").empty());
}

TEST_CASE("--device cpu: --nproc 4 with active_gpus = [0, 1] starts 2; growing spawns 2 and 3") {
  TempDir tmp;
  Run run(tmp.path, 4, config("[0, 1]"));
  auto start = run.wait_resize(1);
  CHECK(ids(start, "active") == "[0,1]");
  run.wait_continues(1);
  CHECK(run.events("worker_started").size() == 2);

  // Gpu 3's joiner is slow to get ready: gpu 2 is admitted without waiting for it, gpu 3 at a
  // later boundary once it is ready (docs/control-protocol.md#warm-joiners).
  gpurun::testing::GoFifo hold(tmp.path / "hold_warm_gpu3");
  write_file(tmp.path / "config.toml", config("[0, 1, 2, 3]"));
  auto first = run.wait_resize(2);
  CHECK(ids(first, "active") == "[0,1,2]");
  CHECK(ids(first, "joiners") == "[2]");
  run.wait_continues(2);
  CHECK(run.resizes().size() == 2);  // no boundary admits a joiner that is not ready
  hold.release(1);
  auto grow = run.wait_resize(3);
  CHECK(ids(grow, "active") == "[0,1,2,3]");
  CHECK(ids(grow, "joiners") == "[3]");
  run.wait_continues(1);
  CHECK(run.events("worker_started").size() == 4);
  auto envs = run.envs();
  for (int gpu : {2, 3}) {
    CAPTURE(gpu);
    REQUIRE(envs[gpu].size() == 1);
    auto& e = envs[gpu][0];
    CHECK(e["LOCAL_RANK"] == std::to_string(gpu));
    CHECK(e["GPURUN_SLOT"] == std::to_string(gpu));
    CHECK(e["RANK"] == std::to_string(gpu));
    CHECK(e["WORLD_SIZE"] == "4");
    // A warm joiner: spawned at the edit with its id, joins the generation that admits it.
    CHECK(e["GPURUN_JOIN_GENERATION"] == "<unset>");
    CHECK(e["GPURUN_WARM"] != "<unset>");
    CHECK(e["GPURUN_GPU_ID"] == "<unset>");
  }
  CHECK(run.finish() == 0);
  run.check_reads_identical();
}

TEST_CASE("--device cuda: every visible GPU is a slot; --nproc only sets how many start") {
  // CUDA_VISIBLE_DEVICES names the GPUs, so no GPU is touched: fake workers never use CUDA.
  TempDir tmp;
  Run run(tmp.path, 2, config(""), 150, {}, "cuda", {{"CUDA_VISIBLE_DEVICES", "4,5,6,7"}});
  auto start = run.wait_resize(1);
  CHECK(ids(start, "active") == "[0,1]");  // active_gpus absent: the first --nproc
  run.wait_continues(1);
  CHECK(run.events("worker_started").size() == 2);

  const auto text_out = gpurun_status(tmp.path, "--json");
  const int rc = text_out.first;
  const std::string& text = text_out.second;  // named: for INFO's lambda (clang 14)
  INFO(text);
  REQUIRE(rc == 0);
  auto root = json::parse(text).as_object();
  CHECK(json::serialize(root["desired_active"]) == "[0,1]");
  auto& slots = root["slots"].as_array();
  REQUIRE(slots.size() == 4);  // every visible GPU
  CHECK(slots[3].as_object()["physical_gpu"].as_string() == "7");
  CHECK(slots[3].as_object()["state"].as_string() == "PARKED");

  // GPUs 2 and 3 were never launched: they are spawned as joiners with their own device.
  write_file(tmp.path / "config.toml", config("[0, 1, 2, 3]"));
  size_t n = 2;
  CHECK(run.wait_grown(n, "[0,1,2,3]").second == std::set<int64_t>{2, 3});
  run.wait_continues(1);
  auto envs = run.envs();
  for (int gpu : {0, 1, 2, 3}) {
    CAPTURE(gpu);
    REQUIRE(envs[gpu].size() == 1);
    auto& e = envs[gpu][0];
    CHECK(e["LOCAL_RANK"] == std::to_string(gpu));
    CHECK(e["GPURUN_SLOT"] == std::to_string(gpu));
    CHECK(e["GPURUN_GPU_ID"] == std::to_string(4 + gpu));  // its CUDA_VISIBLE_DEVICES entry
    CHECK(e["CUDA_VISIBLE_DEVICES"] == "4,5,6,7");
    CHECK(e["GPURUN_DEVICE"] == "cuda");
  }
  CHECK(envs[3][0]["WORLD_SIZE"] == "4");
  CHECK(envs[3][0]["RANK"] == "3");
  CHECK(run.finish() == 0);
  run.check_reads_identical();
}

TEST_CASE("--device cuda: active_gpus at start decides the initial set, beyond --nproc") {
  TempDir tmp;
  Run run(tmp.path, 1, config("[1, 3]"), 150, {}, "cuda", {{"CUDA_VISIBLE_DEVICES", "4,5,6,7"}});
  auto start = run.wait_resize(1);
  CHECK(ids(start, "active") == "[1,3]");
  run.wait_continues(1);
  auto envs = run.envs();
  REQUIRE(envs[3].size() == 1);
  CHECK(envs[3][0]["GPURUN_GPU_ID"] == "7");
  CHECK(envs[3][0]["RANK"] == "1");
  // Issue 43: the generation's values, not the slot's, but LOCAL_RANK at the start is the
  // slot's device index (cuda:LOCAL_RANK is this slot's GPU; the runtime sets the
  // generation's local rank from its first generation on), and the config gpurun watches.
  CHECK(envs[3][0]["LOCAL_RANK"] == "3");
  CHECK(envs[3][0]["WORLD_SIZE"] == "2");
  CHECK(envs[3][0]["LOCAL_WORLD_SIZE"] == "2");
  CHECK(envs[3][0]["GROUP_RANK"] == "0");
  CHECK(envs[3][0]["GPURUN_SLOT"] == "3");
  CHECK(envs[3][0]["GPURUN_CONFIG"] == fs::absolute(tmp.path / "config.toml").string());
  REQUIRE(envs[1].size() == 1);
  CHECK(envs[1][0]["RANK"] == "0");
  CHECK(envs[1][0]["LOCAL_RANK"] == "1");
  CHECK(envs.count(0) == 0);
  CHECK(run.finish() == 0);
}

TEST_CASE("a worker that finishes one epoch early ends the job; peers at the boundary exit") {
  TempDir tmp;
  Run run(tmp.path, 3, config("", "release", 30));
  run.wait_resize(1);
  run.wait_continues(2);
  long max_epoch = 0;
  for (auto& e : run.events("decision"))
    max_epoch = std::max<long>(max_epoch, e["epoch"].as_int64());
  write_file(tmp.path / "stop_gpu1", std::to_string(max_epoch + 2));
  // Well within the 30 s boundary deadline: nobody waits for a decision that never comes.
  REQUIRE(run.wait(10s));
  CHECK(run.code() == 0);
  auto evs = run.events("decision");
  REQUIRE(!evs.empty());
  CHECK(evs.back()["kind"].as_string() == "exit");
  CHECK(ids(evs.back(), "active") == "[0,1,2]");
  bool gpu1_exited = false;
  for (auto& e : run.events("worker_state"))
    if (e["gpu"].as_int64() == 1 && e["to"].as_string() == "EXITED") gpu1_exited = true;
  CHECK(gpu1_exited);
  // gpu 0 and gpu 2 read the same exit decision.
  size_t exit_reads = 0;
  for (const auto& [key, values] : run.reads())
    for (const auto& v : values) exit_reads += v.find("\"kind\":\"exit\"") != std::string::npos;
  CHECK(exit_reads == 1);
  run.check_reads_identical();
  CHECK(slurp(tmp.path / "gpurun.stderr").find("finished training") != std::string::npos);
}

TEST_CASE("a worker that fails after the job finished training makes gpurun fail with its code") {
  // Elastic mode goes on without a worker that fails during training; once a member finished,
  // a failure (a save after the loop that fails) is lost work: not "all workers succeeded".
  TempDir tmp;
  Run run(tmp.path, 3, config("", "release", 30));
  run.wait_continues(2);
  long max_epoch = 0;
  for (auto& e : run.events("decision"))
    max_epoch = std::max<long>(max_epoch, e["epoch"].as_int64());
  write_file(tmp.path / "exit_code_gpu2", "5");
  write_file(tmp.path / "stop_gpu1", std::to_string(max_epoch + 2));
  REQUIRE(run.wait(10s));
  CHECK(run.code() == 5);
  CHECK(slurp(tmp.path / "gpurun.stderr").find("exit       : exit code 5") != std::string::npos);
  auto shutdown = run.events("shutdown");
  REQUIRE(shutdown.size() == 1);
  CHECK(shutdown[0].at("exit_code").as_int64() == 5);
  const std::string why(shutdown[0].at("reason").as_string());
  CHECK_MESSAGE(
      why.find("gpu 2 ended with exit code 5 after the job finished training") != std::string::npos,
      why);
}

TEST_CASE("a warm joiner that never becomes ready is said once and ended at the end: exit 0") {
  // Issue 25 item 4: it was ignored while training went on (fine), then killed at the end and
  // reported as the job's root cause (all epochs trained, exit 137), with nothing said before.
  TempDir tmp;
  Run run(tmp.path, 2, config("[0]", "release", 30));
  run.wait_resize(1);
  run.wait_continues(1);
  write_file(tmp.path / "stall_warm_gpu1", "");
  write_file(tmp.path / "config.toml", config("[0, 1]", "release", 30));
  const std::string late = "gpurun: the warm joiner on gpu 1 (pid ";
  run.wait_for("the console saying the warm joiner is not ready",
               [&] { return slurp(tmp.path / "gpurun.stderr").find(late) != std::string::npos; });
  run.wait_continues(2);  // more boundaries go by without it
  CHECK(run.finish() == 0);
  const std::string console = slurp(tmp.path / "gpurun.stderr");
  INFO(console);
  size_t said = 0;
  for (size_t pos = 0; (pos = console.find(late, pos)) != std::string::npos; pos += late.size())
    ++said;
  CHECK(said == 1);  // once, not at every boundary
  CHECK(console.find("is not ready yet at the boundary") != std::string::npos);
  CHECK(console.find("ending warming gpu 1 (pid") != std::string::npos);
  CHECK(console.find("root cause") == std::string::npos);
  // Its SIGKILL was gpurun's own: the event says so, and [notify] takes it for no failure
  // (before, a `gpurun set park.mode=hold` ending standbys notified each as a failed process).
  bool own = false;
  for (auto& e : run.events("worker_exited"))
    if (e.contains("signal") && e.at("local_rank").as_int64() == 1) {
      CHECK(e.contains("ended_by_gpurun"));
      CHECK_FALSE(gpurun::supervisor::notify_wants("worker_exited", boost::json::serialize(e)));
      own = true;
    }
  CHECK(own);
  for (auto& e : run.resizes()) CHECK(ids(e, "active") == "[0]");  // never admitted
  auto shutdown = run.events("shutdown");
  REQUIRE(shutdown.size() == 1);
  CHECK(shutdown[0].at("exit_code").as_int64() == 0);
}

TEST_CASE("a joiner stalled in its set-up is killed at the set-up deadline, the job goes on") {
  // Issue 25 item 11: a participant that stops inside a resize's set-up (alive, no progress)
  // is given up after [boundary] setup_deadline_s, not after the boundary deadline.
  TempDir tmp;
  const auto cfg = [](const std::string& active) {
    return config(active, "release", 120) + "setup_deadline_s = 1.5\n";
  };
  Run run(tmp.path, 2, cfg("[0]"), 40);
  run.wait_resize(1);
  run.wait_continues(1);
  write_file(tmp.path / "stall_setup_gpu1", "");
  write_file(tmp.path / "config.toml", cfg("[0, 1]"));
  const std::string killed = "gpurun: gpu 1 (pid ";
  run.wait_for("the set-up deadline's kill", [&] {
    return slurp(tmp.path / "gpurun.stderr").find("within 1500 ms ([boundary] setup_deadline_s)") !=
           std::string::npos;
  });
  run.wait_continues(2);  // the job goes on without it, long before the 120 s boundary deadline
  CHECK(run.finish() == 0);
  const std::string console = slurp(tmp.path / "gpurun.stderr");
  INFO(console);
  CHECK(console.find(killed) != std::string::npos);
  CHECK(console.find("did not finish the set-up of generation") != std::string::npos);
  CHECK(console.find("did not reach boundary round") == std::string::npos);  // not the deadline
  bool failed_named = false;
  for (auto& e : run.events("decision")) failed_named = failed_named || ids(e, "failed") == "[1]";
  CHECK(failed_named);
  auto shutdown = run.events("shutdown");
  REQUIRE(shutdown.size() == 1);
  CHECK(shutdown[0].at("exit_code").as_int64() == 0);
}

TEST_CASE("the store's key count stays bounded over many boundaries and resizes") {
  TempDir tmp;
  Run run(tmp.path, 3, config(""), 20);
  run.wait_resize(1);
  run.wait_continues(20);
  write_file(tmp.path / "config.toml", config("[0, 1]"));
  run.wait_resize(2);
  run.wait_continues(20);
  write_file(tmp.path / "config.toml", config("[0, 1, 2]"));
  run.wait_resize(3);
  run.wait_continues(30);
  CHECK(run.finish() == 0);
  const std::vector<long> counts = run.key_counts();
  REQUIRE(counts.size() > 150);
  // generation, start, joined (<= 3), the last decision and its reports (<= 3), early
  // reports of the next round (<= 3), a just-replaced generation's keys (<= 5).
  const long most = *std::max_element(counts.begin(), counts.end());
  MESSAGE("most store keys seen at a boundary: " << most);
  CHECK(most <= 16);  // without deleting, ~4 more per boundary: > 250 here
  run.check_reads_identical();
}

TEST_CASE("gpurun status finds a plain run (no --config)") {
  TempDir tmp;
  gpurun::testing::GoFifo stop(tmp.path / "stop");
  // Local rank 1 finishes at once; local rank 0 runs until the test releases `stop`.
  Run run(
      tmp.path, 2, std::nullopt, 0, {}, "cpu", {},
      {"/bin/sh", "-c", "[ \"$LOCAL_RANK\" = 1 ] && exit 0; read -r go < " + stop.path().string()});
  json::object root;
  run.wait_for("rank 1 EXITED in gpurun status", [&] {
    auto [rc, text] = gpurun_status(tmp.path, "--json");
    if (rc != 0) return false;
    root = json::parse(text).as_object();
    auto& slots = root["slots"].as_array();
    return slots.size() == 2 && slots[1].as_object()["state"].as_string() == "EXITED";
  });
  CHECK(root["run_id"].as_string() == "ctl-test");
  CHECK(root["elastic"].as_bool() == false);
  CHECK(root["config"].is_null());
  CHECK(root["generation"].as_int64() == 0);
  auto& slots = root["slots"].as_array();
  auto& s0 = slots[0].as_object();
  CHECK(s0["state"].as_string() == "ACTIVE");
  CHECK(s0["rank"].as_int64() == 0);
  CHECK(s0["pid"].as_int64() > 0);
  CHECK(slots[1].as_object()["rank"].as_int64() == 1);
  CHECK(slots[1].as_object()["pid"].as_int64() == -1);

  const auto table_out = gpurun_status(tmp.path, "");
  const int rc2 = table_out.first;
  const std::string& table = table_out.second;  // named: for INFO's lambda (clang 14)
  INFO(table);
  CHECK(rc2 == 0);
  CHECK(table.find("not elastic") != std::string::npos);
  CHECK(table.find("EXITED") != std::string::npos);

  stop.release();
  REQUIRE(run.wait(kHangGuard));
  CHECK(run.code() == 0);
  CHECK(gpurun_status(tmp.path, "").first == 1);  // unregistered with the run
}

TEST_CASE("gpurun status ignores and removes registrations left by a kill -9 or a reused pid") {
  TempDir tmp;
  const fs::path reg = tmp.path / "xdg" / "gpurun";
  fs::create_directories(reg);
  // A supervisor killed long ago: its pid (1, alive, but not a gpurun started then)
  // and a run directory that is gone.
  write_file(reg / "none.1", "none\n/nonexistent/gpurun-run-dir\n1\n");
  // Our own pid with the wrong start time: the pid was reused by another process.
  const fs::path rundir = tmp.path / "rundir";
  fs::create_directories(rundir);
  write_file(rundir / "status.json", "{}");
  write_file(reg / ("reused." + std::to_string(::getpid())),
             "reused\n" + rundir.string() + "\n12345\n");
  const auto text_out = gpurun_status(tmp.path, "");
  const int rc = text_out.first;
  const std::string& text = text_out.second;  // named: for INFO's lambda (clang 14)
  INFO(text);
  CHECK(rc == 1);
  CHECK(text.find("no running gpurun") != std::string::npos);
  CHECK_FALSE(fs::exists(reg / "none.1"));
  CHECK_FALSE(fs::exists(reg / ("reused." + std::to_string(::getpid()))));

  // A live run next to the stale entries is found on its own, not "2 running jobs".
  write_file(reg / "none.1", "none\n/nonexistent/gpurun-run-dir\n1\n");
  gpurun::testing::GoFifo stop(tmp.path / "stop");
  Run run(tmp.path, 1, std::nullopt, 0, {}, "cpu", {},
          {"/bin/sh", "-c", "read -r go < " + stop.path().string()});
  run.wait_for("the live run in gpurun status",
               [&] { return gpurun_status(tmp.path, "--json").first == 0; });
  stop.release();
  REQUIRE(run.wait(kHangGuard));
}

TEST_CASE("SIGHUP with an unchanged config says what is in force and logs an event") {
  TempDir tmp;
  Run run(tmp.path, 2, config("[0, 1]"));
  run.wait_resize(1);
  run.wait_continues(1);
  const auto console = [&] { return slurp(tmp.path / "gpurun.stderr"); };
  REQUIRE(::kill(run.proc.pid, SIGHUP) == 0);
  run.wait_for("the SIGHUP confirmation", [&] {
    return console().find("gpurun: config unchanged (SIGHUP): ") != std::string::npos &&
           !run.events("config_unchanged").empty();
  });
  INFO(console());
  CHECK(console().find("gpurun: received SIGHUP: reloading the config\n"
                       "gpurun: config unchanged (SIGHUP): active_gpus=[0, 1] park=release "
                       "boundary=epoch deadline_s=30 batch.global=none\n") != std::string::npos);
  auto ev = run.events("config_unchanged").front();
  CHECK(ev["trigger"].as_string() == "SIGHUP");
  CHECK(ev["path"].as_string() == (tmp.path / "config.toml").string());
  CHECK(ev["config"].as_string() ==
        "active_gpus=[0, 1] park=release boundary=epoch deadline_s=30 batch.global=none");

  // A changed file with SIGHUP: applied, said once.
  {
    std::ofstream out(tmp.path / "config.toml.new");
    out << config("[0]");
  }
  // Rename without waiting for the watcher: SIGHUP right after; either path applies it once.
  fs::rename(tmp.path / "config.toml.new", tmp.path / "config.toml");
  REQUIRE(::kill(run.proc.pid, SIGHUP) == 0);
  run.wait_resize(2);
  // A rejected file with SIGHUP: the rejection, then what stays in force.
  write_file(tmp.path / "config.toml", "active_gpus = [7]\n");
  run.wait_for("config_rejected", [&] { return !run.events("config_rejected").empty(); });
  run.wait_for("what stays in force", [&] {
    return console().find("gpurun: the config in force: active_gpus=[0] park=release") !=
           std::string::npos;
  });
  CHECK(run.finish() == 0);
}

TEST_CASE("a reloaded config with 200000 errors: 21 console lines, a short event") {
  TempDir tmp;
  Run run(tmp.path, 2, config("[0, 1]"));
  run.wait_resize(1);
  std::string flood = "active_gpus = [0";
  for (int i = 1; i < 200'000; ++i) flood += ", 0";
  flood += "]\n";
  write_file(tmp.path / "config.toml", flood);
  run.wait_for("config_rejected", [&] { return !run.events("config_rejected").empty(); });
  const std::string events = slurp(tmp.path / "events.jsonl");
  std::istringstream lines(events);
  size_t longest = 0;
  for (std::string line; std::getline(lines, line);) longest = std::max(longest, line.size());
  CHECK(longest < 8192);
  const std::string file = (tmp.path / "config.toml").string();
  const std::string err = slurp(tmp.path / "gpurun.stderr");
  CHECK(std::count(err.begin(), err.end(), '\n') < 60);
  CHECK(err.find("and 199979 more errors in " + file + " (only the first 20 are reported)") !=
        std::string::npos);
  const auto rejected = run.events("config_rejected").front();
  CHECK(std::string(rejected.at("error").as_string()).find("and 199979 more errors") !=
        std::string::npos);
  write_file(tmp.path / "config.toml", config("[0, 1]"));
  CHECK(run.finish() == 0);
}

TEST_CASE("gpurun status: two live runs with one run id are listed, and --pid picks one") {
  TempDir tmp;
  const fs::path reg = tmp.path / "xdg" / "gpurun";
  fs::create_directories(reg);
  // Two live processes (this test and its parent) registered under the same run id.
  const auto start_ticks = [](pid_t pid) {
    const std::string stat = slurp("/proc/" + std::to_string(pid) + "/stat");
    std::istringstream fields(stat.substr(stat.rfind(')') + 2));
    std::string f;
    for (int i = 3; i <= 22; ++i) fields >> f;
    return f;
  };
  const pid_t a = ::getpid(), b = ::getppid();
  for (pid_t pid : {a, b}) {
    const fs::path rundir = tmp.path / ("run" + std::to_string(pid));
    fs::create_directories(rundir);
    write_file(rundir / "status.json",
               R"({"run_id": "dup", "supervisor_pid": )" + std::to_string(pid) +
                   R"(, "run_dir": ")" + rundir.string() + R"(", "elastic": false, "slots": []})");
    write_file(reg / ("dup." + std::to_string(pid)),
               "dup\n" + rundir.string() + "\n" + start_ticks(pid) + "\n");
  }
  const auto text_out = gpurun_status(tmp.path, "--run-id dup");
  const int rc = text_out.first;
  const std::string& text = text_out.second;  // named: for INFO's lambda (clang 14)
  INFO(text);
  CHECK(rc == 1);
  CHECK(text.find("gpurun: error: 2 running gpurun jobs share the run id 'dup'; pick one with "
                  "--pid PID or --run-dir DIR:") == 0);
  for (pid_t pid : {a, b}) {
    CHECK(text.find("  pid " + std::to_string(pid) + "  run dir " +
                    (tmp.path / ("run" + std::to_string(pid))).string() + "  started 20") !=
          std::string::npos);
  }
  CHECK(text.find("pick one with --run-id") == std::string::npos);

  const auto one_out = gpurun_status(tmp.path, "--run-id dup --pid " + std::to_string(b));
  const int rc2 = one_out.first;
  const std::string& one = one_out.second;  // named: for INFO's lambda (clang 14)
  INFO(one);
  CHECK(rc2 == 0);
  CHECK(one.find("supervisor pid " + std::to_string(b)) != std::string::npos);
  auto [rc3, bypid] = gpurun_status(tmp.path, "--pid=" + std::to_string(a));
  CHECK(rc3 == 0);
  CHECK(bypid.find("supervisor pid " + std::to_string(a)) != std::string::npos);
  auto [rc4, nopid] = gpurun_status(tmp.path, "--pid 1");
  CHECK(rc4 == 1);
  CHECK(nopid.find("no running gpurun with pid 1 is registered in") != std::string::npos);
  auto [rc5, badpid] = gpurun_status(tmp.path, "--pid x");
  CHECK(rc5 == 2);
  CHECK(badpid == "gpurun: error: invalid value 'x' for --pid: expected a process id\n");
}
