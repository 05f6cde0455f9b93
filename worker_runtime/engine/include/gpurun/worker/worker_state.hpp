// gpurun::WorkerState — the worker's side of the slot states (docs/control-protocol.md#slot-
// states): one enum and one transition table, owned by the worker protocol engine
// (gpurun/worker/worker_engine.hpp) and re-exported by the C++ runtime (gpurun/runtime.hpp).
#pragma once

#include <string_view>

namespace gpurun {

/// ACTIVE → OFFLOADING → PARKED → REJOINING → ACTIVE, plus EXITED (docs/worker-runtime.md).
enum class WorkerState { kActive, kOffloading, kParked, kRejoining, kExited };
const char* to_string(WorkerState s);
/// The transition table: true for the legal (from, to) pairs.
bool worker_transition_allowed(WorkerState from, WorkerState to);
/// Returns `to` when (from, to) is in the table; otherwise throws gpurun::InvariantError
/// "illegal worker state transition FROM -> TO (why)" — an illegal move is a runtime bug.
WorkerState worker_transition(WorkerState from, WorkerState to, std::string_view why);

}  // namespace gpurun
