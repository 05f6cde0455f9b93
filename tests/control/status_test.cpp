#include "control/status.hpp"

#include <doctest/doctest.h>

#include <boost/asio/io_context.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "commands/status_command.hpp"
#include "control/scheduler.hpp"
#include "gpurun/clock.hpp"
#include "gpurun_process.hpp"

namespace gpurun::control {
namespace {

namespace fs = std::filesystem;

TEST_CASE("write_status_file: a failed write leaves no .status.json.<pid> behind") {
  gpurun::testing::TempDir dir("gpurun-status-test");
  const fs::path tmp = dir.path / (".status.json." + std::to_string(::getpid()));

  SUBCASE("the rename fails (status.json is a non-empty directory)") {
    fs::create_directories(dir.path / "status.json" / "x");
    std::string error;
    CHECK_FALSE(write_status_file(dir.str(), "{}", error));
    CHECK(error.find("cannot rename '" + tmp.string() + "' to '") == 0);
    CHECK_FALSE(fs::exists(tmp));
  }
  SUBCASE("a good write replaces status.json and leaves no temp file") {
    std::string error;
    CHECK(write_status_file(dir.str(), R"({"a": 1})", error));
    CHECK(error.empty());
    CHECK(gpurun::testing::slurp(dir.path / "status.json") == "{\"a\": 1}\n");
    CHECK_FALSE(fs::exists(tmp));
  }
}

TEST_CASE("StatusWriter: writes at most once per min_interval, the last state last") {
  gpurun::testing::TempDir dir("gpurun-status-test");
  boost::asio::io_context io;  // the writer's io; its timer runs on the FakeClock
  gpurun::FakeClock clock;
  int renders = 0;
  StatusWriter writer(
      io, dir.str(), [&] { return "{\"n\": " + std::to_string(++renders) + "}"; }, {},
      std::chrono::milliseconds(100), &clock);
  const auto on_disk = [&] { return gpurun::testing::slurp(dir.path / "status.json"); };

  writer.publish();  // nothing written yet: at once
  CHECK(on_disk() == "{\"n\": 1}\n");
  clock.advance(std::chrono::milliseconds(40));
  for (int i = 0; i < 5; ++i) writer.publish();  // within 100 ms of the write: held back
  CHECK(renders == 1);
  clock.advance(std::chrono::milliseconds(59));
  CHECK(renders == 1);  // 99 ms after the write
  clock.advance(std::chrono::milliseconds(1));
  CHECK(renders == 2);  // 100 ms: the five publishes make one write
  CHECK(on_disk() == "{\"n\": 2}\n");
  clock.advance(std::chrono::hours(1));
  CHECK(renders == 2);  // nothing pending: no more writes

  writer.publish();  // the last write is older than 100 ms: at once again
  CHECK(renders == 3);
  writer.publish();
  writer.flush();  // writes what is pending now
  CHECK(renders == 4);
  clock.advance(std::chrono::hours(1));
  CHECK(renders == 4);  // the flush left nothing for the timer
  CHECK(on_disk() == "{\"n\": 4}\n");
}

}  // namespace
}  // namespace gpurun::control

