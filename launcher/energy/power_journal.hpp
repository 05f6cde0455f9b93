// gpurun::energy power journal — the original power limits (and locked clocks) gpurun changed,
// kept in a file so that they are put back at the next start of any gpurun on the machine
// even when gpurun and its power guard were both killed (kill -9) or the machine rebooted
// (docs/energy.md#power-limits). The power guard writes an entry before gpurun changes a GPU
// and removes it once the GPU is back; recover_journal() restores what no live guard holds.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "energy/nvml.hpp"

namespace gpurun::energy {

/// One GPU gpurun changed.
struct JournalEntry {
  std::string host;            ///< gethostname() of the machine (a journal in a shared home)
  std::string uuid;            ///< "GPU-…"
  unsigned original_mw = 0;    ///< its power limit before the change, mW (0: not changed)
  bool clocks_locked = false;  ///< gpurun locked its GPU clocks: reset them
  int64_t guard_pid = 0;       ///< the guard that holds it (for messages)
  int64_t since_ms = 0;        ///< when it was written (Unix time, ms)

  friend bool operator==(const JournalEntry&, const JournalEntry&) = default;
};

/// The machine-wide lock of a GPU's power settings, held by the guard of the gpurun that
/// changes them: the abstract socket `@gpurun-power/<uuid>` (gpurun/abstract_lock.hpp).
inline std::string gpu_lock_name(const std::string& uuid) {
  return "gpurun-power/" + uuid;
}

/// `$GPURUN_POWER_JOURNAL` when set; else /var/lib/gpurun/power-journal.json when that
/// directory exists or can be made (root); else `$XDG_STATE_HOME/gpurun/power-journal.json`
/// (default ~/.local/state). Not /run or /tmp: the journal must outlive a reboot.
std::filesystem::path journal_path();

/// This machine's name (gethostname).
std::string host_name();

/// The entries of `path` (a missing file: none). Throws gpurun::Error naming the file when it
/// cannot be read or is not a journal. Blocks on the file (a shared flock).
std::vector<JournalEntry> read_journal(const std::filesystem::path& path);

/// Adds `e` (replacing an entry of the same host and UUID, keeping its original_mw when it
/// has one: the first original wins) or, with `remove`, drops the entry of e.host and e.uuid
/// (when e.guard_pid ≠ 0: only one that guard holds, not another job's written since).
/// Makes the directory (0700) when missing; rewrites the file through a temporary file and
/// rename() under an exclusive flock of `<path>.lock`, so concurrent writers never lose an
/// entry. Throws gpurun::Error naming the file. Blocks on the file.
void update_journal(const std::filesystem::path& path, const JournalEntry& e, bool remove = false);

/// At a gpurun's start: for each entry of this host whose GPU no live guard holds (its lock
/// `@gpurun-power/<uuid>` is free: its guard died, or the machine rebooted), sets the original
/// limit back and resets locked clocks, then drops the entry. Entries of a GPU a guard holds
/// now are another job's, left alone. Returns one sentence per GPU handled, e.g. "restored
/// GPU-… to 700 W (left changed by a gpurun whose guard, pid 123, was killed)". A GPU that
/// cannot be restored (no permission, not found) keeps its entry and gets a sentence saying
/// why. Never throws: an unreadable journal is one sentence.
std::vector<std::string> recover_journal(const Nvml& nvml, const std::filesystem::path& path);

}  // namespace gpurun::energy
