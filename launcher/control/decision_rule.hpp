// gpurun::control::compute_decision — what a complete boundary round decides, as a pure
// function of the round's facts (torchft's quorum_compute shape): the decision, or why the
// training state is lost, and the reasons the console gives for it. Scheduler::decide() builds
// the input, calls it and carries the outcome out (keys, slot states, console lines); a caller
// may ask it what would be decided now. Protocol: docs/control-protocol.md.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "control/slot_state.hpp"
#include "gpurun/control/decision.hpp"

namespace gpurun::control {

struct SlotInfo;

/// Sorted id lists (slot ids): the ids of `a` not in `b`, and the ids in both; sorted.
std::vector<int> ids_minus(const std::vector<int>& a, const std::vector<int>& b);
std::vector<int> ids_intersect(const std::vector<int>& a, const std::vector<int>& b);

/// Whether a wanted slot can be in the next generation now: a ready warm joiner, a held
/// process, or no process (the decision spawns one); false for one still warming or whose
/// previous process is still exiting.
bool joinable_now(const SlotInfo& s);

/// The facts of a boundary round every live member reported.
struct DecisionInput {
  int64_t generation = 0;  ///< the generation the round belongs to
  int64_t round = 0;
  std::vector<int> active;  ///< its active set (sorted)
  /// What the next decision aims for (Scheduler::effective_desired(): the config's set minus
  /// FAILED and EXITED slots), sorted.
  std::vector<int> desired;
  const std::map<int, SlotInfo>* slots = nullptr;  ///< every slot (not owned)
  std::map<int, Report> reports;                   ///< rank -> the round's report (not empty)
  int min_gpus = 0;                                ///< `[policy] min_gpus`
  /// The pause snapshot holds the state of the current position (a holder may be missing).
  bool snapshot_current = false;
  /// The boundary at which the pause snapshot could not be written (train on, retry later).
  std::optional<std::pair<int64_t, int64_t>> refused_at;
  /// The boundary at which the pause snapshot was taken.
  std::optional<std::pair<int64_t, int64_t>> snapshot_boundary;
  bool checkpoint = false;  ///< the preemption warning waits for a `continue` or `resize`
  Decision base;            ///< park mode, every_steps, global_batch of the config in force
};

/// One reason the console gives for the decision, about one slot.
struct DecisionReason {
  enum class Kind {
    kWarmNotReady,  ///< a wanted warm joiner is not ready: training goes on without it
    kFloorKept,     ///< a member the target drops stays for `[policy] min_gpus`
  };
  Kind kind = Kind::kWarmNotReady;
  int gpu = -1;
  std::string text;  ///< the console line (without "gpurun: ")
};

/// What the round decides.
struct DecisionOutcome {
  /// The decision (kSnapshot, kContinue or kResize); nullopt when the state is lost.
  std::optional<Decision> decision;
  std::string state_lost;      ///< why no process holds the state (decision is nullopt)
  std::vector<int> failed;     ///< members that FAILED
  std::vector<int> survivors;  ///< live members that hold the state
  /// The set trained on next before a pause or a refused snapshot changes it: the desired set
  /// less the joiners not ready, plus the members kept for min_gpus.
  std::vector<int> next;
  std::vector<DecisionReason> reasons;  ///< in the order the console says them
};

/// Pure: reads only `in` (and the slots it points to).
DecisionOutcome compute_decision(const DecisionInput& in);

}  // namespace gpurun::control