namespace gpurun::control {
namespace {

// `gpurun status --run-dir DIR`'s stdout (`extra` arguments first); its exit code must be 0.
std::string status_text(const gpurun::testing::TempDir& dir,
                        const std::vector<std::string>& extra = {}) {
  const fs::path out = dir.path / "out.txt";
  std::fflush(stdout);
  const int saved = ::dup(1);
  const int f = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  REQUIRE(f >= 0);
  ::dup2(f, 1);
  ::close(f);
  std::vector<std::string> args = extra;
  args.insert(args.end(), {"--run-dir", dir.str()});
  const int code = gpurun::commands::status_command(args);
  std::fflush(stdout);
  ::dup2(saved, 1);
  ::close(saved);
  CHECK(code == 0);
  return gpurun::testing::slurp(out);
}

TEST_CASE("gpurun status: LAST BOUNDARY counts epochs from 1, as the console does") {
  gpurun::testing::TempDir dir("gpurun-status-test");
  std::string error;
  REQUIRE(write_status_file(
      dir.str(),
      R"({"run_id": "r", "slots": [{"gpu": 0, "state": "ACTIVE", "generation": 0, "rank": 0, )"
      R"("pid": -1, "last_boundary": {"epoch": 10, "step": 0}}, {"gpu": 1, "state": "ACTIVE", )"
      R"("generation": 0, "rank": 1, "pid": -1, "last_boundary": {"epoch": 2, "step": 500}}]})",
      error));
  const std::string text = status_text(dir);
  CHECK_MESSAGE(text.find("after epoch 11\n") != std::string::npos, text);
  CHECK(text.find("in epoch 3 after step 500\n") != std::string::npos);
}

TEST_CASE("gpurun status: each slot's GPU memory, summed per pid from nvidia-smi") {
  gpurun::testing::TempDir dir("gpurun-status-test");
  // A stand-in nvidia-smi first on PATH: two processes of pid 4242 and one of another pid.
  const fs::path smi = dir.path / "nvidia-smi";
  std::ofstream(smi) << "#!/bin/sh\necho '4242, 1000'\necho '4242, 24'\necho '77, 5'\n";
  fs::permissions(smi, fs::perms::owner_all);
  const std::string old_path = ::getenv("PATH") ? ::getenv("PATH") : "";
  ::setenv("PATH", (dir.str() + ":/usr/bin:/bin").c_str(), 1);
  std::string error;
  REQUIRE(write_status_file(
      dir.str(),
      R"({"run_id": "r", "slots": [{"gpu": 0, "state": "ACTIVE", "pid": 4242}, )"
      R"({"gpu": 1, "state": "ACTIVE", "pid": 99}, {"gpu": 2, "state": "IDLE", "pid": -1}]})",
      error));
  const std::string json = status_text(dir, {"--json"});
  // nvidia-smi failing (no driver loaded): the memory is unknown.
  std::ofstream(smi) << "#!/bin/sh\necho '4242, 1000'\nexit 9\n";
  const std::string unknown = status_text(dir, {"--json"});
  ::setenv("PATH", old_path.c_str(), 1);
  CHECK_MESSAGE(json.find(R"("pid":4242,"gpu_memory_mib":1024})") != std::string::npos, json);
  CHECK(json.find(R"("pid":99,"gpu_memory_mib":0})") != std::string::npos);
  CHECK(json.find(R"("pid":-1,"gpu_memory_mib":null})") != std::string::npos);
  CHECK_MESSAGE(unknown.find(R"("pid":4242,"gpu_memory_mib":null})") != std::string::npos, unknown);
}

TEST_CASE("gpurun status: each declared GPU the job does not train on is said with why") {
  // Before, only the GPUs min_gpus kept were listed: a lent, yielded or scale-given-back GPU
  // was in `declared` and missing from `active` with no word on why.
  gpurun::testing::TempDir dir("gpurun-status-test");
  std::string error;
  REQUIRE(write_status_file(
      dir.str(),
      R"js({"run_id": "r", "slots": [], "policy": {"declared_active": [0, 1, 2, 3], )js"
      R"js("min_gpus": 2, "leases": [], "excluded": [{"gpu": 2, "why": "yielded to pid 7 )js"
      R"js((bob)"}, {"gpu": 3, "why": "scale: 2 GPUs chosen"}], "kept": [{"gpu": 1, "why": )js"
      R"js("lent until reclaimed, kept: [policy] min_gpus = 2"}]}, "energy": {"epochs": 3, )js"
      R"js("cost_total_j": 1234567.25, "threshold_j": null}})js",
      error));
  const std::string text = status_text(dir);
  CHECK_MESSAGE(text.find("out: GPU 2: yielded to pid 7 (bob)\n") != std::string::npos, text);
  CHECK(text.find("out: GPU 3: scale: 2 GPUs chosen\n") != std::string::npos);
  CHECK(text.find("kept: GPU 1: lent until reclaimed, kept: [policy] min_gpus = 2\n") !=
        std::string::npos);
  // Numbers in fixed point (JSON would write 1.23456725E6).
  CHECK(text.find("Zeus cost so far 1234567.25 J") != std::string::npos);
}

