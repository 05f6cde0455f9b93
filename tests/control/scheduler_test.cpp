#include "control/scheduler.hpp"

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

using namespace gpurun::control;
using namespace std::chrono_literals;

namespace {

/// Without standbys (the cases below test what happens without one); standby(): with them.
Config cfg(std::optional<std::vector<int>> active, ParkMode mode = ParkMode::kRelease) {
  Config c;
  c.active_gpus = std::move(active);
  c.park_mode = mode;
  c.boundary_deadline = 2s;
  c.standby = false;
  return c;
}
Config standby(std::optional<std::vector<int>> active, ParkMode mode = ParkMode::kRelease) {
  Config c = cfg(std::move(active), mode);
  c.standby = true;
  return c;
}

/// Drives a Scheduler like the controller does, with fake pids (1000 + n).
struct Harness {
  Scheduler s;
  std::vector<Effect> log;          // every effect so far
  std::vector<Decision> decisions;  // every decision written (decision or start keys)
  std::vector<int> spawned;         // gpus spawned, in order
  std::vector<int> killed;
  std::vector<std::string> wakes;  // wake keys written
  std::set<std::string> store;     // keys present in the store (workers' writes included)
  int next_pid = 1000;
  /// A warm joiner is ready as soon as it is spawned (false: the test says when, ready()).
  bool auto_ready = true;
  std::map<int, int64_t> warm;  // gpu -> id of its last warm joiner
  std::vector<int> standbys;    // gpus a standby was spawned for, in order

  explicit Harness(Config c, int slots = 4, std::optional<std::vector<int>> launch = std::nullopt)
      : s(ids(slots), c, std::move(launch)) {
    s.config_loaded(c, "config.toml");
    s.start_attempt(0);
    drain();
  }
  static std::vector<int> ids(int n) {
    std::vector<int> v;
    for (int i = 0; i < n; ++i) v.push_back(i);
    return v;
  }
  void drain() {
    for (auto batch = s.take_effects(); !batch.empty(); batch = s.take_effects()) {
      for (auto& e : batch) {
        log.push_back(e);
        if (e.kind == Effect::Kind::kSpawn) {
          spawned.push_back(e.gpu);
          s.on_spawned(e.gpu, next_pid++);
          if (e.warm >= 0) {
            warm[e.gpu] = e.warm;
            if (e.standby)
              standbys.push_back(e.gpu);  // waits for its go key (no ready before)
            else if (auto_ready)
              s.on_ready(e.gpu, e.warm);  // a joiner that starts at once
          }
        } else if (e.kind == Effect::Kind::kKill) {
          killed.push_back(e.gpu);
        } else if (e.kind == Effect::Kind::kDeleteKey) {
          store.erase(e.key);
        } else if (e.kind == Effect::Kind::kWriteKey) {
          store.insert(e.key);
          if (e.key.find("/decision") != std::string::npos)
            decisions.push_back(Decision::from_json(e.text()));
          else if (e.key.find("/start") != std::string::npos &&
                   (decisions.empty() || decisions.back().to_json() != e.text()))
            decisions.push_back(Decision::from_json(e.text()));
          else if (e.key.find("/wake/") != std::string::npos)
            wakes.push_back(e.key);
          else if (auto go = go_of(e.key); go && auto_ready)
            s.on_ready(go->first, go->second);  // a standby told to go gets ready at once
        }
      }
    }
  }
  /// (gpu, warm id) when `key` is the go key of a standby spawned here.
  std::optional<std::pair<int, int64_t>> go_of(const std::string& key) const {
    for (const auto& [gpu, w] : warm)
      if (key == keys::go(gpu, w)) return std::make_pair(gpu, w);
    return std::nullopt;
  }
  SlotState state(int gpu) const { return s.slots().at(gpu).state; }
  /// The warm joiner of `gpu` wrote its ready key.
  void ready(int gpu) {
    store.insert(keys::ready(gpu, warm.at(gpu)));
    s.on_ready(gpu, warm.at(gpu));
    drain();
  }
  void join_all() {
    const auto active = s.active();
    for (size_t r = 0; r < active.size(); ++r) {
      const SlotState st = s.slots().at(active[r]).state;
      if (st != SlotState::kStarting && st != SlotState::kRejoining) continue;
      store.insert(keys::joined(s.generation(), static_cast<int>(r)));
      s.on_joined(s.generation(), static_cast<int>(r), s.slots().at(active[r]).pid);
    }
    drain();
  }
  void report(int gpu, int64_t epoch, const std::string& snapshot = "") {
    Report r;
    r.snapshot = snapshot;
    r.gpu = gpu;
    r.rank = s.slots().at(gpu).rank;
    r.generation = s.generation();
    r.round = s.round();
    r.epoch = epoch;
    r.pid = s.slots().at(gpu).pid;
    store.insert(keys::report(r.generation, r.round, r.rank));
    s.on_report(r);
    drain();
  }
  /// Every member reports boundary `epoch`; returns the decision made. A `snapshot` decision
  /// (a pause) is followed by the re-reports, the source giving `snapshot_outcome`, and the
  /// decision after them is returned; with an empty outcome the `snapshot` one is.
  Decision boundary(int64_t epoch, const std::string& snapshot_outcome = "ok") {
    const size_t before = decisions.size();
    for (int gpu : s.active()) report(gpu, epoch);
    REQUIRE(decisions.size() == before + 1);
    if (decisions.back().kind == Decision::Kind::kSnapshot && !snapshot_outcome.empty()) {
      const int src = decisions.back().state_source.gpu;
      for (int gpu : s.active()) report(gpu, epoch, gpu == src ? snapshot_outcome : "");
      REQUIRE(decisions.size() == before + 2);
    }
    return decisions.back();
  }
  size_t events(const std::string& name) const {
    size_t n = 0;
    for (auto& e : log) n += e.kind == Effect::Kind::kEvent && e.key == name;
    return n;
  }
};

}  // namespace

TEST_CASE("scheduler: start spawns the desired slots only; an unchanged plan continues") {
  Harness h(cfg(std::vector<int>{0, 2}));
  CHECK(h.spawned == std::vector<int>{0, 2});
  CHECK(h.state(0) == SlotState::kStarting);
  CHECK(h.state(1) == SlotState::kParked);
  REQUIRE(h.decisions.size() == 1);
  CHECK(h.decisions[0].kind == Decision::Kind::kStart);
  CHECK(h.decisions[0].state_source.is_none());
  h.join_all();
  CHECK(h.state(2) == SlotState::kActive);
  Decision d = h.boundary(0);
  CHECK(d.kind == Decision::Kind::kContinue);
  CHECK(d.generation == 0);
  CHECK(d.round == 0);
  CHECK(h.s.round() == 1);
  d = h.boundary(1);
  CHECK(d.round == 1);
  CHECK(h.events("decision") == 3);
}

TEST_CASE("scheduler: decisions for shrink, grow, swap, pause and resume") {
  struct Row {
    std::vector<int> to;
    std::vector<int> joiners, leavers;
    int source_rank, source_gpu;
  };
  // From [0,1,2,3], release mode, one change per boundary.
  const std::vector<Row> table = {
      {{0, 1}, {}, {2, 3}, 0, 0},        // shrink 4 -> 2
      {{0, 1, 2, 3}, {2, 3}, {}, 0, 0},  // grow 2 -> 4
      {{2, 3}, {}, {0, 1}, 2, 2},        // shrink keeping 2,3: source = old rank of gpu 2
      {{0, 1}, {0, 1}, {2, 3}, 0, 2},    // swap: the lowest leaver (rank 0 = gpu 2) hands off
  };
  Harness h(cfg(std::nullopt));
  h.join_all();
  int64_t epoch = 0;
  for (const Row& row : table) {
    CAPTURE(join_ids(row.to));
    h.s.config_loaded(cfg(row.to), "config.toml");
    h.drain();
    const int64_t g = h.s.generation();
    Decision d = h.boundary(epoch++);
    CHECK(d.kind == Decision::Kind::kResize);
    CHECK(d.generation == g + 1);
    CHECK(d.prev_generation == g);
    CHECK(d.active == row.to);
    CHECK(d.joiners == row.joiners);
    CHECK(d.leavers == row.leavers);
    CHECK(d.state_source == StateSource::peer(row.source_rank, row.source_gpu));
    for (int gpu : row.leavers) {
      CHECK(h.state(gpu) == SlotState::kOffloading);
      CHECK(h.s.on_process_exit(gpu, true, "exit code 0", false));  // release: parked
      h.drain();
      CHECK(h.state(gpu) == SlotState::kParked);
    }
    for (int gpu : row.joiners) CHECK(h.state(gpu) == SlotState::kRejoining);
    h.join_all();
    for (int gpu : row.to) CHECK(h.state(gpu) == SlotState::kActive);
    CHECK(h.boundary(epoch++).kind == Decision::Kind::kContinue);
  }
}

TEST_CASE("scheduler: a paused hold-mode job whose parked processes die still resumes") {
  Harness h(cfg(std::vector<int>{0, 1}, ParkMode::kHold), 2);
  h.join_all();
  h.s.config_loaded(cfg(std::vector<int>{}, ParkMode::kHold), "c");
  h.drain();
  Decision d = h.boundary(0);  // the pause: its snapshot written, both leave
  REQUIRE(d.active.empty());
  for (int gpu : {0, 1}) h.s.on_parked(gpu, d.generation);
  h.drain();
  REQUIRE(h.s.holds_job_open());
  // Both parked processes are killed: the pause snapshot still holds the state.
  for (int gpu : {0, 1}) CHECK(h.s.on_process_exit(gpu, false, "signal SIGKILL (9)", false));
  h.drain();
  CHECK(h.state(0) == SlotState::kParked);
  CHECK(h.state(1) == SlotState::kParked);
  CHECK(h.s.state_lost().empty());
  const size_t spawned = h.spawned.size();
  h.s.config_loaded(cfg(std::vector<int>{0, 1}, ParkMode::kHold), "c");
  h.drain();
  CHECK(h.spawned.size() == spawned + 2);  // started anew; they load the pause snapshot
  CHECK(h.decisions.back().active == std::vector<int>{0, 1});
}

