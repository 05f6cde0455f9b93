#include "control/decision_rule.hpp"

#include <algorithm>
#include <iterator>

#include <fmt/format.h>

#include "control/scheduler.hpp"
#include "gpurun/check.hpp"
#include "gpurun/control/node_messages.hpp"

namespace gpurun::control {

std::vector<int> ids_minus(const std::vector<int>& a, const std::vector<int>& b) {
  std::vector<int> out;
  std::set_difference(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(out));
  return out;
}

std::vector<int> ids_intersect(const std::vector<int>& a, const std::vector<int>& b) {
  std::vector<int> out;
  std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(out));
  return out;
}

bool joinable_now(const SlotInfo& s) {
  if (s.state == SlotState::kWarming) return s.warm_ready;
  if (s.state == SlotState::kParked && s.pid >= 0 && (s.will_exit || s.cancelled)) return false;
  if (s.state == SlotState::kOffloading && s.will_exit) return false;
  return true;  // a held process (woken), or no process (spawned by the decision)
}

namespace {

/// A report's position in boundary order: (e, 0) is the end of epoch e, so it comes after
/// every (e, k) and before (e + 1, k > 0).
std::pair<int64_t, int64_t> position_key(const Report& r) {
  return r.step <= 0 ? std::make_pair(r.epoch + 1, int64_t{0}) : std::make_pair(r.epoch, r.step);
}

bool same_position(const Report& a, const Report& b) {
  return position_key(a) == position_key(b);
}

/// The survivor whose report is furthest ahead when the survivors' reports differ (the lowest
/// slot among equals); -1 when they all reported the same position.
int ahead_survivor(const DecisionInput& in, const std::vector<int>& survivors) {
  int ahead = -1;
  bool differ = false;
  const Report* best = nullptr;
  for (int gpu : survivors) {
    const auto s = in.slots->find(gpu);
    const auto r = in.reports.find(s->second.rank);
    if (r == in.reports.end() || !r->second.has_state) continue;
    if (best && !same_position(*best, r->second)) differ = true;
    if (!best || position_key(r->second) > position_key(*best)) {
      best = &r->second;
      ahead = gpu;
    }
  }
  return differ ? ahead : -1;
}

}  // namespace

