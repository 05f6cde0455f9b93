// gpurun::control::Effect and run_effects — what a Scheduler call asks to be done, and the one
// loop that carries it out through an EffectSink: the supervisor's (ElasticController: the
// store, processes, timers, event log, console) or the in-process fake's
// (testing::InMemorySupervisor). A decision travels as a Decision value and is encoded to its
// JSON here, once per write. Protocol: docs/control-protocol.md.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "gpurun/control/decision.hpp"
#include "gpurun/json_writer.hpp"

namespace gpurun::control {

class Scheduler;

/// Something the caller must do, in order, after a Scheduler call.
struct Effect {
  enum class Kind {
    kWriteKey,     ///< store SET key = value (`decision`'s JSON when it carries one)
    kDeleteKey,    ///< store DELETE_KEY key (a key no process will read again)
    kAbandonKeys,  ///< no key under the prefix `key` will be written: waits on them end
                   ///< (store::Backend::abandon_prefix; an abandoned generation's set-up)
    kSpawn,        ///< start a process for `gpu` joining `generation` by `decision`; with
                   ///< `warm` >= 0 a warm joiner (GPURUN_WARM=warm; decision: the provisional
                   ///< set)
    kKill,         ///< SIGKILL the process group of `gpu` (stalled)
    kArmDeadline,  ///< call on_deadline(generation, round) after `deadline`
    kEvent,        ///< event log record: name = key, fields
    kSay,          ///< console line (value, without "gpurun: ")
  };
  Kind kind = Kind::kSay;
  std::string key;
  std::string value;
  /// kWriteKey of a decision (decision, start, wake and admit keys): the value is its JSON;
  /// kSpawn: the decision the process joins by. nullopt otherwise.
  std::optional<Decision> decision;
  int gpu = -1;
  int64_t generation = -1;
  int64_t round = -1;
  std::chrono::milliseconds deadline{0};
  JsonObject fields;
  int64_t warm = -1;     ///< kSpawn of a warm joiner: its id (keys::ready / keys::admit)
  bool standby = false;  ///< kSpawn of a standby (GPURUN_STANDBY=1 as well as GPURUN_WARM)

  /// The value a kWriteKey sets: `decision`'s JSON when it carries one, else `value`.
  std::string text() const { return decision ? decision->to_json() : value; }
};

/// What carries out a Scheduler's effects, one method per Effect::Kind. Every method runs on
/// the thread that calls run_effects, in the effects' order.
class EffectSink {
 public:
  virtual ~EffectSink() = default;
  /// A batch of effects begins (before its first effect).
  virtual void begin_batch() {}
  /// kWriteKey: SET `key` = `value`; `decision`: the Decision `value` encodes, when it is one.
  virtual void write_key(const std::string& key, const std::string& value,
                         const Decision* decision) = 0;
  virtual void delete_key(const std::string& key) = 0;
  virtual void abandon_keys(const std::string& prefix) = 0;
  /// kSpawn: starts the process; returns its pid, <= 0 when none was started.
  virtual int spawn(int gpu, int64_t generation, int64_t warm, bool standby,
                    const Decision& decision) = 0;
  virtual void kill(int gpu) = 0;
  virtual void arm_deadline(int64_t generation, int64_t round, std::chrono::milliseconds after) = 0;
  virtual void event(const std::string& name, const JsonObject& fields) = 0;
  /// kSay: a console line without "gpurun: ".
  virtual void say(const std::string& line) = 0;
};

/// Takes the scheduler's effects and carries them out through `sink`, batch after batch until
/// none is left: a started process (Scheduler::on_spawned, called here with its pid) may
/// produce more.
void run_effects(Scheduler& scheduler, EffectSink& sink);

}  // namespace gpurun::control
