#include "control/effects.hpp"

#include <vector>

#include "control/scheduler.hpp"
#include "gpurun/check.hpp"

namespace gpurun::control {

void run_effects(Scheduler& scheduler, EffectSink& sink) {
  for (std::vector<Effect> batch = scheduler.take_effects(); !batch.empty();
       batch = scheduler.take_effects()) {
    sink.begin_batch();
    for (const Effect& e : batch) {
      switch (e.kind) {
        case Effect::Kind::kWriteKey:
          sink.write_key(e.key, e.text(), e.decision ? &*e.decision : nullptr);
          break;
        case Effect::Kind::kDeleteKey:
          sink.delete_key(e.key);
          break;
        case Effect::Kind::kAbandonKeys:
          sink.abandon_keys(e.key);
          break;
        case Effect::Kind::kSpawn: {
          GPURUN_CHECK(e.decision.has_value(), "spawn of gpu {} carries no decision", e.gpu);
          const int pid = sink.spawn(e.gpu, e.generation, e.warm, e.standby, *e.decision);
          if (pid > 0) scheduler.on_spawned(e.gpu, pid);
          break;
        }
        case Effect::Kind::kKill:
          sink.kill(e.gpu);
          break;
        case Effect::Kind::kArmDeadline:
          sink.arm_deadline(e.generation, e.round, e.deadline);
          break;
        case Effect::Kind::kEvent:
          sink.event(e.key, e.fields);
          break;
        case Effect::Kind::kSay:
          sink.say(e.value);
          break;
      }
    }
  }
}

}  // namespace gpurun::control