TEST_CASE("scheduler: release leavers park on exit 0, joiners respawn, pause holds the job") {
  Harness h(cfg(std::nullopt));
  h.join_all();
  h.s.config_loaded(cfg(std::vector<int>{0, 1}), "c");
  h.drain();
  Decision d = h.boundary(0);
  CHECK(d.leavers == std::vector<int>{2, 3});
  CHECK(h.s.on_process_exit(2, true, "exit code 0", false));
  CHECK(h.s.on_process_exit(3, true, "exit code 0", false));
  h.drain();
  CHECK(h.state(2) == SlotState::kParked);
  CHECK(h.s.slots().at(2).pid == -1);

  h.s.config_loaded(cfg(std::vector<int>{0, 1, 2, 3}), "c");
  h.drain();
  d = h.boundary(1);
  CHECK(d.joiners == std::vector<int>{2, 3});
  CHECK(h.spawned == std::vector<int>{0, 1, 2, 3, 2, 3});
  CHECK(h.state(3) == SlotState::kRejoining);
  h.join_all();
  CHECK(h.state(3) == SlotState::kActive);

  // Pause: everybody leaves, the job stays open with no process.
  h.s.config_loaded(cfg(std::vector<int>{}), "c");
  h.drain();
  d = h.boundary(2);
  CHECK(d.active.empty());
  CHECK(d.state_source.is_snapshot());  // written and verified by rank 0 in the round before
  CHECK(h.decisions[h.decisions.size() - 2].kind == Decision::Kind::kSnapshot);
  CHECK(h.decisions[h.decisions.size() - 2].state_source == StateSource::peer(0, 0));
  for (int gpu : {0, 1, 2, 3}) CHECK(h.s.on_process_exit(gpu, true, "exit code 0", false));
  h.drain();
  CHECK(h.s.holds_job_open());
  // Resume at once (no boundary), from the snapshot.
  const int64_t g = h.s.generation();
  h.s.config_loaded(cfg(std::vector<int>{1}), "c");
  h.drain();
  CHECK_FALSE(h.s.holds_job_open());
  CHECK(h.decisions.back().generation == g + 1);
  CHECK(h.decisions.back().round == -1);
  CHECK(h.decisions.back().state_source.is_snapshot());
  CHECK(h.decisions.back().epoch == 2);
  CHECK(h.spawned.back() == 1);
}

TEST_CASE("scheduler: a joiner whose old process is still exiting is warmed after it exits") {
  Harness h(cfg(std::nullopt));
  h.join_all();
  h.s.config_loaded(cfg(std::vector<int>{0}), "c");
  h.drain();
  h.boundary(0);
  h.s.config_loaded(cfg(std::vector<int>{0, 1}), "c");
  h.drain();
  const size_t spawns = h.spawned.size();
  Decision d = h.boundary(1);  // gpu 1 has not exited yet: nobody waits for it
  CHECK(d.kind == Decision::Kind::kContinue);
  CHECK(h.spawned.size() == spawns);
  CHECK(h.s.on_process_exit(1, true, "exit code 0", false));
  h.drain();
  CHECK(h.spawned.size() == spawns + 1);  // a warm joiner, ready at once (the harness)
  CHECK(h.state(1) == SlotState::kWarming);
  d = h.boundary(2);
  CHECK(d.joiners == std::vector<int>{1});
  CHECK(h.state(1) == SlotState::kRejoining);
}

TEST_CASE("scheduler: hold mode parks and wakes through the wake key, exit wakes at the end") {
  Harness h(cfg(std::nullopt, ParkMode::kHold), 2);
  h.join_all();
  h.s.config_loaded(cfg(std::vector<int>{0}, ParkMode::kHold), "c");
  h.drain();
  Decision d = h.boundary(0);
  CHECK(d.park_mode == ParkMode::kHold);
  h.s.on_parked(1, d.generation);
  h.drain();
  CHECK(h.state(1) == SlotState::kParked);
  h.s.config_loaded(cfg(std::vector<int>{0, 1}, ParkMode::kHold), "c");
  h.drain();
  d = h.boundary(1);
  CHECK(h.spawned == std::vector<int>{0, 1});  // no respawn
  REQUIRE(h.wakes.size() == 1);
  CHECK(h.wakes[0] == keys::wake(1, d.generation - 1));
  h.join_all();
  h.s.config_loaded(cfg(std::vector<int>{0}, ParkMode::kHold), "c");
  h.drain();
  d = h.boundary(2);
  h.s.on_parked(1, d.generation);
  // Training finishes on gpu 0: the parked process is told to exit.
  CHECK_FALSE(h.s.on_process_exit(0, true, "exit code 0", false));
  h.drain();
  CHECK(h.s.finished());
  REQUIRE(h.wakes.size() == 2);
  CHECK(h.wakes[1] == keys::wake(1, d.generation));
}

TEST_CASE("scheduler: a member that dies of the program's own error fails the job") {
  // Issue 25 item 9: a crash or a kill is a lost rank the job goes on without; an exception
  // the program raised (said by its worker just before it exits) is the job's failure.
  Harness h(cfg(std::nullopt));
  h.join_all();
  const int pid = h.s.slots().at(1).pid;
  h.s.on_program_error(1, pid + 7, "ValueError: not this process");  // a stale pid: ignored
  h.s.on_program_error(1, pid, "ValueError: bad batch");
  CHECK_FALSE(h.s.on_process_exit(1, false, "exit code 1", false));  // not absorbed: fails
  h.drain();
  bool said = false;
  for (const Effect& e : h.log)
    said |=
        e.kind == Effect::Kind::kSay &&
        e.value.find("after the program's own error: ValueError: bad batch") != std::string::npos;
  CHECK(said);
  // Without the error key the same exit is a death the job goes on without.
  CHECK(h.s.on_process_exit(2, false, "exit code 1", false));
}

TEST_CASE("scheduler: a multi-line program error keeps its lines, bounded, the real error last") {
  // Issue 44: a DataLoader worker's error (its traceback inside the message) was pasted into
  // one console line and cut at 500 characters mid-path, before the real error.
  Harness h(cfg(std::nullopt));
  h.join_all();
  const int pid = h.s.slots().at(1).pid;
  std::string text =
      "ValueError: Caught ValueError in DataLoader worker process 0.\nOriginal "
      "Traceback (most recent call last):";
  for (int i = 0; i < 60; ++i)
    text += "\n  File \"/usr/lib/python3/dist-packages/torch/utils/data/_utils/fetch" +
            std::to_string(i) + ".py\", line 58, in fetch";
  text += "\nValueError: sample 17 has no label";
  h.s.on_program_error(1, pid, text);
  CHECK_FALSE(h.s.on_process_exit(1, false, "exit code 1", false));
  h.drain();
  std::string said;
  for (const Effect& e : h.log)
    if (e.kind == Effect::Kind::kSay && e.value.find("program's own error") != std::string::npos)
      said = e.value;
  INFO(said);
  CHECK(said.find("after the program's own error (below); the job fails") != std::string::npos);
  CHECK(said.find("\ngpurun:   gpu 1 | ValueError: Caught ValueError in DataLoader worker "
                  "process 0.\n") != std::string::npos);
  CHECK(said.find("\ngpurun:   gpu 1 | [... ") != std::string::npos);
  const std::string last = "\ngpurun:   gpu 1 | ValueError: sample 17 has no label";
  CHECK(said.size() > last.size());
  CHECK(said.substr(said.size() - last.size()) == last);
  std::size_t lines = 1;
  for (const char c : said) lines += c == '\n';
  CHECK(lines == 1 + 40);
  // A KeyboardInterrupt with no message is its name alone (the worker sends "KeyboardInterrupt").
  const int pid2 = h.s.slots().at(2).pid;
  h.s.on_program_error(2, pid2, "KeyboardInterrupt");
  CHECK_FALSE(h.s.on_process_exit(2, false, "signal SIGINT (2)", false));
  h.drain();
  bool clean = false;
  for (const Effect& e : h.log)
    clean |= e.kind == Effect::Kind::kSay &&
             e.value.find("after the program's own error: KeyboardInterrupt; the job fails") !=
                 std::string::npos;
  CHECK(clean);
}

TEST_CASE("scheduler: death and stall mid-boundary; the decision is made without them") {
  Harness h(cfg(std::nullopt));
  h.join_all();
  // gpu 3 dies after 0..2 reported: the round completes without it.
  h.report(0, 0);
  h.report(1, 0);
  h.report(2, 0);
  CHECK(h.decisions.size() == 1);
  CHECK(h.s.on_process_exit(3, false, "signal SIGKILL (9)", false));
  h.drain();
  REQUIRE(h.decisions.size() == 2);
  Decision d = h.decisions.back();
  CHECK(d.active == std::vector<int>{0, 1, 2});
  CHECK(d.failed == std::vector<int>{3});
  CHECK(h.state(3) == SlotState::kFailed);

  // gpu 1 stalls, stopped (SIGSTOP): the deadline declares it FAILED, kills it, decides
  // without it.
  const int stopped_pid = h.s.slots().at(1).pid;
  h.s.stalled_probe = [&](int pid) { return pid == stopped_pid; };
  h.report(0, 1);
  h.report(2, 1);
  CHECK(h.decisions.size() == 2);
  h.s.on_deadline(h.s.generation(), h.s.round());
  h.drain();
  CHECK(h.killed == std::vector<int>{1});
  REQUIRE(h.decisions.size() == 3);
  CHECK(h.decisions.back().active == std::vector<int>{0, 2});
  CHECK(h.decisions.back().failed == std::vector<int>{1});
  // A late report of the stalled worker and a stale deadline change nothing.
  Report late{1, 1, h.s.generation() - 1, 0, 1, 0, 1001, 0, true, ""};
  h.s.on_report(late);
  h.s.on_deadline(h.s.generation() - 1, 0);
  h.drain();
  CHECK(h.decisions.size() == 3);
  // Its exit (SIGKILL) is absorbed.
  CHECK(h.s.on_process_exit(1, false, "signal SIGKILL (9)", false));
}

TEST_CASE("scheduler: a member's death is said as 'ended with <how>', like the supervisor's") {
  Harness h(cfg(std::nullopt));
  h.join_all();
  CHECK(h.s.on_process_exit(3, false, "signal SIGKILL (9)", false));
  h.drain();
  std::string said;
  for (const Effect& e : h.log)
    if (e.kind == Effect::Kind::kSay && e.value.find("gpu 3 (") == 0) said = e.value;
  CHECK_MESSAGE(said.find("gpu 3 (rank 3 of generation 0, pid ") == 0, said);
  CHECK_MESSAGE(
      said.find(") ended with signal SIGKILL (9); the job goes on without it") != std::string::npos,
      said);
}

