// Scheduler: the set-up deadline and the boundary deadline, where a late rank that runs is
// waited for (launcher/control/scheduler_failures.cpp; docs/control-protocol.md).
#include "control/scheduler.hpp"

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <string>
#include <vector>

#include <doctest/doctest.h>
#include <fmt/format.h>

#include "scheduler_fixture.hpp"

using namespace gpurun::control;
using namespace gpurun::control::testing;
using namespace std::chrono_literals;

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
