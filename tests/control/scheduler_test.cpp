// Scheduler: boundary rounds, decisions, parking and wake keys, would_decide()
// (launcher/control/scheduler.cpp; docs/control-protocol.md).
#include "control/scheduler.hpp"

#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <doctest/doctest.h>

#include "scheduler_fixture.hpp"

using namespace gpurun::control;
using namespace gpurun::control::testing;
using namespace std::chrono_literals;

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