TEST_CASE("scheduler: with restarts left a member's death is the supervisor's (not absorbed)") {
  Harness h(cfg(std::nullopt));
  h.join_all();
  CHECK_FALSE(h.s.on_process_exit(1, false, "exit code 7", true));
  // A worker that never joined (no protocol) is never absorbed.
  Harness g(cfg(std::nullopt));
  CHECK_FALSE(g.s.on_process_exit(0, false, "exit code 7", false));
  CHECK(g.state(0) == SlotState::kFailed);
}

TEST_CASE("scheduler: a rejected config keeps the last good one") {
  Harness h(cfg(std::vector<int>{0, 1}));
  h.join_all();
  h.s.config_rejected("config.toml", "config.toml:1:15: active_gpus: 9 is out of range");
  h.drain();
  CHECK(h.events("config_rejected") == 1);
  CHECK(h.s.last_config_error().find("out of range") != std::string::npos);
  CHECK(h.boundary(0).kind == Decision::Kind::kContinue);
  h.s.config_loaded(cfg(std::vector<int>{0}), "config.toml");
  CHECK(h.s.last_config_error().empty());
}

TEST_CASE("scheduler: without active_gpus the launch set trains; the other slots can join") {
  Harness h(cfg(std::nullopt), 4, std::vector<int>{0, 1});
  CHECK(h.spawned == std::vector<int>{0, 1});
  CHECK(h.s.desired() == std::vector<int>{0, 1});
  CHECK(h.state(3) == SlotState::kParked);
  h.join_all();
  CHECK(h.boundary(0).kind == Decision::Kind::kContinue);
  h.s.config_loaded(cfg(std::vector<int>{0, 1, 2, 3}), "c");
  h.drain();
  Decision d = h.boundary(1);
  CHECK(d.joiners == std::vector<int>{2, 3});
  CHECK(h.spawned == std::vector<int>{0, 1, 2, 3});  // never launched: spawned
  // Back to "absent": the launch set again.
  h.join_all();
  h.s.config_loaded(cfg(std::nullopt), "c");
  h.drain();
  CHECK(h.boundary(2).leavers == std::vector<int>{2, 3});
}

TEST_CASE("scheduler: a member's exit 0 while peers wait answers the round with exit") {
  Harness h(cfg(std::nullopt), 3);
  h.join_all();
  h.boundary(0);
  h.report(0, 1);
  h.report(2, 1);
  // gpu 1 finished training instead of reporting.
  CHECK_FALSE(h.s.on_process_exit(1, true, "exit code 0", false));
  h.drain();
  CHECK(h.s.finished());
  CHECK(h.state(1) == SlotState::kExited);
  REQUIRE(h.decisions.back().kind == Decision::Kind::kExit);
  CHECK(h.store.count(keys::decision(0, 1)) == 1);
  CHECK(h.events("decision") == 3);  // start, continue, exit
  // Peers exit 0: the job ends, no more decisions.
  CHECK_FALSE(h.s.on_process_exit(0, true, "exit code 0", false));
  CHECK_FALSE(h.s.on_process_exit(2, true, "exit code 0", false));
  h.drain();
  CHECK(h.events("decision") == 3);  // start, continue, exit

  // The finisher exits before anybody reported: later reports get the exit decision.
  Harness g(cfg(std::nullopt), 3);
  g.join_all();
  CHECK_FALSE(g.s.on_process_exit(2, true, "exit code 0", false));
  g.drain();
  const size_t before = g.decisions.size();
  g.report(0, 0);
  REQUIRE(g.decisions.size() == before + 1);
  CHECK(g.decisions.back().kind == Decision::Kind::kExit);
  g.report(1, 0);  // the same key, written once
  CHECK(g.decisions.size() == before + 1);
}

TEST_CASE("scheduler: round and generation keys are deleted once nobody reads them") {
  Harness h(cfg(std::nullopt, ParkMode::kHold), 4);
  h.join_all();
  size_t most = 0;
  int64_t epoch = 0;
  const std::vector<std::vector<int>> plans = {{0, 1}, {0, 1, 2, 3}, {2, 3}, {0, 1, 2, 3}, {}};
  for (const auto& plan : plans) {
    for (int i = 0; i < 20; ++i) {
      h.boundary(epoch++);
      most = std::max(most, h.store.size());
    }
    h.s.config_loaded(cfg(plan, ParkMode::kHold), "c");
    h.drain();
    Decision d = h.boundary(epoch++);
    for (int gpu : d.leavers) h.s.on_parked(gpu, d.generation);
    h.drain();
    h.join_all();
    most = std::max(most, h.store.size());
  }
  // Paused: every process parked; resume, train, and check what is left.
  h.s.config_loaded(cfg(std::vector<int>{1, 2}, ParkMode::kHold), "c");
  h.drain();
  h.join_all();
  for (int i = 0; i < 5; ++i) h.boundary(epoch++);
  // 4 workers: generation, start, joined x4, decision + reports x4 (+ parked/wake keys).
  CHECK(most <= 16);
  const std::string g = "gpurun/gen/" + std::to_string(h.s.generation()) + "/";
  for (const auto& key : h.store) {
    CAPTURE(key);
    const bool current = key.rfind(g, 0) == 0;
    CHECK((current || key == "gpurun/generation" || key.rfind("gpurun/slot/", 0) == 0));
  }
  // What remains of the current generation: its start, its joined keys, the last round.
  CHECK(h.store.count(keys::start(h.s.generation())) == 1);
  CHECK(h.store.count(keys::decision(h.s.generation(), h.s.round() - 1)) == 1);
  CHECK(h.store.count(keys::decision(h.s.generation(), h.s.round() - 2)) == 0);
}

TEST_CASE(
    "scheduler: on_boundary sees each complete round once, before the decision; a reason "
    "stops the job there") {
  Harness h(cfg(std::vector<int>{0, 1}));
  h.join_all();
  std::vector<BoundaryInfo> seen;
  std::optional<std::string> answer;
  h.s.on_boundary = [&](const BoundaryInfo& b) {
    seen.push_back(b);
    return answer;
  };
  // Epoch 0 ends: the hook runs once (after the second report), the round continues.
  h.report(0, 0);
  CHECK(seen.empty());
  h.report(1, 0);
  REQUIRE(seen.size() == 1);
  CHECK(seen[0].generation == 0);
  CHECK(seen[0].round == 0);
  CHECK(seen[0].epoch == 0);
  CHECK(seen[0].active == std::vector<int>{0, 1});
  CHECK(h.decisions.back().kind == Decision::Kind::kContinue);
  CHECK(h.s.stop_reason().empty());
  // Epoch 1 ends and the hook answers with a reason: the round is answered with exit.
  answer = "the predicted cost passes the threshold";
  const Decision stop = h.boundary(1);
  CHECK(seen.size() == 2);
  CHECK(stop.kind == Decision::Kind::kExit);
  CHECK(h.s.finished());
  CHECK(h.s.stop_reason() == "the predicted cost passes the threshold");
  // Said with epochs counted from 1, as the workers print them ("epoch 2/3"): epoch 1 from 0.
  bool said = false;
  for (const Effect& e : h.log)
    said = said || (e.kind == Effect::Kind::kSay &&
                    e.value ==
                        "stopping the job at the boundary after epoch 2: the predicted "
                        "cost passes the threshold");
  CHECK(said);
  // The members' clean exits are the end of a finished job, not failures.
  CHECK_FALSE(h.s.on_process_exit(0, true, "exit code 0", true));
  CHECK(h.s.slots().at(0).state == SlotState::kExited);
}

// ---- failures during a resize (docs/control-protocol.md#failures-during-a-resize) ----------

namespace {
void report_stateless(Harness& h, int gpu, int64_t epoch) {
  Report r;
  r.gpu = gpu;
  r.rank = h.s.slots().at(gpu).rank;
  r.generation = h.s.generation();
  r.round = h.s.round();
  r.epoch = epoch;
  r.pid = h.s.slots().at(gpu).pid;
  r.has_state = false;
  h.s.on_report(r);
  h.drain();
}

// Every slot of `gpus` joins, a config edit pauses the job at boundary 0 and every process
// exits (release mode): the job stays open with no process.
void pause_and_release(Harness& h, const std::vector<int>& gpus) {
  h.join_all();
  h.s.config_loaded(cfg(std::vector<int>{}), "c");
  h.drain();
  CHECK(h.boundary(0).active.empty());
  for (int gpu : gpus) CHECK(h.s.on_process_exit(gpu, true, "exit code 0", false));
  h.drain();
  REQUIRE(h.s.holds_job_open());
}
}  // namespace

TEST_CASE("scheduler: a joiner dies during the set-up: the abort key, then a decision without it") {
  Harness h(cfg(std::vector<int>{0}), 3);
  h.join_all();
  h.s.config_loaded(cfg(std::vector<int>{0, 1}), "c");
  h.drain();
  Decision d = h.boundary(0);
  REQUIRE(d.joiners == std::vector<int>{1});
  CHECK_FALSE(h.store.count(keys::abort(1)));
  CHECK(h.s.on_process_exit(1, false, "signal SIGKILL (9)", false));
  h.drain();
  // The continuing rank is blocked in generation 1's rendezvous: the key releases it.
  CHECK(h.store.count(keys::abort(1)));
  CHECK(h.events("generation_abandoned") == 1);
  CHECK(h.s.state_lost().empty());
  // It reports again in generation 1 (recover()), and gpurun decides without gpu 1.
  h.report(0, 0);
  d = h.decisions.back();
  CHECK(d.generation == 2);
  CHECK(d.active == std::vector<int>{0});
  CHECK(d.failed == std::vector<int>{1});
  CHECK(d.state_source == StateSource::peer(0, 0));
  h.boundary(1);  // generation 2 trains; generation 1's keys, the abort key included, go
  CHECK_FALSE(h.store.count(keys::abort(1)));
}

TEST_CASE("scheduler: a death after every member's set-up record is no set-up failure") {
  Harness h(cfg(std::vector<int>{0}), 3);
  h.join_all();
  h.s.config_loaded(cfg(std::vector<int>{0, 1}), "c");
  h.drain();
  Decision d = h.boundary(0);
  REQUIRE(d.joiners == std::vector<int>{1});
  h.join_all();  // the joiner's joined key
  // Both ranks finished the set-up and train (their resize records arrived).
  h.s.on_setup_done(d.generation, 0);
  h.s.on_setup_done(d.generation, 1);
  CHECK(h.s.on_process_exit(0, false, "signal SIGKILL (9)", false));
  h.drain();
  CHECK_FALSE(h.store.count(keys::abort(d.generation)));  // nobody waits in a set-up
  CHECK(h.events("generation_abandoned") == 0);
  CHECK(h.s.state_lost().empty());  // the joiner holds the state now
  h.report(1, 0);
  CHECK(h.decisions.back().failed == std::vector<int>{0});
}