DecisionOutcome compute_decision(const DecisionInput& in) {
  GPURUN_CHECK(in.slots != nullptr && !in.reports.empty(),
               "compute_decision of generation {} round {} without slots or reports", in.generation,
               in.round);
  const auto slot = [&in](int gpu) -> const SlotInfo& {
    const auto it = in.slots->find(gpu);
    GPURUN_CHECK(it != in.slots->end(), "unknown slot {}", gpu);
    return it->second;
  };
  const std::vector<int>& old = in.active;
  DecisionOutcome out;
  std::vector<int> stateless;  // joiners whose set-up was abandoned, reporting without state
  for (int gpu : old) {
    const SlotInfo& s = slot(gpu);
    if (s.state == SlotState::kFailed) out.failed.push_back(gpu);
    const bool live = s.state == SlotState::kActive || s.state == SlotState::kRejoining;
    if (live && s.holds_state) out.survivors.push_back(gpu);
    if (live && !s.holds_state && in.reports.count(s.rank)) stateless.push_back(gpu);
  }
  const std::vector<int>& survivors = out.survivors;
  const std::vector<int>& target_wanted = in.desired;
  // Warm joiners still starting (and slots whose old process is still exiting) join at a later
  // boundary: the members never wait here for a start-up.
  std::vector<int> now;
  for (int gpu : target_wanted) {
    const SlotInfo& s = slot(gpu);
    if (std::binary_search(old.begin(), old.end(), gpu) || joinable_now(s)) {
      now.push_back(gpu);
    } else if (s.state == SlotState::kWarming) {
      const Report& r = in.reports.begin()->second;
      out.reasons.push_back(
          {DecisionReason::Kind::kWarmNotReady, gpu,
           fmt::format("the warm joiner on {} (pid {}) is not ready yet at the boundary {}: "
                       "training goes on without it, it joins at the first boundary after it is "
                       "ready",
                       slot_name(gpu), s.pid, boundary_text(r.epoch, r.step))});
    }
  }
  if (now.empty() && !target_wanted.empty()) now = survivors;  // e.g. a swap: train on meanwhile
  // A joiner deferred here must not take the job below `[policy] min_gpus`: a member the target
  // drops (a lent GPU whose replacement still starts) stays until the joiner is in.
  const size_t floor =
      std::min(target_wanted.size(), static_cast<size_t>(std::max(in.min_gpus, 0)));
  std::vector<int> kept;
  for (int gpu : survivors) {
    if (now.size() >= floor) break;
    if (std::binary_search(now.begin(), now.end(), gpu)) continue;
    now.insert(std::upper_bound(now.begin(), now.end(), gpu), gpu);
    kept.push_back(gpu);
  }
  // A kept member is never in the wanted set: the joiners it waits for are the same for each.
  for (int gpu : kept)
    out.reasons.push_back(
        {DecisionReason::Kind::kFloorKept, gpu,
         fmt::format("{} stays in the job until the joiners of [{}] are ready: [policy] "
                     "min_gpus = {}",
                     slot_name(gpu), join_ids(ids_minus(target_wanted, now), ", "), in.min_gpus)});
  out.next = now;
  std::vector<int> target = std::move(now);

  if (survivors.empty() && !in.snapshot_current) {
    // Only joiners without state are left (the holders died during the set-up).
    out.state_lost = fmt::format("no process of generation {} holds it (failed: [{}])",
                                 in.generation, join_ids(out.failed, ", "));
    return out;
  }
  Decision d = in.base;
  d.prev_generation = in.generation;
  d.round = in.round;
  // The boundary's position as a holder reported it (a stateless joiner repeats its decision's).
  const Report* first = &in.reports.begin()->second;
  for (const auto& entry : in.reports)
    if (entry.second.has_state) {
      first = &entry.second;
      break;
    }
  // A peer that died inside an all-reduce can leave it completed on some survivors and failed
  // on others: their positions differ by one step. The furthest ahead took a complete step
  // (every rank's gradient): its state and position are the generation's, the others receive it.
  const int ahead = ahead_survivor(in, survivors);
  if (ahead >= 0) first = &in.reports.at(slot(ahead).rank);
  d.epoch = first->epoch;
  d.step = first->step;
  if (target.empty() && !survivors.empty()) {
    if (in.refused_at == std::make_pair(d.epoch, d.step)) {
      target = survivors;  // the snapshot could not be written here: train on, retry later
    } else if (in.snapshot_boundary != std::make_pair(d.epoch, d.step)) {
      // First the snapshot, while every rank still holds the state; the pause comes after.
      const int src = ahead >= 0 ? ahead : survivors.front();
      d.kind = Decision::Kind::kSnapshot;
      d.generation = in.generation;
      d.active = old;
      d.state_source = StateSource::peer(slot(src).rank, src);
      out.decision = std::move(d);
      return out;
    }
  }
  d.checkpoint = in.checkpoint;
  if (out.failed.empty() && target == old && survivors == old && ahead < 0) {
    d.kind = Decision::Kind::kContinue;
    d.generation = in.generation;
    d.active = old;
    out.decision = std::move(d);
    return out;
  }
  d.kind = Decision::Kind::kResize;
  d.generation = in.generation + 1;
  d.active = target;
  d.joiners = ids_minus(target, survivors);
  d.leavers = ids_minus(survivors, target);
  for (int gpu : ids_minus(stateless, target))  // an abandoned joiner left out now leaves
    d.leavers.insert(std::upper_bound(d.leavers.begin(), d.leavers.end(), gpu), gpu);
  d.failed = out.failed;
  const std::vector<int> stay = ids_intersect(survivors, target);
  const int src_gpu = ahead >= 0           ? ahead
                      : !stay.empty()      ? stay.front()
                      : !survivors.empty() ? survivors.front()
                                           : -1;
  if (ahead >= 0)
    for (int gpu : stay)
      if (const auto r = in.reports.find(slot(gpu).rank);
          r != in.reports.end() && !same_position(r->second, *first))
        d.behind.push_back(gpu);
  // A pause keeps the state in the verified snapshot written in the round before.
  d.state_source = src_gpu < 0 || target.empty() ? StateSource::snapshot()
                                                 : StateSource::peer(slot(src_gpu).rank, src_gpu);
  out.decision = std::move(d);
  return out;
}

}  // namespace gpurun::control
