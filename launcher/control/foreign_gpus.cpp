// [policy] yield_to_foreign bookkeeping. Reference: docs/sharing.md#yield.
#include "control/foreign_gpus.hpp"

#include <fmt/format.h>

namespace gpurun::control {

std::vector<ForeignGpus::Change> ForeignGpus::update(const Listing& listing, int64_t now_ms,
                                                     const Probe& probe, int64_t reclaim_after_ms) {
  std::vector<Change> out;
  for (const auto& [gpu, procs] : listing) {
    std::string who;
    for (const auto& [pid, bytes] : procs) {
      if (probe.owner(pid) != Owner::kForeign) continue;
      who += fmt::format("{}{}, {} MiB", who.empty() ? "" : "; ", probe.describe(pid), bytes >> 20);
    }
    auto it = seen_.find(gpu);
    if (!who.empty()) {
      if (it == seen_.end()) out.push_back({"yield", gpu, who});
      seen_[gpu] = {-1, who};
    } else if (it != seen_.end()) {
      if (it->second.free_since_ms < 0) it->second.free_since_ms = now_ms;
      if (now_ms - it->second.free_since_ms >= reclaim_after_ms) {
        out.push_back({"yield_end", gpu, it->second.who});
        seen_.erase(it);
      }
    }
  }
  return out;
}

std::vector<std::pair<int, std::string>> ForeignGpus::yielded() const {
  std::vector<std::pair<int, std::string>> out;
  for (const auto& [gpu, s] : seen_)
    out.emplace_back(gpu, s.free_since_ms < 0 ? fmt::format("yielded to {}", s.who)
                                              : fmt::format("yielded to {}, gone: taken back after "
                                                            "[policy] reclaim_after_s",
                                                            s.who));
  return out;
}

}  // namespace gpurun::control
