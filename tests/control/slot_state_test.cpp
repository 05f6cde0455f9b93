#include "control/slot_state.hpp"

#include <doctest/doctest.h>

#include <set>
#include <string>
#include <string_view>
#include <utility>

using gpurun::control::IllegalTransition;
using gpurun::control::kAllSlotStates;
using gpurun::control::SlotState;
using gpurun::control::to_string;
using gpurun::control::transition;
using gpurun::control::transition_allowed;

TEST_CASE("slot state table: every pair walked, legal moves succeed, illegal ones name both") {
  using S = SlotState;
  const std::set<std::pair<S, S>> legal = {
      {S::kStarting, S::kActive},
      {S::kStarting, S::kExited},
      {S::kStarting, S::kFailed},
      {S::kActive, S::kOffloading},
      {S::kActive, S::kExited},
      {S::kActive, S::kFailed},
      {S::kOffloading, S::kParked},
      {S::kOffloading, S::kRejoining},
      {S::kOffloading, S::kFailed},
      {S::kParked, S::kRejoining},
      {S::kParked, S::kExited},
      {S::kParked, S::kFailed},
      {S::kRejoining, S::kActive},
      {S::kRejoining, S::kExited},
      {S::kRejoining, S::kFailed},
      {S::kRejoining, S::kOffloading},  // its join was abandoned and the next decision leaves it
                                        // out
      {S::kParked, S::kWarming},        // a config adds it: a warm joiner
      {S::kWarming, S::kRejoining},     // ready, admitted
      {S::kWarming, S::kParked},        // cancelled
      {S::kWarming, S::kFailed},        // died before it was admitted
      {S::kParked, S::kStandby},        // a release leaver exited: its slot's standby starts
      {S::kStandby, S::kWarming},       // a config names the slot: told to go
      {S::kStandby, S::kParked},        // ended (died, or killed as the job finishes)
  };
  int walked = 0, allowed = 0;
  for (S from : kAllSlotStates) {
    for (S to : kAllSlotStates) {
      ++walked;
      CAPTURE(to_string(from));
      CAPTURE(to_string(to));
      if (legal.count({from, to})) {
        ++allowed;
        CHECK(transition_allowed(from, to));
        CHECK(transition(from, to) == to);
      } else {
        CHECK_FALSE(transition_allowed(from, to));
        const std::string want = "illegal slot state transition " + std::string(to_string(from)) +
                                 " -> " + std::string(to_string(to));
        CHECK_THROWS_WITH_AS(transition(from, to), want.c_str(), IllegalTransition);
      }
    }
  }
  CHECK(walked == 81);
  CHECK(allowed == 23);
}

TEST_CASE("slot states: kAllSlotStates lists every SlotState, once, in declaration order") {
  // Its users (the table walk above, the /metrics gauge test) see only what it lists:
  // kStandby was missing, so its three moves were never walked. to_string() names every
  // enumerator (-Wswitch) and says UNKNOWN for any other value.
  std::string named, listed;  // the names, in order
  for (int i = 0; i < 64; ++i)
    if (const std::string_view n = to_string(static_cast<SlotState>(i)); n != "UNKNOWN")
      named += std::string(n) + " ";
  for (const SlotState st : kAllSlotStates) listed += std::string(to_string(st)) + " ";
  CHECK(listed == named);
}

TEST_CASE("slot state names") {
  CHECK(to_string(SlotState::kStarting) == "STARTING");
  CHECK(to_string(SlotState::kActive) == "ACTIVE");
  CHECK(to_string(SlotState::kWarming) == "WARMING");
  CHECK(to_string(SlotState::kOffloading) == "OFFLOADING");
  CHECK(to_string(SlotState::kParked) == "PARKED");
  CHECK(to_string(SlotState::kRejoining) == "REJOINING");
  CHECK(to_string(SlotState::kStandby) == "STANDBY");
  CHECK(to_string(SlotState::kExited) == "EXITED");
  CHECK(to_string(SlotState::kFailed) == "FAILED");
}
