// The worker-side state machine: one enum, one transition table, one transition().
#include "gpurun/worker/worker_state.hpp"

#include <fmt/format.h>

#include "gpurun/error.hpp"

namespace gpurun {

const char* to_string(WorkerState s) {
  switch (s) {
    case WorkerState::kActive:
      return "ACTIVE";
    case WorkerState::kOffloading:
      return "OFFLOADING";
    case WorkerState::kParked:
      return "PARKED";
    case WorkerState::kRejoining:
      return "REJOINING";
    case WorkerState::kExited:
      return "EXITED";
  }
  return "?";
}

bool worker_transition_allowed(WorkerState from, WorkerState to) {
  using S = WorkerState;
  switch (from) {
    case S::kActive:  // a resize makes it leave; exit ends the job
      return to == S::kOffloading || to == S::kExited;
    case S::kOffloading:  // release mode: the process exits (EXITED); hold mode: parks
      return to == S::kParked || to == S::kExited;
    case S::kParked:  // woken as a joiner, or told to exit
      return to == S::kRejoining || to == S::kExited;
    case S::kRejoining:  // state received (ACTIVE); or its join was abandoned (a participant
                         // died) and gpurun's next decision leaves it out (OFFLOADING)
      return to == S::kActive || to == S::kOffloading || to == S::kExited;
    case S::kExited:
      return false;
  }
  return false;
}

WorkerState worker_transition(WorkerState from, WorkerState to, std::string_view why) {
  if (!worker_transition_allowed(from, to))
    throw InvariantError(fmt::format("illegal worker state transition {} -> {} ({})",
                                     to_string(from), to_string(to), why));
  return to;
}

}  // namespace gpurun
