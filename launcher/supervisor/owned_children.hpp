// Children of gpurun that their own code waits for (the [notify] command): the spawner's
// orphan reaper (posix_spawner.cpp) must leave them alone, or their owner's waitpid never
// sees the exit. One process-wide registry, one lock.
#pragma once

#include <functional>
#include <set>

namespace gpurun::supervisor {

/// Runs `spawn` (returns the new child's pid, or <= 0 on failure) under the registry's lock
/// and registers the pid, so that no reap can come between the spawn and the registration.
/// Returns what `spawn` returned. Thread-safe.
int spawn_owned_child(const std::function<int()>& spawn);
/// The owner waited for `pid` (or gave it up): it is an ordinary pid again. Thread-safe.
void release_owned_child(int pid);
/// waitpid(pid, WNOHANG) for every direct child (/proc/self/task/*/children) that is neither
/// in `keep` nor an owned child, under the registry's lock: an owned child's exit is never
/// taken from its owner. Thread-safe.
void reap_children_except(const std::set<int>& keep);

}  // namespace gpurun::supervisor
