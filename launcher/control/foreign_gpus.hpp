// gpurun::control::ForeignGpus — `[policy] yield_to_foreign`: which job GPUs another user's
// process uses, from NVML's process lists, and when a GPU it left may be taken back.
// Pure (the process check and the time are passed in). Reference: docs/sharing.md#yield.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace gpurun::control {

class ForeignGpus {
 public:
  /// A compute process on a GPU, as NVML lists it: (pid, GPU memory in bytes).
  using Listing = std::map<int, std::vector<std::pair<unsigned, uint64_t>>>;
  /// What a pid is: gpurun's own (gpurun or a descendant), another's, or not visible here
  /// (another pid namespace: a container's view of the host's pids) — never taken as foreign.
  enum class Owner { kOurs, kForeign, kUnknown };
  /// `describe(pid)`: e.g. "pid 4242 (bob)", for the reasons.
  struct Probe {
    std::function<Owner(unsigned pid)> owner;
    std::function<std::string(unsigned pid)> describe;
  };
  struct Change {
    std::string event;  ///< "yield" (a foreign process appeared) or "yield_end" (taken back)
    int gpu = 0;
    std::string who;  ///< the processes, e.g. "pid 4242 (bob, 2048 MiB)"
  };

  /// One listing of every job GPU at `now_ms` (ms, any monotonic origin). A GPU missing
  /// from it (its list could not be read) keeps what it had. Returns what changed.
  std::vector<Change> update(const Listing& listing, int64_t now_ms, const Probe& probe,
                             int64_t reclaim_after_ms);
  /// (gpu, why) of every GPU given up now: a foreign process is on it, or was seen less than
  /// reclaim_after ago.
  std::vector<std::pair<int, std::string>> yielded() const;
  /// Forgets everything (the policy was turned off).
  void clear() { seen_.clear(); }

 private:
  struct Seen {
    int64_t free_since_ms = -1;  ///< -1: a foreign process is on it now
    std::string who;
  };
  std::map<int, Seen> seen_;
};

}  // namespace gpurun::control