TEST_CASE("status: a refused pause and a lost state are in the status JSON") {
  Config c;
  c.active_gpus = std::vector<int>{0};
  Scheduler s({0, 1}, c);
  s.config_loaded(c, "config.toml");
  s.start_attempt(0);
  s.take_effects();
  s.on_spawned(0, 100);
  s.on_joined(0, 0, 100);
  Config pause = c;
  pause.active_gpus = std::vector<int>{};
  s.config_loaded(pause, "config.toml");
  Report r;
  r.gpu = 0;
  r.rank = 0;
  r.generation = 0;
  r.round = 0;
  r.pid = 100;
  s.on_report(r);  // -> a `snapshot` decision
  r.round = 1;
  r.snapshot = "cannot write the state snapshot: every path failed";
  s.on_report(r);  // -> refused, continue
  const StatusSnapshot snap{};
  std::string text = render_status(s, snap);
  const bool refused =
      text.find(R"("pause_refused": "cannot write the state snapshot: every path failed")") !=
          std::string::npos ||
      text.find(R"("pause_refused":"cannot write the state snapshot: every path failed")") !=
          std::string::npos;
  CHECK(refused);
  CHECK(text.find("state_lost") != std::string::npos);
}

TEST_CASE("status: a boundary round waiting past its deadline names who is late and how long") {
  Config c;
  c.active_gpus = std::vector<int>{0, 1};
  c.boundary_deadline = std::chrono::seconds(2);
  Scheduler s({0, 1}, c);
  s.config_loaded(c, "config.toml");
  s.start_attempt(0);
  s.take_effects();
  s.on_spawned(0, 100);
  s.on_spawned(1, 101);
  s.on_joined(0, 0, 100);
  s.on_joined(0, 1, 101);
  s.stalled_probe = [](int) { return false; };  // rank 0 runs its validation
  Report r;
  r.gpu = 1;
  r.rank = 1;
  r.pid = 101;
  r.epoch = 2;
  s.on_report(r);
  CHECK(render_status(s, StatusSnapshot{}).find(R"("late_at_boundary": null)") !=
        std::string::npos);  // before the deadline: nobody is late yet
  s.on_deadline(0, 0);
  s.on_deadline(0, 0);
  s.take_effects();
  const std::string json = render_status(s, StatusSnapshot{});
  INFO(json);
  CHECK(json.find(R"("late_at_boundary": {"generation": 0, "round": 0, "boundary": {"epoch": )"
                  R"(2, "step": 0}, "late_s": 4, "deadline_s": 2, "reported": 1, "of": 2, )"
                  R"("ranks": [{"gpu": 0, "rank": 0, "pid": 100}]})") != std::string::npos);
  gpurun::testing::TempDir dir("gpurun-status-test");
  std::string error;
  REQUIRE(write_status_file(dir.str(), json, error));
  const std::string text = status_text(dir);
  CHECK_MESSAGE(text.find("late at boundary round 0 of generation 0: gpu 0 (rank 0, pid 100) for "
                          "4.0 s ([boundary] deadline_s = 2; 1 of 2 ranks reported): running the "
                          "program's own code, waited for (as DDP would)\n") != std::string::npos,
                text);
  r.gpu = 0;
  r.rank = 0;
  r.pid = 100;
  s.on_report(r);  // the round is decided: nobody is late any more
  CHECK(render_status(s, StatusSnapshot{}).find(R"("late_at_boundary": null)") !=
        std::string::npos);
}

