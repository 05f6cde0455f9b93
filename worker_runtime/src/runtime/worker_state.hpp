// The worker-side state machine's one move: every state change of the runtime goes through
// transition(), which checks it against worker_transition_allowed() (the table, in
// worker_state.cpp; public declaration in gpurun/runtime.hpp). Internal header.
#pragma once

#include <string_view>

#include "gpurun/runtime.hpp"

namespace gpurun::rt {

/// Returns `to` when (from, to) is in the table; otherwise throws gpurun::InvariantError
/// "illegal worker state transition FROM -> TO (why)" — an illegal move is a runtime bug.
WorkerState transition(WorkerState from, WorkerState to, std::string_view why);

}  // namespace gpurun::rt
