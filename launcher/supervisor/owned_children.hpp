// Children of gpurun that their own code waits for (helper programs: a [notify] command,
// scontrol, ...): the spawner's orphan reaper (posix_spawner.cpp) must leave them alone, or
// their owner's wait never sees the exit. The registry is gpurun::HelperProcess's
// (gpurun/helper_process.hpp): every helper is in it from its spawn until it is reaped.
#pragma once

#include "gpurun/helper_process.hpp"

namespace gpurun::supervisor {

/// waitpid(pid, WNOHANG) for every direct child (/proc/self/task/*/children) that is neither
/// in `keep` nor a helper its owner waits for. Thread-safe.
using gpurun::reap_children_except;

}  // namespace gpurun::supervisor
