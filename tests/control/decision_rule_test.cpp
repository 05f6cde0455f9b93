#include "control/decision_rule.hpp"

#include <doctest/doctest.h>

#include "control/scheduler.hpp"

using namespace gpurun::control;

namespace {

/// A round of generation 3, round 2, at the end of epoch 4, on `active` (every member ACTIVE,
/// holding the state, reported); every other slot of 0..3 PARKED with no process.
struct Round {
  std::map<int, SlotInfo> slots;
  DecisionInput in;

  explicit Round(std::vector<int> active, std::vector<int> desired) {
    for (int gpu = 0; gpu < 4; ++gpu) {
      SlotInfo s;
      s.gpu = gpu;
      slots[gpu] = s;
    }
    in.generation = 3;
    in.round = 2;
    in.active = active;
    in.desired = std::move(desired);
    in.slots = &slots;
    for (size_t r = 0; r < active.size(); ++r) {
      SlotInfo& s = slots[active[r]];
      s.state = SlotState::kActive;
      s.holds_state = true;
      s.rank = static_cast<int>(r);
      s.pid = 100 + active[r];
      Report rep;
      rep.rank = s.rank;
      rep.gpu = s.gpu;
      rep.generation = 3;
      rep.round = 2;
      rep.epoch = 4;
      rep.pid = s.pid;
      in.reports[s.rank] = rep;
    }
    in.base.park_mode = ParkMode::kHold;
  }
  void warming(int gpu, bool ready) {
    slots[gpu].state = SlotState::kWarming;
    slots[gpu].pid = 200 + gpu;
    slots[gpu].warm_ready = ready;
  }
  DecisionOutcome decide() const { return compute_decision(in); }
};

}  // namespace

TEST_CASE("decision rule: the wanted set trained on already continues, with the checkpoint") {
  Round r({0, 1}, {0, 1});
  r.in.checkpoint = true;
  const DecisionOutcome out = r.decide();
  REQUIRE(out.decision);
  CHECK(out.decision->kind == Decision::Kind::kContinue);
  CHECK(out.decision->generation == 3);
  CHECK(out.decision->prev_generation == 3);
  CHECK(out.decision->round == 2);
  CHECK(out.decision->epoch == 4);
  CHECK(out.decision->active == std::vector<int>{0, 1});
  CHECK(out.decision->checkpoint);
  CHECK(out.decision->park_mode == ParkMode::kHold);  // the config's, from `base`
  CHECK(out.reasons.empty());
  CHECK(out.next == std::vector<int>{0, 1});
}

TEST_CASE("decision rule: a ready warm joiner joins, one still starting is said and waited for") {
  Round r({0, 1}, {0, 1, 2, 3});
  r.warming(2, true);
  r.warming(3, false);
  const DecisionOutcome out = r.decide();
  REQUIRE(out.decision);
  const Decision& d = *out.decision;
  CHECK(d.kind == Decision::Kind::kResize);
  CHECK(d.generation == 4);
  CHECK(d.active == std::vector<int>{0, 1, 2});
  CHECK(d.joiners == std::vector<int>{2});
  CHECK(d.leavers.empty());
  CHECK(d.state_source == StateSource::peer(0, 0));
  REQUIRE(out.reasons.size() == 1);
  CHECK(out.reasons[0].kind == DecisionReason::Kind::kWarmNotReady);
  CHECK(out.reasons[0].gpu == 3);
  CHECK(out.reasons[0].text ==
        "the warm joiner on gpu 3 (pid 203) is not ready yet at the boundary after epoch 5: "
        "training goes on without it, it joins at the first boundary after it is ready");
}

TEST_CASE("decision rule: [policy] min_gpus keeps a dropped member until its joiner is ready") {
  Round r({0, 1}, {0, 2});
  r.warming(2, false);
  r.in.min_gpus = 2;
  DecisionOutcome out = r.decide();
  REQUIRE(out.decision);
  CHECK(out.decision->kind == Decision::Kind::kContinue);  // gpu 1 stays, nothing changes yet
  CHECK(out.next == std::vector<int>{0, 1});
  REQUIRE(out.reasons.size() == 2);
  CHECK(out.reasons[0].kind == DecisionReason::Kind::kWarmNotReady);
  CHECK(out.reasons[1].kind == DecisionReason::Kind::kFloorKept);
  CHECK(out.reasons[1].gpu == 1);
  CHECK(out.reasons[1].text ==
        "gpu 1 stays in the job until the joiners of [2] are ready: [policy] min_gpus = 2");
  // Without the floor the job shrinks to gpu 0 meanwhile.
  r.in.min_gpus = 0;
  out = r.decide();
  REQUIRE(out.decision);
  CHECK(out.decision->kind == Decision::Kind::kResize);
  CHECK(out.decision->active == std::vector<int>{0});
  CHECK(out.decision->leavers == std::vector<int>{1});
}