TEST_CASE("status: what the next boundary would decide, in the JSON and as one line") {
  Config c;
  c.active_gpus = std::vector<int>{0, 1};
  c.standby = false;
  Scheduler s({0, 1, 2}, c);
  s.config_loaded(c, "config.toml");
  s.start_attempt(0);
  s.take_effects();
  s.on_spawned(0, 100);
  s.on_spawned(1, 101);
  s.on_joined(0, 0, 100);
  s.on_joined(0, 1, 101);
  s.take_effects();
  gpurun::testing::TempDir dir("gpurun-status-test");
  const auto shown = [&dir](const std::string& json) {
    std::string error;
    REQUIRE(write_status_file(dir.str(), json, error));
    return status_text(dir);
  };
  std::string json = render_status(s, StatusSnapshot{});
  CHECK_MESSAGE(json.find(R"("would_decide": {"kind": "continue", "active": [0,1], "joiners": )"
                          R"([], "leavers": [], "failed": [], "reasons": [], "summary": )"
                          R"("continue with [0, 1]"})") != std::string::npos,
                json);
  CHECK(shown(json).find("at the next boundary: continue with [0, 1]\n") != std::string::npos);
  Config grow = c;
  grow.active_gpus = std::vector<int>{0, 1, 2};
  s.config_loaded(grow, "config.toml");
  int64_t warm = -1;
  for (const Effect& e : s.take_effects())
    if (e.kind == Effect::Kind::kSpawn) warm = e.warm;
  REQUIRE(warm >= 0);
  s.on_spawned(2, 102);
  std::string text = shown(render_status(s, StatusSnapshot{}));
  CHECK_MESSAGE(text.find("at the next boundary: continue with [0, 1] (the warm joiner on gpu 2 "
                          "(pid 102) is not ready yet at the boundary ") != std::string::npos,
                text);
  s.on_ready(2, warm);
  s.take_effects();
  json = render_status(s, StatusSnapshot{});
  CHECK_MESSAGE(json.find(R"("would_decide": {"kind": "resize", "active": [0,1,2], "joiners": )"
                          R"([2], "leavers": [], "failed": [], "reasons": [], "summary": )"
                          R"js("resize to [0, 1, 2]: [2] joins (warm joiner ready)"})js") !=
                    std::string::npos,
                json);
  text = shown(json);
  CHECK_MESSAGE(text.find("at the next boundary: resize to [0, 1, 2]: [2] joins (warm joiner "
                          "ready)\n") != std::string::npos,
                text);
  // None to compute (a stop asked for; also no generation yet, paused): null, and a dash.
  s.request_stop("test");
  json = render_status(s, StatusSnapshot{});
  CHECK(json.find(R"("would_decide": null)") != std::string::npos);
  CHECK(shown(json).find("at the next boundary: \u2014\n") != std::string::npos);
}

}  // namespace
}  // namespace gpurun::control

namespace gpurun::control {
namespace {

TEST_CASE("gpurun status: every other node of an elastic job, its state, slots and offer") {
  gpurun::testing::TempDir dir("gpurun-status-test");
  std::string error;
  REQUIRE(write_status_file(
      dir.str(),
      R"({"run_id": "r", "slots": [{"gpu": 1001, "state": "ACTIVE", "generation": 2, )"
      R"("rank": 3, "pid": 77}], "nodes": [{"node": 1, "host": "b", "pid": 4001, )"
      R"("state": "live", "slots": [1000, 1001], "offer": [1000, 1001]}, {"node": 2, )"
      R"("host": "c", "pid": 4002, "state": "lost", "slots": [2000], "offer": [], )"
      R"("lost": "its gpurun sent no heartbeat for 3 s (--node-timeout 3 s): …"}]})",
      error));
  const std::string text = status_text(dir);
  CHECK_MESSAGE(text.find("other nodes (2; slot k*1000+i is node k's GPU i):\n  node 1 (b, "
                          "gpurun pid 4001): live, slots [1000, 1001], offers [1000, 1001]\n"
                          "  node 2 (c, gpurun pid 4002): lost (its gpurun sent no heartbeat "
                          "for 3 s (--node-timeout 3 s): …), slots [2000]") != std::string::npos,
                text);
  CHECK(text.find("1001 ") != std::string::npos);  // the slot table row
}

TEST_CASE("gpurun status on a node > 0: this node, node 0's store, its slots and ranks") {
  gpurun::testing::TempDir dir("gpurun-status-test");
  std::string error;
  REQUIRE(write_status_file(
      dir.str(),
      R"({"run_id": "r", "supervisor_pid": 4001, "run_dir": "/tmp/r", "elastic": true, )"
      R"("config": "/etc/c.toml", "node": {"node": 1, "node0": "hosta:29500", )"
      R"("state": "leaving", "why": "", "generation": 2, "active": [0, 1000, 1001]}, )"
      R"("slots": [{"gpu": 1000, "local_gpu": 0, "physical_gpu": null, "state": "ACTIVE", )"
      R"("generation": 2, "rank": 1, "pid": 77, "reason": ""}]})",
      error));
  const std::string text = status_text(dir);
  CHECK_MESSAGE(text.find("node 1 of an elastic job over several nodes: leaving; node 0's gpurun "
                          "(store at hosta:29500) decides for the job: `gpurun status` on node "
                          "0's host shows every node's slots and the decisions\n"
                          "generation 2 as node 0 last told this node: active [0, 1000, 1001]\n") !=
                    std::string::npos,
                text);
  CHECK(text.find("park mode") == std::string::npos);  // node 0's, not this node's
  CHECK(text.find("1000 ") != std::string::npos);      // the slot table row
}

}  // namespace
}  // namespace gpurun::control
