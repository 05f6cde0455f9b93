// Scheduler: warm joiners and standbys (launcher/control/scheduler_warm.cpp;
// docs/control-protocol.md#warm-joiners, #standby).
#include "control/scheduler.hpp"

#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "scheduler_fixture.hpp"

using namespace gpurun::control;
using namespace gpurun::control::testing;
using namespace std::chrono_literals;

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

// ---- warm joiners (docs/control-protocol.md#warm-joiners) ---------------------------------

namespace {
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
