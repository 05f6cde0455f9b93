// gpurun::energy::PowerGuard — restores GPUs' original power limits however gpurun ends,
// kill -9 included: a helper process (`gpurun __power-guard`, in its own session, ignoring
// SIGINT/SIGTERM/SIGHUP) is told each GPU's original limit over a pipe *before* gpurun
// changes it; when the pipe closes (gpurun exited or died) the helper restores every limit
// it was told about that gpurun did not report as restored, then exits.
#pragma once

#include <sys/types.h>
#include <optional>
#include <string>
#include <vector>

#include "energy/nvml.hpp"
#include "gpurun/helper_process.hpp"

namespace gpurun::energy {

/// One GPU's original limit.
struct OriginalLimit {
  std::string uuid;
  unsigned milliwatts = 0;
};

/// Owned by the supervisor's energy monitor. Not thread-safe.
class PowerGuard {
 public:
  /// Starts the helper: `exe` (normally /proc/self/exe) with argv {exe, "__power-guard"},
  /// the pipe's read end as fd 3. Throws gpurun::Error when it cannot start.
  explicit PowerGuard(const std::string& exe);
  /// Closes the pipe and waits for the helper (it restores what is still recorded).
  ~PowerGuard();
  PowerGuard(const PowerGuard&) = delete;
  PowerGuard& operator=(const PowerGuard&) = delete;

  /// Records `limit` with the helper and waits for its acknowledgement (blocks ≤ 10 s), so the
  /// original is safe before the caller changes anything. A second remember() of a UUID the
  /// helper still holds keeps the first value (the original). Throws gpurun::Error when the
  /// helper is gone or does not answer.
  void remember(const OriginalLimit& limit);
  /// Tells the helper `uuid` is back at its original limit (nothing to restore); waits for the
  /// acknowledgement like remember().
  void forget(const std::string& uuid);
  /// Tells the helper gpurun is about to lock `uuid`'s GPU clocks: it resets them when gpurun
  /// ends without forget(). Waits like remember(); throws the same.
  void remember_clocks(const std::string& uuid);
  /// Closes the pipe and waits (≤ 30 s) for the helper to restore and exit. Returns its exit
  /// status (0: every limit restored, 1: a restore failed), or -1 when it could not be waited
  /// for (still running after 30 s — it goes on in its own session — or reaped elsewhere).
  /// Idempotent (later calls return the first result); the destructor calls it.
  int finish();
  pid_t pid() const { return pid_; }
  /// false once the helper has died (its end of the pipe hung up). Never blocks.
  bool alive() const;

 private:
  std::optional<HelperProcess> guard_;
  pid_t pid_ = -1;
  int to_guard_ = -1;    // write end
  int from_guard_ = -1;  // acks
  bool finished_ = false;
  int exit_status_ = -1;

  void request(const std::string& line);  // writes one command line, reads "ok"
};

/// The helper's main (`gpurun __power-guard`): ignores SIGINT, SIGTERM, SIGHUP and SIGPIPE,
/// reads command lines from fd 3 ("remember <uuid> <mW>", "clocks <uuid>", "forget <uuid>"),
/// records each GPU in the power journal (power_journal.hpp) before acknowledging, and answers each
/// with "ok" (or "error <sentence>") on fd 4, until EOF on fd 3. Then it opens NVML (same
/// environment: GPURUN_NVML_LIBRARY), resets locked clocks and sets each still-recorded GPU
/// back to its limit (and drops its journal entry),
/// writing one line per GPU to stderr ("gpurun power guard: restored GPU-… to 700 W", or why
/// not). Returns the process exit status: 0, or 1 when any restore failed.
int power_guard_main();

}  // namespace gpurun::energy
