// gpurun::testing::InProcessComms — the communicator seam's fake: every group's ranks are
// threads of this process, collectives (all-reduce sum, broadcast, all-gather, barrier) run
// over shared memory, on CPU tensors. A group is named by CommOptions::prefix, as the real
// rendezvous is. Faults: the n-th collective of a slot can fail (CommError in that rank) or
// "die" (SimulatedDeath escapes the runtime, as a process crash would), or fail after the
// exchange (the peers' collective completes, this rank's does not); each breaks the group, so its
// peers get CommError at their pending or next collective — what Gloo reports when a peer's
// connection closes. Test-only (target gpurun_worker_runtime_testing).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "runtime/runtime_seams.hpp"

namespace gpurun::testing {

/// Thrown by a collective of a slot told to die (not a gpurun::Error: the runtime does not
/// catch it, so it ends the rank's thread like a crash ends a process).
class SimulatedDeath : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class InProcessComms {
 public:
  /// kCommError: the collective fails in this rank before it exchanges anything; kDie: as a
  /// crash there; kFailAfter: every rank's part was exchanged (the peers' collective completes)
  /// but this rank's fails, as when a peer dies before a ring's last chunk reached this rank.
  enum class Fault { kCommError, kDie, kFailAfter };

  /// A factory for the runtime of slot `slot` (detail::RuntimeSeams::make_comm). The
  /// factory keeps `this` alive only by reference: outlive every runtime.
  rt::CommFactory factory(int slot);

  /// The `n`-th collective (1-based, counted over every communicator of `slot` from now on)
  /// fails with `fault`.
  void fail_at(int slot, int64_t n, Fault fault);

  /// Collectives run so far by `slot` (all_reduce_sum, broadcast, all_gather_int64, barrier).
  int64_t collectives(int slot) const;
  /// Communicators created so far (every rank of every group counts).
  int64_t communicators() const;

  struct Group;  // shared state of one group (fake_communicator.cpp)

  /// Called by a communicator of `slot` before each collective: counts it, injects faults.
  /// Returns the fault to inject, if any.
  std::optional<Fault> on_collective(int slot);

 private:
  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<Group>> groups_;
  std::map<int, int64_t> count_;
  std::map<int, std::pair<int64_t, Fault>> faults_;
  int64_t communicators_ = 0;
};

}  // namespace gpurun::testing