TEST_CASE(
    "scheduler: the only state holder dies during the set-up: the state is lost, no restart") {
  Harness h(cfg(std::vector<int>{0}), 3);
  h.join_all();
  h.s.config_loaded(cfg(std::vector<int>{0, 1}), "c");
  h.drain();
  h.boundary(0);
  CHECK(h.s.on_process_exit(0, false, "signal SIGKILL (9)", false));
  h.drain();
  CHECK(h.store.count(keys::abort(1)));  // the joiner stops waiting for it
  CHECK(h.s.finished());
  CHECK(h.s.state_lost().find("the training state is lost: gpu 0 (rank 0 of generation 1") == 0);
  CHECK(h.events("state_lost") == 1);
  // The joiner reports without state and is told to exit: nothing trains from scratch.
  const size_t spawned = h.spawned.size();
  report_stateless(h, 1, 0);
  CHECK(h.decisions.back().kind == Decision::Kind::kExit);
  CHECK(h.spawned.size() == spawned);
}

TEST_CASE("scheduler: an abandoned joiner stays stateless, joins again or leaves") {
  Harness h(cfg(std::vector<int>{0}), 4);
  h.join_all();
  h.s.config_loaded(cfg(std::vector<int>{0, 1, 2}), "c");
  h.drain();
  h.boundary(0);
  const size_t spawned = h.spawned.size();
  CHECK(h.s.on_process_exit(1, false, "exit code 1", false));
  h.drain();
  h.report(0, 0);
  report_stateless(h, 2, 0);
  CHECK(h.state(2) == SlotState::kRejoining);  // a report without state is no join
  Decision d = h.decisions.back();
  CHECK(d.generation == 2);
  CHECK(d.active == std::vector<int>{0, 2});
  CHECK(d.joiners == std::vector<int>{2});  // again, from rank 0 (gpu 0): never from gpu 2
  CHECK(d.state_source == StateSource::peer(0, 0));
  CHECK(h.spawned.size() == spawned);  // it reads the decision itself: no respawn, no wake

  // gpu 3 joins and dies; in the next decision gpu 2 (now a holder) is left out: it leaves.
  h.s.config_loaded(cfg(std::vector<int>{0, 2, 3}), "c");
  h.drain();
  h.join_all();
  d = h.boundary(1);
  REQUIRE(d.joiners == std::vector<int>{3});
  CHECK(h.s.on_process_exit(3, false, "exit code 1", false));
  h.drain();
  CHECK(h.store.count(keys::abort(3)));
  h.s.config_loaded(cfg(std::vector<int>{0}), "c");
  h.drain();
  h.report(0, 1);
  h.report(2, 1);  // gpu 2 completed its join in generation 2: it holds the state now
  d = h.decisions.back();
  CHECK(d.active == std::vector<int>{0});
  CHECK(d.leavers == std::vector<int>{2});
}

TEST_CASE("scheduler: a joiner whose set-up keeps failing is given up after a bound") {
  Harness h(cfg(std::vector<int>{0}), 2);
  h.join_all();
  h.s.config_loaded(cfg(std::vector<int>{0, 1}), "c");
  h.drain();
  REQUIRE(h.boundary(0).joiners == std::vector<int>{1});
  // Each set-up fails at once (e.g. it cannot reach a peer): the holder reports again, the
  // joiner reports without the state, gpurun decides the same grow again ...
  for (int i = 1; i < Scheduler::kMaxFailedJoins; ++i) {
    CAPTURE(i);
    h.report(0, 0);
    report_stateless(h, 1, 0);
    const Decision& d = h.decisions.back();
    CHECK(d.active == std::vector<int>{0, 1});
    CHECK(d.joiners == std::vector<int>{1});
    CHECK(h.state(1) == SlotState::kRejoining);
  }
  // ... until the bound: killed, FAILED, and the job goes on without it.
  const int64_t g = h.s.generation();
  h.report(0, 0);
  report_stateless(h, 1, 0);
  CHECK(h.state(1) == SlotState::kFailed);
  CHECK(h.killed == std::vector<int>{1});
  const Decision& d = h.decisions.back();
  CHECK(d.generation == g + 1);
  CHECK(d.active == std::vector<int>{0});
  CHECK(d.failed == std::vector<int>{1});
  bool said = false;
  for (const auto& e : h.log)
    said = said || (e.kind == Effect::Kind::kSay &&
                    e.value.find("could not join in 5 generations in a row") != std::string::npos);
  CHECK(said);
}

TEST_CASE("scheduler: a joiner dies while a resume loads the pause snapshot: load it again") {
  Harness h(cfg(std::vector<int>{0, 1}), 3);
  h.join_all();
  h.s.config_loaded(cfg(std::vector<int>{}), "c");
  h.drain();
  h.boundary(0);  // pause: rank 0 writes the snapshot
  for (int gpu : {0, 1}) CHECK(h.s.on_process_exit(gpu, true, "exit code 0", false));
  h.s.config_loaded(cfg(std::vector<int>{1, 2}), "c");
  h.drain();
  REQUIRE(h.decisions.back().state_source.is_snapshot());
  CHECK(h.s.on_process_exit(1, false, "signal SIGKILL (9)", false));
  h.drain();
  CHECK(h.s.state_lost().empty());  // the snapshot still holds this position
  report_stateless(h, 2, 0);
  const Decision d = h.decisions.back();
  CHECK(d.kind == Decision::Kind::kResize);
  CHECK(d.active == std::vector<int>{2});
  CHECK(d.state_source.is_snapshot());

  // Once training moved past the snapshot's position, a lone holder's death loses the state.
  h.join_all();
  h.boundary(1);
  h.s.config_loaded(cfg(std::vector<int>{0, 2}), "c");
  h.drain();
  h.boundary(2);
  CHECK(h.s.on_process_exit(2, false, "signal SIGKILL (9)", false));
  h.drain();
  CHECK_FALSE(h.s.state_lost().empty());
}

TEST_CASE("scheduler: a pause writes the snapshot first; a failed one refuses the pause") {
  Harness h(cfg(std::vector<int>{0, 1}), 2);
  h.join_all();
  h.boundary(0);
  h.s.config_loaded(cfg(std::vector<int>{}), "c");
  h.drain();
  // The snapshot round: nobody leaves, gpu 0 writes, everyone reports this boundary again.
  Decision d = h.boundary(1, /*snapshot_outcome=*/"");
  CHECK(d.kind == Decision::Kind::kSnapshot);
  CHECK(d.active == std::vector<int>{0, 1});
  CHECK(d.state_source == StateSource::peer(0, 0));
  CHECK(h.state(0) == SlotState::kActive);
  CHECK(h.state(1) == SlotState::kActive);
  const int64_t g = h.s.generation();
  // gpu 0 could not write it anywhere: no pause; training goes on in the same generation.
  h.report(0, 1,
           "cannot write the state snapshot (…): every path failed: (1) '/dev/shm/x': "
           "No space left on device; (2) 'run/state.snapshot': No space left on device");
  h.report(1, 1);
  d = h.decisions.back();
  CHECK(d.kind == Decision::Kind::kContinue);
  CHECK(d.generation == g);
  CHECK(h.events("pause_refused") == 1);
  // Tried again at the next boundary; failing the same way, it is not said again ...
  CHECK(h.boundary(2, "").kind == Decision::Kind::kSnapshot);
  h.report(0, 2,
           "cannot write the state snapshot (…): every path failed: (1) '/dev/shm/x': "
           "No space left on device; (2) 'run/state.snapshot': No space left on device");
  h.report(1, 2);
  CHECK(h.decisions.back().kind == Decision::Kind::kContinue);
  CHECK(h.events("pause_refused") == 1);
  // ... and once there is room, the pause happens.
  d = h.boundary(3);
  CHECK(d.kind == Decision::Kind::kResize);
  CHECK(d.active.empty());
  CHECK(d.state_source.is_snapshot());
  CHECK(d.epoch == 3);
}

TEST_CASE("scheduler: a joiner that only joined holds no state: its source's death loses it") {
  // Joined = read its start record, before the handoff: taking it as a source would train on
  // its random initialisation silently.
  Harness h(cfg(std::vector<int>{0}), 3);
  h.join_all();
  h.s.config_loaded(cfg(std::vector<int>{0, 1}), "c");
  h.drain();
  h.boundary(0);
  h.join_all();  // gpu 1 wrote its joined key: ACTIVE, still without state
  CHECK(h.state(1) == SlotState::kActive);
  CHECK_FALSE(h.s.slots().at(1).holds_state);
  CHECK(h.killed.empty());
  CHECK(h.s.on_process_exit(0, false, "signal SIGKILL (9)", false));
  h.drain();
  CHECK_FALSE(h.s.state_lost().empty());
  // It holds nothing and may be blocked in its communicator's connect to the dead source
  // (until GPURUN_COMM_TIMEOUT_MS): it is ended at once.
  CHECK(h.killed == std::vector<int>{1});
  // Its report without state (its set-up was abandoned) gets `exit`, never a resize from it.
  report_stateless(h, 1, 0);
  CHECK(h.decisions.back().kind == Decision::Kind::kExit);
}

TEST_CASE("scheduler: a joiner that reported after its handoff holds the state") {
  Harness h(cfg(std::vector<int>{0}), 3);
  h.join_all();
  h.s.config_loaded(cfg(std::vector<int>{0, 1}), "c");
  h.drain();
  h.boundary(0);
  h.join_all();
  h.boundary(1);  // both report in generation 1: gpu 1 is past its handoff
  CHECK(h.s.slots().at(1).holds_state);
  CHECK(h.s.on_process_exit(0, false, "signal SIGKILL (9)", false));
  h.drain();
  CHECK(h.s.state_lost().empty());
  h.report(1, 1);
  CHECK(h.decisions.back().state_source == StateSource::peer(1, 1));
}