TEST_CASE("decision rule: a pause is a snapshot first, then the pause; refused: train on") {
  Round r({0, 1}, {});
  DecisionOutcome out = r.decide();
  REQUIRE(out.decision);
  CHECK(out.decision->kind == Decision::Kind::kSnapshot);
  CHECK(out.decision->generation == 3);
  CHECK(out.decision->active == std::vector<int>{0, 1});
  CHECK(out.decision->state_source == StateSource::peer(0, 0));
  CHECK_FALSE(out.decision->checkpoint);

  r.in.snapshot_boundary = std::make_pair(int64_t{4}, int64_t{0});  // taken at this boundary
  out = r.decide();
  REQUIRE(out.decision);
  CHECK(out.decision->kind == Decision::Kind::kResize);
  CHECK(out.decision->active.empty());
  CHECK(out.decision->leavers == std::vector<int>{0, 1});
  CHECK(out.decision->state_source.is_snapshot());

  r.in.snapshot_boundary.reset();
  r.in.refused_at = std::make_pair(int64_t{4}, int64_t{0});  // could not be written here
  out = r.decide();
  REQUIRE(out.decision);
  CHECK(out.decision->kind == Decision::Kind::kContinue);
}

TEST_CASE("decision rule: a failed member leaves; no holder left and no snapshot: lost") {
  Round r({0, 1}, {0});  // the wanted set never holds a FAILED slot
  r.slots[1].state = SlotState::kFailed;
  DecisionOutcome out = r.decide();
  REQUIRE(out.decision);
  CHECK(out.decision->kind == Decision::Kind::kResize);
  CHECK(out.decision->active == std::vector<int>{0});
  CHECK(out.decision->failed == std::vector<int>{1});
  CHECK(out.failed == std::vector<int>{1});

  r.slots[0].holds_state = false;  // a joiner whose set-up was abandoned
  out = r.decide();
  CHECK_FALSE(out.decision);
  CHECK(out.state_lost == "no process of generation 3 holds it (failed: [1])");
  // The pause snapshot of this position still holds it: the job goes on from there.
  r.in.snapshot_current = true;
  out = r.decide();
  REQUIRE(out.decision);
  CHECK(out.decision->state_source.is_snapshot());
}

TEST_CASE("decision rule: the boundary is a holder's, not a stateless joiner's") {
  Round r({0, 1}, {0, 1});
  r.slots[0].holds_state = false;
  r.slots[0].state = SlotState::kRejoining;
  r.in.reports[0].has_state = false;
  r.in.reports[0].epoch = 3;  // repeats its decision's boundary
  const DecisionOutcome out = r.decide();
  REQUIRE(out.decision);
  CHECK(out.decision->epoch == 4);
  CHECK(out.decision->kind == Decision::Kind::kResize);  // gpu 0 joins again, from gpu 1
  CHECK(out.decision->joiners == std::vector<int>{0});
  CHECK(out.decision->state_source == StateSource::peer(1, 1));
}

TEST_CASE("decision rule: survivors a step apart go on from the one ahead; the others receive") {
  // gpu 3 died inside an all-reduce that completed on gpu 1 only: gpu 1 took step 18 (with every
  // rank's gradient), gpus 0 and 2 are still after step 17.
  Round r({0, 1, 2, 3}, {0, 1, 2});
  r.slots[3].state = SlotState::kFailed;
  r.in.reports.erase(3);
  for (auto& [rank, rep] : r.in.reports) rep.step = rank == 1 ? 18 : 17;
  DecisionOutcome out = r.decide();
  REQUIRE(out.decision);
  CHECK(out.decision->kind == Decision::Kind::kResize);
  CHECK(out.decision->step == 18);
  CHECK(out.decision->state_source == StateSource::peer(1, 1));
  CHECK(out.decision->behind == std::vector<int>{0, 2});
  CHECK(out.decision->joiners.empty());

  // Across an epoch's end: gpu 0's all-reduce of epoch 4's last step failed (after step 17),
  // gpu 1's completed and it reported the end of epoch 4 — (4, 0), which comes after (4, 17).
  r.in.reports[1].step = 0;
  out = r.decide();
  REQUIRE(out.decision);
  CHECK(out.decision->epoch == 4);
  CHECK(out.decision->step == 0);
  CHECK(out.decision->state_source == StateSource::peer(1, 1));
  CHECK(out.decision->behind == std::vector<int>{0, 2});

  // The one ahead leaves (the target drops it): it is still the source, a leaving one.
  r.in.desired = {0, 2};
  out = r.decide();
  REQUIRE(out.decision);
  CHECK(out.decision->state_source == StateSource::peer(1, 1));
  CHECK(out.decision->leavers == std::vector<int>{1});
  CHECK(out.decision->behind == std::vector<int>{0, 2});

  // Equal positions: nobody is behind, the lowest staying survivor is the source (as before).
  for (auto& entry : r.in.reports) entry.second.step = 17;
  out = r.decide();
  REQUIRE(out.decision);
  CHECK(out.decision->behind.empty());
  CHECK(out.decision->state_source == StateSource::peer(0, 0));
}
