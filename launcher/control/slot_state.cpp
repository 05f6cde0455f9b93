#include "control/slot_state.hpp"

#include <fmt/format.h>

namespace gpurun::control {

namespace {

using S = SlotState;

struct Move {
  S from;
  S to;
};

// The one transition table (docs/control-protocol.md#slot-states).
constexpr Move kTable[] = {
    {S::kStarting, S::kActive},      {S::kStarting, S::kExited},      {S::kStarting, S::kFailed},
    {S::kActive, S::kOffloading},    {S::kActive, S::kExited},        {S::kActive, S::kFailed},
    {S::kOffloading, S::kParked},    {S::kOffloading, S::kRejoining}, {S::kOffloading, S::kFailed},
    {S::kParked, S::kRejoining},     {S::kParked, S::kExited},        {S::kParked, S::kFailed},
    {S::kRejoining, S::kActive},     {S::kRejoining, S::kExited},     {S::kRejoining, S::kFailed},
    {S::kRejoining, S::kOffloading},  // its join was abandoned and the next decision leaves it out
    {S::kParked, S::kWarming},        // a config adds it: spawned at once, joins once ready
    {S::kWarming, S::kRejoining},     // ready, admitted by a decision
    {S::kWarming, S::kParked},        // cancelled (a config edit removed it, the job finishes)
    {S::kWarming, S::kFailed},        // died before it was admitted
    {S::kParked, S::kStandby},        // a release leaver exited: a standby starts for the slot
    {S::kStandby, S::kWarming},       // a config names the slot: told to go
    {S::kStandby, S::kParked},        // ended (died, or killed as the job finishes)
};

}  // namespace

std::string_view to_string(SlotState state) {
  switch (state) {
    case S::kStarting:
      return "STARTING";
    case S::kActive:
      return "ACTIVE";
    case S::kOffloading:
      return "OFFLOADING";
    case S::kParked:
      return "PARKED";
    case S::kRejoining:
      return "REJOINING";
    case S::kWarming:
      return "WARMING";
    case S::kStandby:
      return "STANDBY";
    case S::kExited:
      return "EXITED";
    case S::kFailed:
      return "FAILED";
  }
  return "UNKNOWN";
}

bool transition_allowed(SlotState from, SlotState to) {
  for (const Move& m : kTable)
    if (m.from == from && m.to == to) return true;
  return false;
}

SlotState transition(SlotState from, SlotState to) {
  if (!transition_allowed(from, to))
    throw IllegalTransition(
        fmt::format("illegal slot state transition {} -> {}", to_string(from), to_string(to)));
  return to;
}

}  // namespace gpurun::control