TEST_CASE("scheduler: a warm joiner is spawned at the edit, not waited for, admitted once ready") {
  Harness h(cfg(std::vector<int>{0, 1}));
  h.auto_ready = false;
  h.join_all();
  CHECK(h.boundary(0).kind == Decision::Kind::kContinue);
  h.s.config_loaded(cfg(std::vector<int>{0, 1, 2}), "c");
  h.drain();
  // Spawned at once, before any boundary: WARMING, with a warm id and no generation.
  REQUIRE(h.spawned == std::vector<int>{0, 1, 2});
  CHECK(h.state(2) == SlotState::kWarming);
  CHECK(h.s.slots().at(2).warm_id >= 0);
  // Not ready: the members' boundaries are answered without waiting for it, twice.
  CHECK(h.boundary(1).kind == Decision::Kind::kContinue);
  CHECK(h.boundary(2).kind == Decision::Kind::kContinue);
  CHECK(h.state(2) == SlotState::kWarming);
  CHECK(h.events("warm_ready") == 0);
  h.ready(2);
  CHECK(h.events("warm_ready") == 1);
  CHECK(h.state(2) == SlotState::kWarming);  // ready: waits for the next boundary
  const Decision d = h.boundary(3);
  CHECK(d.kind == Decision::Kind::kResize);
  CHECK(d.joiners == std::vector<int>{2});
  CHECK(d.active == std::vector<int>{0, 1, 2});
  CHECK(h.state(2) == SlotState::kRejoining);
  CHECK(h.spawned == std::vector<int>{0, 1, 2});  // admitted, not spawned again
  const int64_t w = h.warm.at(2);
  CHECK(h.store.count(keys::admit(2, w)) == 1);
  h.join_all();
  CHECK(h.state(2) == SlotState::kActive);
  CHECK(h.store.count(keys::admit(2, w)) == 0);  // read: deleted with the ready key
  CHECK(h.store.count(keys::ready(2, w)) == 0);
  CHECK(h.boundary(4).kind == Decision::Kind::kContinue);
}

TEST_CASE("scheduler: a swap to warming slots trains on the old set until they are ready") {
  Harness h(cfg(std::vector<int>{0, 1}));
  h.auto_ready = false;
  h.join_all();
  h.s.config_loaded(cfg(std::vector<int>{2, 3}), "c");
  h.drain();
  CHECK(h.boundary(0).kind == Decision::Kind::kContinue);  // not a pause
  h.ready(3);
  Decision d = h.boundary(1);
  CHECK(d.active == std::vector<int>{3});
  CHECK(d.leavers == std::vector<int>{0, 1});
  CHECK(h.state(2) == SlotState::kWarming);
}

TEST_CASE("scheduler: a warming joiner that dies, is removed by an edit, or outlives the job") {
  Harness h(cfg(std::vector<int>{0, 1}));
  h.auto_ready = false;
  h.join_all();
  // Dies while warming (even with restarts left): dropped, nobody stops.
  h.s.config_loaded(cfg(std::vector<int>{0, 1, 2, 3}), "c");
  h.drain();
  REQUIRE(h.state(2) == SlotState::kWarming);
  CHECK(h.s.on_process_exit(2, false, "signal SIGKILL (9)", /*can_restart=*/true));
  h.drain();
  CHECK(h.state(2) == SlotState::kFailed);
  CHECK(h.events("generation_abandoned") == 0);
  CHECK(h.boundary(0).kind == Decision::Kind::kContinue);
  // Removed by an edit before it was ready: killed, PARKED; its exit is no failure.
  h.s.config_loaded(cfg(std::vector<int>{0, 1}), "c");
  h.drain();
  CHECK(h.killed == std::vector<int>{3});
  CHECK(h.state(3) == SlotState::kParked);
  CHECK(h.s.on_process_exit(3, false, "signal SIGKILL (9)", true));
  h.drain();
  CHECK(h.state(3) == SlotState::kParked);
  CHECK(h.boundary(1).kind == Decision::Kind::kContinue);
  // Named again: a new warm joiner (gpu 2 stays out: FAILED for this attempt).
  h.s.config_loaded(cfg(std::vector<int>{0, 1, 2, 3}), "c");
  h.drain();
  CHECK(h.spawned == std::vector<int>{0, 1, 2, 3, 3});
  CHECK(h.state(3) == SlotState::kWarming);
  // The job finishes while it warms: it is ended (killed), the job does not wait for it.
  CHECK_FALSE(h.s.on_process_exit(0, true, "exit code 0", false));
  h.drain();
  CHECK(h.killed == std::vector<int>{3, 3});
  CHECK(h.state(3) == SlotState::kParked);
}

TEST_CASE("scheduler: a resume from a pause is decided once its warm joiners are ready") {
  Harness h(cfg(std::vector<int>{0, 1}));
  h.auto_ready = false;
  pause_and_release(h, {0, 1});
  const size_t decided = h.decisions.size();
  h.s.config_loaded(cfg(std::vector<int>{0, 1}), "c");
  h.drain();
  CHECK(h.spawned == std::vector<int>{0, 1, 0, 1});  // both at once, warm
  CHECK(h.state(0) == SlotState::kWarming);
  CHECK(h.decisions.size() == decided);  // no generation before they are ready
  h.ready(1);
  CHECK(h.decisions.size() == decided);
  CHECK(h.s.holds_job_open());
  h.ready(0);
  REQUIRE(h.decisions.size() == decided + 1);
  CHECK(h.decisions.back().joiners == std::vector<int>{0, 1});
  CHECK(h.decisions.back().state_source.is_snapshot());
  CHECK(h.state(0) == SlotState::kRejoining);
  CHECK_FALSE(h.s.holds_job_open());
}

TEST_CASE(
    "scheduler: paused, the last usable slot's warm joiner dies: the job ends, it does not hang") {
  Harness h(cfg(std::vector<int>{0, 1}), /*slots=*/2);
  h.auto_ready = false;
  pause_and_release(h, {0, 1});
  h.s.config_loaded(cfg(std::vector<int>{0, 1}), "c");
  h.drain();
  REQUIRE(h.state(0) == SlotState::kWarming);
  REQUIRE(h.state(1) == SlotState::kWarming);
  // One dies: the other can still resume the job (it is dropped, the job waits for the other).
  CHECK(h.s.on_process_exit(0, false, "signal SIGKILL (9)", true));
  h.drain();
  CHECK(h.state(0) == SlotState::kFailed);
  CHECK(h.events("state_lost") == 0);
  CHECK(h.s.holds_job_open());
  // The last one dies too: nothing can ever resume it — the job ends (was: paused forever,
  // after "the job goes on without it").
  CHECK(h.s.on_process_exit(1, false, "signal SIGKILL (9)", true));
  h.drain();
  CHECK(h.events("state_lost") == 1);
  CHECK_FALSE(h.s.holds_job_open());
  bool said = false;
  for (const Effect& e : h.log)
    said =
        said || (e.kind == Effect::Kind::kSay &&
                 e.value.find("no slot is left to resume the paused job on") != std::string::npos);
  CHECK(said);
}

namespace {
/// Whether any console line (kSay) so far contains `text`.
bool said(const Harness& h, const std::string& text) {
  for (const Effect& e : h.log)
    if (e.kind == Effect::Kind::kSay && e.value.find(text) != std::string::npos) return true;
  return false;
}
}  // namespace

TEST_CASE("scheduler: a pause's leaver killed after the snapshot loses nothing; the slot resumes") {
  // Issue 25 item 2: the slot became FAILED with nothing said, `[0]` was then silently ignored
  // (paused for good) and `[0, 1]` resumed on [1] only.
  for (const std::vector<int>& resume : {std::vector<int>{0}, std::vector<int>{0, 1}}) {
    CAPTURE(resume.size());
    Harness h(cfg(std::vector<int>{0, 1}), /*slots=*/2);
    h.join_all();
    h.s.config_loaded(cfg(std::vector<int>{}), "c");
    h.drain();
    REQUIRE(h.boundary(0).active.empty());  // the snapshot was written and verified
    // gpu 0 (the snapshot's writer) is killed while it exits; gpu 1 leaves normally.
    CHECK(h.s.on_process_exit(0, false, "signal SIGKILL (9)", /*can_restart=*/false));
    CHECK(h.s.on_process_exit(1, true, "exit code 0", false));
    h.drain();
    CHECK(h.state(0) == SlotState::kParked);
    CHECK(h.s.state_lost().empty());
    CHECK(h.s.holds_job_open());
    CHECK(said(
        h,
        "leaving gpu 0 (pid 1000) ended with signal SIGKILL (9) while it left: nothing is lost "
        "(the pause snapshot holds the training state (after epoch 1))"));
    const size_t spawns = h.spawned.size();
    h.s.config_loaded(cfg(resume), "c");
    h.drain();
    CHECK(h.spawned.size() == spawns + resume.size());  // warm joiners, gpu 0 included
    CHECK_FALSE(h.s.holds_job_open());
    const Decision& d = h.decisions.back();
    CHECK(d.kind == Decision::Kind::kResize);
    CHECK(d.active == resume);
    CHECK(d.state_source.is_snapshot());
    CHECK(h.state(0) == SlotState::kRejoining);
  }
}

TEST_CASE("scheduler: a config naming a failed slot says it stays out, also while paused") {
  Harness h(cfg(std::vector<int>{0, 1}), /*slots=*/2);
  h.join_all();
  h.s.config_loaded(cfg(std::vector<int>{}), "c");
  h.drain();
  REQUIRE(h.boundary(0).active.empty());
  CHECK(h.s.on_process_exit(0, true, "exit code 0", false));
  CHECK(h.s.on_process_exit(1, true, "exit code 0", false));
  h.drain();
  h.auto_ready = false;
  h.s.config_loaded(cfg(std::vector<int>{0}), "c");
  h.drain();
  REQUIRE(h.state(0) == SlotState::kWarming);
  CHECK(h.s.on_process_exit(0, false, "exit code 3", false));  // dies in its start-up
  h.drain();
  REQUIRE(h.state(0) == SlotState::kFailed);
  h.s.config_loaded(cfg(std::vector<int>{}), "c");
  h.drain();
  h.s.config_loaded(cfg(std::vector<int>{0}), "c");
  h.drain();
  CHECK(h.s.holds_job_open());
  CHECK(said(h,
             "the config names [0], but gpu 0 (warm joiner ended before it was admitted: exit "
             "code 3) failed in this attempt: a failed slot is not started again before a "
             "restart; the job stays paused (name another slot to resume)"));
}

