// gpurun::control::SlotState — the supervisor's view of one worker slot, one
// enum plus one transition table. Reference: docs/control-protocol.md#slot-states.
#pragma once

#include <string_view>

#include "gpurun/error.hpp"

namespace gpurun::control {

/// State of one worker slot as the supervisor sees it.
enum class SlotState {
  kStarting,    ///< launched in generation 0 of an attempt, not joined yet
  kActive,      ///< member of the current generation, joined
  kOffloading,  ///< told to leave; its process still runs (freeing GPU state)
  kParked,      ///< not in the active set: no process (release, never launched) or held
  kRejoining,   ///< joiner spawned or woken, not joined yet
  kWarming,     ///< warm joiner: process started before a decision names it; admitted once ready
  kStandby,     ///< release mode, not wanted: a process started up without its device, waiting
                ///< for a config to name the slot (then WARMING)
  kExited,      ///< finished training (exit 0 while a member)
  kFailed,      ///< died or stalled past the boundary deadline
};

/// Upper-case name, e.g. "OFFLOADING".
std::string_view to_string(SlotState state);

/// Whether the table allows `from -> to` (a move to the same state is not a transition).
bool transition_allowed(SlotState from, SlotState to);

/// Thrown for a move the table forbids.
class IllegalTransition : public Error {
 public:
  using Error::Error;
};

/// Returns `to` when the table allows `from -> to`; otherwise throws
/// IllegalTransition "illegal slot state transition FROM -> TO".
SlotState transition(SlotState from, SlotState to);

/// Every state, in declaration order (for tests and tables).
inline constexpr SlotState kAllSlotStates[] = {
    SlotState::kStarting, SlotState::kActive,    SlotState::kOffloading,
    SlotState::kParked,   SlotState::kRejoining, SlotState::kWarming,
    SlotState::kStandby,  SlotState::kExited,    SlotState::kFailed};

}  // namespace gpurun::control
