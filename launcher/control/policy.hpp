// gpurun::control policies — what makes the *effective* GPU set differ from the declared one
// (config.toml's active_gpus): leases (`gpurun lend`) and GPUs yielded to other users'
// processes, bounded by `[policy] min_gpus`.
// Pure: no I/O, no clock (times are passed in). Reference: docs/sharing.md.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "gpurun/error.hpp"

namespace gpurun::control {

/// One lease: GPUs the job does not train on until `until_ms` (Unix time, ms), or until a
/// `gpurun reclaim` when there is no end.
struct Lease {
  std::vector<int> gpus;  ///< sorted, unique
  int64_t since_ms = 0;   ///< when it was made (Unix time, ms)
  std::optional<int64_t> until_ms;
  std::string note;  ///< `gpurun lend --note`: who or why (shown in status; may be empty)

  friend bool operator==(const Lease&, const Lease&) = default;
};

/// A leases file that cannot be read: what() names the file and the problem.
class LeaseError : public gpurun::Error {
 public:
  using Error::Error;
};

/// `<run_dir>/leases.json`: {"leases": [{"gpus": [2, 3], "since_ms": N, "until_ms": N|null,
/// "note": "..."}]}. An empty text is no lease. Throws LeaseError naming `source`.
std::vector<Lease> parse_leases(std::string_view text, const std::string& source);
/// The file text (one JSON object and a newline), read back equal by parse_leases.
std::string render_leases(const std::vector<Lease>& leases);

/// Every GPU lent at `now_ms` (a lease whose end is later than now, or without an end), sorted.
std::vector<int> lent_gpus(const std::vector<Lease>& leases, int64_t now_ms);
/// The leases still running at `now_ms`; `ended` gets those that ended (until_ms <= now_ms).
std::vector<Lease> drop_ended(const std::vector<Lease>& leases, int64_t now_ms,
                              std::vector<Lease>* ended = nullptr);
/// The earliest end of a running lease, or nullopt when none ends.
std::optional<int64_t> next_lease_end(const std::vector<Lease>& leases, int64_t now_ms);

/// The GPUs to train on and why the others of the declared set are not.
struct EffectiveSet {
  std::vector<int> active;  ///< sorted
  /// (gpu, why) for each declared GPU left out, e.g. (2, "lent until 12:00:05").
  std::vector<std::pair<int, std::string>> excluded;
  /// (gpu, why) for each GPU a policy wanted out but `min_gpus` kept, e.g.
  /// (1, "lent, kept: [policy] min_gpus = 2").
  std::vector<std::pair<int, std::string>> kept;

  friend bool operator==(const EffectiveSet&, const EffectiveSet&) = default;
};

/// The effective set: `declared` (sorted) minus the lent GPUs and the `yielded` ones ((gpu,
/// why): given up to another user's process, or out by another policy), but never fewer than
/// min(min_gpus, declared.size()) GPUs (a declared pause, `[]`, stays a pause). The left-out
/// GPUs that stay in are, in this order, those in `current` (the set the job trains on now,
/// sorted: a GPU that already left is not taken back from whoever has it), lent before
/// yielded, lowest id first. `until_text` renders a lease end for the reasons.
EffectiveSet effective_set(const std::vector<int>& declared, const std::vector<Lease>& leases,
                           int64_t now_ms, int min_gpus,
                           std::string (*until_text)(int64_t unix_ms) = nullptr,
                           const std::vector<std::pair<int, std::string>>& yielded = {},
                           const std::vector<int>& current = {});

/// "[2, 3]": GPU ids as the commands and messages print them.
std::string ids_text(const std::vector<int>& ids);

/// What a policy change does to `gpus` (the GPUs it wants out), for its message: "" when
/// every one of them leaves at the next boundary; else, e.g., "; GPU 1 stays in the job for
/// now ([policy] min_gpus = 2): it leaves once the job has enough GPUs without it".
std::string kept_note(const EffectiveSet& e, const std::vector<int>& gpus, int min_gpus);

/// What `gpurun lend` of `lent` does, from the set the job trains on now (`current`) and the
/// effective set with the new lease (`after`), e.g. "the job stops using [2] at its next
/// boundary; [3] is not in use by the job now; GPU 1 stays in the job for now (…)".
std::string lend_effect(const std::vector<int>& lent, const std::vector<int>& current,
                        const EffectiveSet& after, int min_gpus);
/// What `gpurun reclaim` of `back` does, e.g. "the job takes back [2] at its next boundary;
/// GPU 1 leaves the job in their place (lent until reclaimed, kept by [policy] min_gpus
/// until now); [3] stays out: config.toml does not name it".
std::string reclaim_effect(const std::vector<int>& back, const std::vector<int>& declared,
                           const std::vector<int>& current, const EffectiveSet& after);

/// "2,3", "2-3", "0-1,3" or "all" -> sorted unique ids; "all" = `all`. Throws LeaseError
/// naming `what` for anything else (an empty part, a reversed range, a negative id, a GPU
/// named twice: "1,1", "0-2,2").
std::vector<int> parse_gpu_list(std::string_view text, const std::vector<int>& all,
                                std::string_view what);
/// "90", "90s", "5m", "2h", "1d", "1.5h" -> milliseconds (> 0). Throws LeaseError naming
/// `what` otherwise.
int64_t parse_duration_ms(std::string_view text, std::string_view what);

}  // namespace gpurun::control