TEST_CASE("scheduler: a warm joiner not ready at a boundary is said once; the end is no failure") {
  // Issue 25 item 4: a stalled warm joiner was invisible until the job's end.
  Harness h(cfg(std::vector<int>{0}), /*slots=*/2);
  h.auto_ready = false;
  h.join_all();
  h.s.config_loaded(cfg(std::vector<int>{0, 1}), "c");
  h.drain();
  REQUIRE(h.state(1) == SlotState::kWarming);
  const int pid = h.s.slots().at(1).pid;
  CHECK_FALSE(said(h, "is not ready yet"));
  CHECK(h.boundary(0).kind == Decision::Kind::kContinue);
  const std::string late = "the warm joiner on gpu 1 (pid " + std::to_string(pid) +
                           ") is not ready yet at the boundary after epoch 1: training goes on "
                           "without it";
  CHECK(said(h, late));
  CHECK(h.boundary(1).kind == Decision::Kind::kContinue);
  size_t n = 0;
  for (const Effect& e : h.log)
    n += e.kind == Effect::Kind::kSay && e.value.find("is not ready yet") != std::string::npos;
  CHECK(n == 1);
  // The job finishes: the joiner is ended; its SIGKILL leaves the slot PARKED (no failure).
  CHECK_FALSE(h.s.on_process_exit(0, true, "exit code 0", false));
  h.drain();
  CHECK(h.killed == std::vector<int>{1});
  CHECK(h.s.on_process_exit(1, false, "signal SIGKILL (9)", false));
  h.drain();
  CHECK(h.state(1) == SlotState::kParked);
}

TEST_CASE("scheduler: a joiner not ready keeps a leaving member while min_gpus needs it") {
  // Seen in CI (ASan): lend 1-2 with min_gpus = 2 kept GPU 1; reclaim 2 made the target
  // [0, 2], but GPU 2's warm joiner was not ready at the boundary, so GPU 1 left alone and
  // the job trained on [0]: below min_gpus until the joiner came.
  for (const int min_gpus : {0, 2}) {
    CAPTURE(min_gpus);
    Config c = cfg(std::vector<int>{0, 1});
    c.policy.min_gpus = min_gpus;
    Harness h(c, /*slots=*/3);
    h.join_all();
    h.auto_ready = false;
    c.active_gpus = std::vector<int>{0, 2};
    h.s.config_loaded(c, "c");
    h.drain();
    REQUIRE(h.state(2) == SlotState::kWarming);
    const Decision d = h.boundary(0);
    if (min_gpus == 0) {  // no floor: the members never wait for a start-up
      CHECK(d.active == std::vector<int>{0});
      CHECK(d.leavers == std::vector<int>{1});
      continue;
    }
    CHECK(d.kind == Decision::Kind::kContinue);
    CHECK(said(h,
               "gpu 1 stays in the job until the joiners of [2] are ready: [policy] "
               "min_gpus = 2"));
    CHECK(h.boundary(1).kind == Decision::Kind::kContinue);
    size_t n = 0;
    for (const Effect& e : h.log)
      n += e.kind == Effect::Kind::kSay && e.value.find("stays in the job") != std::string::npos;
    CHECK(n == 1);
    h.ready(2);
    const Decision swap = h.boundary(2);
    CHECK(swap.active == std::vector<int>{0, 2});
    CHECK(swap.joiners == std::vector<int>{2});
    CHECK(swap.leavers == std::vector<int>{1});
  }
}

TEST_CASE("scheduler: a resume edit while the pause's release leavers still exit loses nothing") {
  // Issue 25 (seen in CI on a loaded machine): a resume edit that came while released leavers
  // were still exiting named a slot whose process was still there; it waited as a member
  // without a process, the other leaver's exit then read as every member gone: "the training
  // state is lost", and exit 0. The delay is injected as the order of events: the edit comes
  // first, the leavers' exits after it (and after the warm joiners are ready).
  struct Order {
    const char* name;
    std::vector<int> resume;
  };
  for (const Order& o : {Order{"the leavers themselves", {0, 1}}, Order{"one leaver", {1, 2}},
                         Order{"no leaver", {2}}}) {
    CAPTURE(o.name);
    Harness h(cfg(std::vector<int>{0, 1}), /*slots=*/3);
    h.auto_ready = false;
    h.join_all();
    h.s.config_loaded(cfg(std::vector<int>{}), "c");
    h.drain();
    REQUIRE(h.boundary(0).active.empty());
    REQUIRE(h.state(0) == SlotState::kOffloading);  // both still exiting
    const size_t decided = h.decisions.size();
    h.s.config_loaded(cfg(o.resume), "c");
    h.drain();
    auto check_members = [&] {  // every member of a decided generation has a process coming
      for (int gpu : h.s.active()) {
        CAPTURE(gpu);
        CHECK(h.state(gpu) == SlotState::kRejoining);
        CHECK(h.s.slots().at(gpu).pid >= 0);
      }
    };
    if (o.resume == std::vector<int>{2}) {
      h.ready(2);
      REQUIRE(h.decisions.size() == decided + 1);  // nobody waits for the leavers
      check_members();
    } else {
      if (o.resume.front() == 1) h.ready(2);
      CHECK(h.decisions.size() == decided);  // a slot of it is still exiting
    }
    CHECK(h.s.on_process_exit(0, true, "exit code 0", false));
    h.drain();
    if (o.resume.front() == 0) h.ready(0);
    CHECK(h.s.on_process_exit(1, true, "exit code 0", false));
    h.drain();
    CHECK(h.s.state_lost().empty());
    if (o.resume != std::vector<int>{2}) {
      CHECK(h.decisions.size() == decided);
      h.ready(1);
    }
    REQUIRE(h.decisions.size() == decided + 1);
    const Decision& d = h.decisions.back();
    CHECK(d.active == o.resume);
    CHECK(d.state_source.is_snapshot());
    check_members();
    h.join_all();
    CHECK(h.boundary(1).kind == Decision::Kind::kContinue);
    CHECK(h.s.state_lost().empty());
    CHECK(h.events("state_lost") == 0);
  }
}

// ---- standbys ([park] standby, docs/control-protocol.md#standby) ----------------------------

namespace {
/// Config `c` takes effect at boundary `epoch` (a shrink); its release leavers `gone` exit 0.
void shrink_and_release(Harness& h, const Config& c, int64_t epoch, const std::vector<int>& gone) {
  h.s.config_loaded(c, "c");
  h.drain();
  h.boundary(epoch);
  for (int gpu : gone) CHECK(h.s.on_process_exit(gpu, true, "exit code 0", false));
  h.drain();
}
}  // namespace

TEST_CASE("scheduler: a release leaver's exit starts a standby; a grow tells it to go") {
  Harness h(standby(std::vector<int>{0, 1, 2}));
  h.auto_ready = false;
  h.join_all();
  h.s.config_loaded(standby(std::vector<int>{0, 1}), "c");
  h.drain();
  CHECK(h.boundary(0).leavers == std::vector<int>{2});
  CHECK(h.standbys.empty());  // not while its process still runs
  CHECK(h.s.on_process_exit(2, true, "exit code 0", false));
  h.drain();
  REQUIRE(h.standbys == std::vector<int>{2});
  CHECK(h.state(2) == SlotState::kStandby);
  CHECK(h.s.slots().at(2).pid >= 0);
  const int64_t w = h.warm.at(2);
  CHECK(h.store.count(keys::go(2, w)) == 0);
  // Not wanted: the members train on without it, boundary after boundary.
  CHECK(h.boundary(1).kind == Decision::Kind::kContinue);
  CHECK(h.state(2) == SlotState::kStandby);
  // A grow names it: go, WARMING; nothing is spawned; admitted once ready.
  h.s.config_loaded(standby(std::vector<int>{0, 1, 2}), "c");
  h.drain();
  CHECK(h.state(2) == SlotState::kWarming);
  CHECK(h.store.count(keys::go(2, w)) == 1);
  CHECK(h.spawned == std::vector<int>{0, 1, 2, 2});
  CHECK(h.boundary(2).kind == Decision::Kind::kContinue);  // not ready yet: not waited for
  h.ready(2);
  const Decision d = h.boundary(3);
  CHECK(d.joiners == std::vector<int>{2});
  CHECK(d.active == std::vector<int>{0, 1, 2});
  h.join_all();
  CHECK(h.state(2) == SlotState::kActive);
  CHECK(h.store.count(keys::go(2, w)) == 0);  // read: deleted with its ready and admit keys
  CHECK(h.spawned == std::vector<int>{0, 1, 2, 2});
}

TEST_CASE("scheduler: a pause's leavers get standbys; the resume tells them to go") {
  Harness h(standby(std::vector<int>{0, 1}));
  h.join_all();
  h.s.config_loaded(standby(std::vector<int>{}), "c");
  h.drain();
  CHECK(h.boundary(0).active.empty());
  for (int gpu : {0, 1}) CHECK(h.s.on_process_exit(gpu, true, "exit code 0", false));
  h.drain();
  CHECK(h.standbys == std::vector<int>{0, 1});
  CHECK(h.s.holds_job_open());  // still paused: a standby is no member
  const size_t decided = h.decisions.size();
  h.s.config_loaded(standby(std::vector<int>{0, 1}), "c");
  h.drain();  // go to both; they get ready at once (auto_ready): the resume is decided
  REQUIRE(h.decisions.size() == decided + 1);
  CHECK(h.decisions.back().joiners == std::vector<int>{0, 1});
  CHECK(h.decisions.back().state_source.is_snapshot());
  CHECK(h.spawned == std::vector<int>{0, 1, 0, 1});  // no process spawned by the resume
}

TEST_CASE("scheduler: no standby in hold mode, with standby = false, or for a crashed leaver") {
  for (const Config& c :
       {cfg(std::vector<int>{0}), standby(std::vector<int>{0}, ParkMode::kHold)}) {
    Harness h(c.park_mode == ParkMode::kHold ? standby(std::vector<int>{0, 1}, ParkMode::kHold)
                                             : cfg(std::vector<int>{0, 1}));
    h.join_all();
    h.s.config_loaded(c, "c");
    h.drain();
    h.boundary(0);
    if (c.park_mode == ParkMode::kRelease) {
      CHECK(h.s.on_process_exit(1, true, "exit code 0", false));
      h.drain();
    }
    CHECK(h.standbys.empty());
  }
}

