// Scheduler: warm joiners and standbys (docs/control-protocol.md#warm-joiners, #standbys).
#include "control/scheduler.hpp"

#include <algorithm>
#include <utility>

#include <fmt/format.h>

#include "gpurun/check.hpp"
#include "gpurun/control/node_messages.hpp"

namespace gpurun::control {

void Scheduler::on_ready(int gpu, int64_t warm) {
  auto it = slots_.find(gpu);
  if (it == slots_.end()) return;
  SlotInfo& s = it->second;
  if (s.state != SlotState::kWarming || s.warm_id != warm || s.warm_ready) return;
  s.warm_ready = true;
  s.reason = "warm: ready, joins at the next boundary";
  Effect e;
  e.kind = Effect::Kind::kEvent;
  e.key = "warm_ready";
  e.fields.add("gpu", gpu).add("pid", s.pid).add("warm", warm);
  effects_.push_back(std::move(e));
  if (holds_job_open()) resume();  // paused: nobody trains, no boundary comes
}

void Scheduler::warm_up() {
  if (generation_ < 0) return;
  const bool ending = finished_ || !stop_pending_.empty();
  const std::vector<int> want = ending ? std::vector<int>{} : effective_desired();
  const auto wanted = [&](int gpu) { return std::binary_search(want.begin(), want.end(), gpu); };
  for (auto& [gpu, s] : slots_) {
    if (s.state == SlotState::kWarming && !wanted(gpu))
      cancel_warming(s, ending ? "the job is finishing" : "the config no longer names it");
    if (s.state == SlotState::kStandby &&
        (ending || config_.park_mode != ParkMode::kRelease || !config_.standby || s.withdrawn))
      cancel_warming(s, ending        ? "the job is finishing"
                        : s.withdrawn ? "its node is leaving the job"
                                      : "the config turned standbys off ([park] standby, mode)");
  }
  for (int gpu : want) {
    SlotInfo& s = slot(gpu);
    if (s.state == SlotState::kStandby) {
      // Its start-up without the device is done (or under way): it sets up the device and gets
      // ready as any warm joiner from here.
      set_state(s, SlotState::kWarming,
                "standby told to go: it sets up its device, joins at a boundary once ready");
      Effect e;
      e.kind = Effect::Kind::kWriteKey;
      e.key = keys::go(gpu, s.warm_id);
      e.value = "go";
      effects_.push_back(std::move(e));
      continue;
    }
    if (member(s) || s.state != SlotState::kParked || s.pid >= 0) continue;
    spawn_warm(s, want, /*standby=*/false);
  }
  if (ending || config_.park_mode != ParkMode::kRelease || !config_.standby) return;
  for (auto& [gpu, s] : slots_)
    if (!wanted(gpu) && s.state == SlotState::kParked && s.pid < 0 && s.released && !s.no_standby &&
        !s.withdrawn)
      spawn_warm(s, want, /*standby=*/true);
}

void Scheduler::spawn_warm(SlotInfo& s, const std::vector<int>& want, bool standby) {
  s.warm_id = next_warm_++;
  s.warm_ready = false;
  s.warm_late_said = false;
  s.generation = -1;
  s.rank = -1;
  if (standby)
    set_state(s, SlotState::kStandby,
              "spawned as a standby: it starts up without its device and waits for a config "
              "that names the slot");
  else
    set_state(s, SlotState::kWarming,
              "spawned warm: it starts while the others train, joins at a boundary once ready");
  // The provisional world (the environment's RANK/WORLD_SIZE): the admitting decision's wins.
  Decision d = base_decision();
  d.kind = Decision::Kind::kResize;
  d.generation = generation_ + 1;
  d.prev_generation = generation_;
  d.active = want;
  if (standby) {
    d.active.push_back(s.gpu);
    std::sort(d.active.begin(), d.active.end());
  }
  d.joiners = {s.gpu};
  d.state_source = StateSource::snapshot();
  Effect e;
  e.kind = Effect::Kind::kSpawn;
  e.gpu = s.gpu;
  e.generation = -1;
  e.warm = s.warm_id;
  e.standby = standby;
  e.decision = std::move(d);
  effects_.push_back(std::move(e));
}

void Scheduler::cancel_warming(SlotInfo& s, const std::string& why, bool quiet) {
  const bool standby = s.state == SlotState::kStandby;
  set_state(s, SlotState::kParked,
            std::string(standby ? "standby" : "warm joiner") + " cancelled: " + why);
  s.warm_ready = false;
  if (s.pid < 0) {
    drop_warm_keys(s);
    return;
  }
  s.cancelled = true;  // its exit (any status) is no failure
  if (!quiet)
    say(fmt::format("ending {} {} (pid {}): {}", standby ? "standby" : "warming", slot_name(s.gpu),
                    s.pid, why));
  Effect e;
  e.kind = Effect::Kind::kKill;
  e.gpu = s.gpu;
  effects_.push_back(std::move(e));
}

void Scheduler::drop_park_keys(SlotInfo& s) {
  if (s.park_generation < 0) return;
  delete_key(keys::parked(s.gpu, s.park_generation));
  delete_key(keys::wake(s.gpu, s.park_generation));
  s.park_generation = -1;
}

void Scheduler::drop_warm_keys(SlotInfo& s) {
  if (s.warm_id < 0) return;
  delete_key(keys::ready(s.gpu, s.warm_id));
  delete_key(keys::admit(s.gpu, s.warm_id));
  delete_key(keys::go(s.gpu, s.warm_id));
  s.warm_id = -1;
}

}  // namespace gpurun::control