TEST_CASE("scheduler: a standby that dies is no failure and is not started again") {
  Harness h(standby(std::vector<int>{0, 1}));
  h.join_all();
  shrink_and_release(h, standby(std::vector<int>{0}), 0, {1});
  REQUIRE(h.state(1) == SlotState::kStandby);
  CHECK(h.s.on_process_exit(1, false, "signal SIGKILL (9)", /*can_restart=*/true));
  h.drain();
  CHECK(h.state(1) == SlotState::kParked);   // not FAILED: a config may name it again
  CHECK(h.standbys == std::vector<int>{1});  // and no new standby
  CHECK(h.boundary(1).kind == Decision::Kind::kContinue);
  // Named again: a warm joiner as without standbys; leaving again: still none.
  h.s.config_loaded(standby(std::vector<int>{0, 1}), "c");
  h.drain();
  CHECK(h.state(1) == SlotState::kWarming);
  CHECK(h.boundary(2).joiners == std::vector<int>{1});
  h.join_all();
  shrink_and_release(h, standby(std::vector<int>{0}), 3, {1});
  CHECK(h.standbys == std::vector<int>{1});
  CHECK(h.state(1) == SlotState::kParked);
}

TEST_CASE("scheduler: standbys end with the job, or when a config turns them off") {
  Harness h(standby(std::vector<int>{0, 1, 2}));
  h.join_all();
  shrink_and_release(h, standby(std::vector<int>{0}), 0, {1, 2});
  REQUIRE(h.standbys == std::vector<int>{1, 2});
  // `[park] standby = false`: ended (killed); its exit is no failure.
  Config off = standby(std::vector<int>{0});
  off.standby = false;
  h.s.config_loaded(off, "c");
  h.drain();
  CHECK(h.killed == std::vector<int>{1, 2});
  CHECK(h.state(1) == SlotState::kParked);
  CHECK(h.s.on_process_exit(1, false, "signal SIGKILL (9)", true));
  h.drain();
  CHECK(h.state(1) == SlotState::kParked);
  CHECK(h.standbys == std::vector<int>{1, 2});  // none started again while off
  // On again, then the job finishes: the standby is ended, the job does not wait for it.
  h.s.config_loaded(standby(std::vector<int>{0}), "c");
  h.drain();
  CHECK(h.standbys == std::vector<int>{1, 2, 1});  // gpu 1's slot gets one again (2 still exits)
  CHECK(h.s.on_process_exit(2, false, "signal SIGKILL (9)", true));
  h.drain();
  CHECK(h.standbys == std::vector<int>{1, 2, 1, 2});
  CHECK_FALSE(h.s.on_process_exit(0, true, "exit code 0", false));
  h.drain();
  CHECK(h.killed == std::vector<int>{1, 2, 1, 2});
  CHECK(h.state(1) == SlotState::kParked);
}

// ---- the set-up deadline ([boundary] setup_deadline_s; issue 25 item 11) --------------------

TEST_CASE("scheduler: a participant stalled in a resize's set-up is killed at its deadline") {
  Config c = cfg(std::vector<int>{0, 1});
  c.setup_deadline = 7s;
  Harness h(c, 3);
  h.join_all();
  CHECK(h.boundary(0).kind == Decision::Kind::kContinue);
  c.active_gpus = std::vector<int>{0, 1, 2};
  h.s.config_loaded(c, "c");
  h.drain();
  const Decision d = h.boundary(1);
  REQUIRE(d.kind == Decision::Kind::kResize);
  // The decision armed the generation's set-up deadline.
  const auto armed = std::find_if(h.log.begin(), h.log.end(), [&](const Effect& e) {
    return e.kind == Effect::Kind::kArmDeadline && e.generation == d.generation &&
           e.round == Scheduler::kSetUpRound;
  });
  REQUIRE(armed != h.log.end());
  CHECK(armed->deadline == 7s);
  h.join_all();
  const int stopped_pid = h.s.slots().at(1).pid;
  h.s.stalled_probe = [&](int pid) { return pid == stopped_pid; };
  // gpu 0 and the joiner finished (their timing records); gpu 1 is stopped in the set-up.
  h.s.on_setup_done(d.generation, 0);
  h.s.on_setup_done(d.generation, 2);
  h.s.on_deadline(d.generation - 1, Scheduler::kSetUpRound);  // an older generation's: nothing
  h.drain();
  CHECK(h.killed.empty());
  h.s.on_deadline(d.generation, Scheduler::kSetUpRound);
  h.drain();
  CHECK(h.killed == std::vector<int>{1});
  CHECK(h.state(1) == SlotState::kFailed);
  CHECK(h.state(0) == SlotState::kActive);
  // Its death releases the others' set-up waits (the abort key) and the job goes on.
  CHECK(h.s.on_process_exit(1, false, "signal SIGKILL (9)", false));
  h.drain();
  CHECK(h.store.count(keys::abort(d.generation)) == 1);
  const Decision after = h.boundary(2);
  CHECK(after.active == std::vector<int>{0, 2});
  CHECK(after.failed == std::vector<int>{1});
  // Expired again (a late timer): nobody else is killed.
  h.s.on_deadline(d.generation, Scheduler::kSetUpRound);
  h.drain();
  CHECK(h.killed == std::vector<int>{1});
  // The job lost a rank to a deadline: its final line says so (issue 43 item 4).
  CHECK(h.s.final_line(0).find("note: 1 rank was killed at a deadline") != std::string::npos);
  CHECK(h.s.final_line(0).find(fmt::format("gpu 1 (pid {}, stopped in the set-up of generation {} "
                                           "for more than 7000 ms",
                                           stopped_pid, d.generation)) != std::string::npos);
}

TEST_CASE("scheduler: a report in the new generation is a finished set-up too") {
  Config c = cfg(std::vector<int>{0, 1});
  Harness h(c, 3);
  h.join_all();
  c.active_gpus = std::vector<int>{0, 1, 2};
  h.s.config_loaded(c, "c");
  h.drain();
  const Decision d = h.boundary(0);
  REQUIRE(d.kind == Decision::Kind::kResize);
  h.join_all();
  for (int gpu : d.active) h.report(gpu, 1);  // no timing record seen: the reports count
  h.s.on_deadline(d.generation, Scheduler::kSetUpRound);
  h.drain();
  CHECK(h.killed.empty());
}

TEST_CASE(
    "scheduler: at the set-up deadline only a stopped participant is killed, never the state") {
  Config c = cfg(std::vector<int>{0, 1});
  Harness h(c, 3);
  h.join_all();
  c.active_gpus = std::vector<int>{0, 1, 2};
  h.s.config_loaded(c, "c");
  h.drain();
  Decision d = h.boundary(0);
  REQUIRE(d.kind == Decision::Kind::kResize);
  h.join_all();
  // Nobody is stopped: the ones still in the set-up wait for each other; nobody is killed.
  h.s.stalled_probe = [](int) { return false; };
  h.s.on_deadline(d.generation, Scheduler::kSetUpRound);
  h.drain();
  CHECK(h.killed.empty());
  CHECK(h.state(0) == SlotState::kActive);

  // The only holder of the state is stopped in a shrink's set-up: not killed (it would lose it).
  Harness one(cfg(std::vector<int>{0, 1}), 2);
  one.join_all();
  one.s.config_loaded(cfg(std::vector<int>{0}), "c");
  one.drain();
  d = one.boundary(0);
  REQUIRE(d.kind == Decision::Kind::kResize);
  REQUIRE(one.s.on_process_exit(1, true, "exit code 0", false));
  one.drain();
  one.s.stalled_probe = [](int) { return true; };
  one.s.on_deadline(d.generation, Scheduler::kSetUpRound);
  one.drain();
  CHECK(one.killed.empty());
  CHECK(one.state(0) != SlotState::kFailed);
}

// ---- busy is not stalled: a late rank that runs is waited for (issue 43 item 4) -----------

namespace {
std::vector<std::string> said(const Harness& h, size_t from = 0) {
  std::vector<std::string> out;
  for (size_t i = from; i < h.log.size(); ++i)
    if (h.log[i].kind == Effect::Kind::kSay) out.push_back(h.log[i].value);
  return out;
}
std::vector<std::chrono::milliseconds> armed(const Harness& h, size_t from = 0) {
  std::vector<std::chrono::milliseconds> out;
  for (size_t i = from; i < h.log.size(); ++i)
    if (h.log[i].kind == Effect::Kind::kArmDeadline && h.log[i].round >= 0)
      out.push_back(h.log[i].deadline);
  return out;
}
}  // namespace

TEST_CASE(
    "scheduler: a running late rank is waited for past 3x the deadline, named, then decided") {
  Harness h(cfg(std::nullopt));  // 4 slots, deadline_s = 2
  h.join_all();
  h.s.stalled_probe = [](int) { return false; };  // every process runs (none is stopped)
  const size_t decided = h.decisions.size();
  // Rank 0 validates (the program's own code) while the others wait at the boundary.
  h.report(1, 0);
  h.report(2, 0);
  h.report(3, 0);
  size_t mark = h.log.size();
  CHECK(armed(h) == std::vector<std::chrono::milliseconds>{2s});
  const int64_t g = h.s.generation(), round = h.s.round();
  for (int expiry = 1; expiry <= 4; ++expiry) {  // 2, 4, 6, 8 s after the first report
    h.s.on_deadline(g, round);
    h.drain();
    CHECK(h.killed.empty());
    CHECK(h.state(0) == SlotState::kActive);
    CHECK(h.decisions.size() == decided);
    // Said again at every expiry, and armed again for one more deadline_s (no busy loop).
    const auto lines = said(h, mark);
    REQUIRE(lines.size() == 1);
    CHECK(armed(h, mark) == std::vector<std::chrono::milliseconds>{2s});
    INFO(lines[0]);
    CHECK(lines[0].find(fmt::format("gpu 0 (rank 0, pid 1000) has not reached boundary round {} "
                                    "of generation {} after {}.0 s ([boundary] deadline_s = 2; 3 "
                                    "of 4 ranks reported; the others wait at the boundary after "
                                    "epoch 1): it is running the program's own code (not "
                                    "stopped); waiting for it, as DDP would",
                                    round, g, 2 * expiry)) == 0);
    mark = h.log.size();
  }
  const std::optional<BoundaryWait> w = h.s.boundary_wait();
  REQUIRE(w);
  CHECK(w->waited == 8s);
  CHECK(w->reported == 3);
  CHECK(w->of == 4);
  REQUIRE(w->late.size() == 1);
  CHECK(w->late[0].gpu == 0);
  CHECK(w->late[0].pid == 1000);
  // Its report completes the round: the same four ranks continue.
  h.report(0, 0);
  REQUIRE(h.decisions.size() == decided + 1);
  CHECK(h.decisions.back().kind == Decision::Kind::kContinue);
  CHECK(h.decisions.back().active == std::vector<int>{0, 1, 2, 3});
  CHECK_FALSE(h.s.boundary_wait());
  // The round's timer, if it still fires, does nothing: no line, no new timer.
  mark = h.log.size();
  h.s.on_deadline(g, round);
  h.drain();
  CHECK(said(h, mark).empty());
  CHECK(armed(h, mark).empty());
  CHECK(h.s.final_line(0).empty());
}

TEST_CASE("scheduler: a stopped late rank is killed at the deadline; a running one waited for") {
  Harness h(cfg(std::nullopt));
  h.join_all();
  const int stopped_pid = h.s.slots().at(2).pid;
  h.s.stalled_probe = [&](int pid) { return pid == stopped_pid; };  // gpu 2: SIGSTOP
  h.report(1, 0);
  h.report(3, 0);
  const size_t decided = h.decisions.size();
  size_t mark = h.log.size();
  h.s.on_deadline(h.s.generation(), h.s.round());
  h.drain();
  CHECK(h.killed == std::vector<int>{2});
  CHECK(h.state(2) == SlotState::kFailed);
  CHECK(h.s.slots().at(2).reason.find("stalled past the boundary deadline") != std::string::npos);
  CHECK(h.state(0) == SlotState::kActive);
  CHECK(h.decisions.size() == decided);  // gpu 0 still runs: waited for
  const auto lines = said(h, mark);
  REQUIRE(lines.size() == 2);
  CHECK(lines[0].find("gpu 2 (rank 2, pid 1002) did not reach boundary round 0") == 0);
  CHECK(lines[0].find("is stopped (SIGSTOP or a debugger): killing it") != std::string::npos);
  CHECK(lines[1].find("gpu 0 (rank 0, pid 1000) has not reached boundary round 0") == 0);
  CHECK(armed(h, mark) == std::vector<std::chrono::milliseconds>{2s});
  h.report(0, 0);
  REQUIRE(h.decisions.size() == decided + 1);
  CHECK(h.decisions.back().active == std::vector<int>{0, 1, 3});
  CHECK(h.decisions.back().failed == std::vector<int>{2});
  // The job that lost it says so in its final line, whatever its exit status.
  CHECK(h.s.final_line(0) ==
        std::string("finished (exit 0); note: 1 rank was killed at a deadline ([boundary] "
                    "deadline_s or setup_deadline_s; the job went on without it): gpu 2 (rank 2 "
                    "of generation 0, pid 1002, stopped at boundary round 0 after 2000 ms)"));
}

TEST_CASE("scheduler: a round waiting past a tiny deadline says it again at most once a second") {
  Config c = cfg(std::nullopt);
  c.boundary_deadline = 10ms;
  Harness h(c, 2);
  h.join_all();
  h.s.stalled_probe = [](int) { return false; };
  h.report(1, 0);
  CHECK(armed(h) == std::vector<std::chrono::milliseconds>{10ms});
  const size_t mark = h.log.size();
  h.s.on_deadline(h.s.generation(), h.s.round());
  h.drain();
  CHECK(armed(h, mark) == std::vector<std::chrono::milliseconds>{Scheduler::kLateRepeatFloor});
  h.s.on_deadline(h.s.generation(), h.s.round());
  h.drain();
  const auto lines = said(h, mark);
  REQUIRE(lines.size() == 2);
  CHECK(lines[1].find("after 1.0 s ([boundary] deadline_s = 0.01;") != std::string::npos);
  REQUIRE(h.s.boundary_wait());
  CHECK(h.s.boundary_wait()->waited == 1010ms);
  CHECK(h.killed.empty());
}

TEST_CASE("scheduler: an exit reason of an earlier attempt is not a later exit wake's") {
  Harness h(cfg(std::vector<int>{0, 1}, ParkMode::kHold), 2);
  h.join_all();
  // Attempt 0: rank 1 ends its program cleanly (reason "finished"), rank 0 then crashes with
  // restarts left: attempt 1 starts.
  CHECK_FALSE(h.s.on_process_exit(1, true, "exit code 0", true));
  h.drain();
  CHECK_FALSE(h.s.on_process_exit(0, false, "exit code 1", true));
  h.drain();
  h.s.start_attempt(1);
  h.drain();
  h.join_all();
  CHECK_FALSE(h.s.finished());
  // Attempt 1: gpu 1 leaves in hold mode and parks; then [park] mode becomes release, and the
  // parked process is woken to exit, a wake whose reason is unknown (docs/control-protocol.md).
  h.s.config_loaded(cfg(std::vector<int>{0}, ParkMode::kHold), "c");
  h.drain();
  const Decision d = h.boundary(0);
  h.s.on_parked(1, d.generation);
  h.drain();
  REQUIRE(h.state(1) == SlotState::kParked);
  const size_t mark = h.log.size();
  h.s.config_loaded(cfg(std::vector<int>{0}, ParkMode::kRelease), "c");
  h.drain();
  std::string wake;
  for (size_t i = mark; i < h.log.size(); ++i)
    if (h.log[i].kind == Effect::Kind::kWriteKey &&
        h.log[i].key.find("/wake/") != std::string::npos)
      wake = h.log[i].text();
  REQUIRE_FALSE(wake.empty());
  CHECK(Decision::from_json(wake).reason.empty());
}

namespace {

/// What h.s.would_decide() says now, checked to change nothing: no effect (so no store key,
/// no console line), the same generation, round, active set and slots.
std::optional<DecisionOutcome> would(Harness& h) {
  const auto before = h.s.slots();
  const int64_t gen = h.s.generation();
  const int64_t round = h.s.round();
  const std::vector<int> active = h.s.active();
  const std::set<std::string> store = h.store;
  std::optional<DecisionOutcome> out = h.s.would_decide();
  CHECK(h.s.take_effects().empty());
  CHECK(h.store == store);
  CHECK(h.s.generation() == gen);
  CHECK(h.s.round() == round);
  CHECK(h.s.active() == active);
  for (const auto& entry : h.s.slots()) {
    const SlotInfo& was = before.at(entry.first);
    CHECK(entry.second.state == was.state);
    CHECK(entry.second.reason == was.reason);
    CHECK(entry.second.rank == was.rank);
    CHECK(entry.second.warm_late_said == was.warm_late_said);
    CHECK(entry.second.floor_kept_said == was.floor_kept_said);
  }
  return out;
}

/// The decision `predicted` equals `d`, the one made next (the boundary's position aside:
/// between rounds the prediction takes the last one).
void same_decision(const std::optional<DecisionOutcome>& predicted, const Decision& d) {
  REQUIRE(predicted.has_value());
  REQUIRE(predicted->decision.has_value());
  Decision p = *predicted->decision;
  p.epoch = d.epoch;
  p.step = d.step;
  CHECK(p.to_json() == d.to_json());
}

std::vector<std::pair<DecisionReason::Kind, int>> reasons_of(const DecisionOutcome& o) {
  std::vector<std::pair<DecisionReason::Kind, int>> v;
  for (const DecisionReason& r : o.reasons) v.emplace_back(r.kind, r.gpu);
  return v;
}

}  // namespace

TEST_CASE("scheduler: would_decide() is what the next boundary decides, and changes nothing") {
  SUBCASE("continue, between rounds and mid-round") {
    Harness h(cfg(std::vector<int>{0, 1}));
    h.join_all();
    const auto first = would(h);  // (sequenced: the boundary comes after)
    same_decision(first, h.boundary(0));
    const auto w = would(h);
    REQUIRE(w.has_value());
    CHECK(w->decision->kind == Decision::Kind::kContinue);
    CHECK(w->reasons.empty());
    h.report(0, 1);  // one of two reported: the other as if at the same boundary
    const auto mid = would(h);
    h.report(1, 1);
    same_decision(mid, h.decisions.back());
  }
  SUBCASE("grow: a warm joiner not ready (continue, the reason), then ready (it joins)") {
    Harness h(cfg(std::vector<int>{0, 1}));
    h.auto_ready = false;
    h.join_all();
    h.s.config_loaded(cfg(std::vector<int>{0, 1, 2}), "c");
    h.drain();
    REQUIRE(h.state(2) == SlotState::kWarming);
    const auto w = would(h);
    REQUIRE(w.has_value());
    CHECK(w->decision->kind == Decision::Kind::kContinue);
    CHECK(reasons_of(*w) == std::vector{std::make_pair(DecisionReason::Kind::kWarmNotReady, 2)});
    same_decision(w, h.boundary(0));
    h.ready(2);
    const auto grow = would(h);
    REQUIRE(grow.has_value());
    CHECK(grow->decision->joiners == std::vector<int>{2});
    CHECK(grow->reasons.empty());
    same_decision(grow, h.boundary(1));
  }
  SUBCASE("min_gpus keeps a leaving member while the joiner is not ready") {
    Config c = cfg(std::vector<int>{0, 1});
    c.policy.min_gpus = 2;
    Harness h(c, /*slots=*/3);
    h.join_all();
    h.auto_ready = false;
    c.active_gpus = std::vector<int>{0, 2};
    h.s.config_loaded(c, "c");
    h.drain();
    const auto w = would(h);
    REQUIRE(w.has_value());
    CHECK(w->decision->kind == Decision::Kind::kContinue);
    CHECK(reasons_of(*w) == std::vector{std::make_pair(DecisionReason::Kind::kWarmNotReady, 2),
                                        std::make_pair(DecisionReason::Kind::kFloorKept, 1)});
    same_decision(w, h.boundary(0));
    CHECK(said(h,
               "gpu 1 stays in the job until the joiners of [2] are ready: [policy] "
               "min_gpus = 2"));  // said by decide(), not by would_decide()
  }
  SUBCASE("pause: the snapshot, then the pause at the re-report; none while paused") {
    Harness h(cfg(std::vector<int>{0, 1}));
    h.join_all();
    h.s.config_loaded(cfg(std::vector<int>{}), "c");
    h.drain();
    const auto snap = would(h);
    same_decision(snap, h.boundary(0, /*snapshot_outcome=*/""));
    REQUIRE(h.decisions.back().kind == Decision::Kind::kSnapshot);
    const auto pause = would(h);
    const int src = h.decisions.back().state_source.gpu;
    for (int gpu : h.s.active()) h.report(gpu, 0, gpu == src ? "ok" : "");
    same_decision(pause, h.decisions.back());
    CHECK(h.decisions.back().active.empty());
    CHECK_FALSE(would(h).has_value());  // paused: no boundary comes
  }
  SUBCASE("none once a stop is asked for") {
    Harness h(cfg(std::vector<int>{0, 1}));
    h.join_all();
    h.s.request_stop("test");
    h.drain();
    CHECK_FALSE(h.s.would_decide().has_value());
  }
}
