// gpurun::supervisor preemption helpers — the preemption-warning signal's name, the stop timing
// under Slurm (KillWait) and `scontrol requeue` (docs/cli.md#preemption).
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <string_view>

#include "supervisor/options.hpp"
#include "supervisor/worker_env.hpp"

namespace gpurun::supervisor {

/// "USR2", "SIGUSR2", "usr2" or "12" -> the signal number; nullopt for an unknown name or a
/// number outside 1..64. Does not say whether gpurun can use it (see preempt_signal_flag).
std::optional<int> signal_from_name(std::string_view text);

/// --preempt-signal's value: a signal name or number, or "none" (0). Throws UsageError naming
/// the flag for an unknown signal and for the ones gpurun itself uses (INT, TERM, QUIT, HUP,
/// CHLD, PIPE, XFSZ) or cannot catch (KILL, STOP).
int preempt_signal_flag(std::string_view flag, std::string_view value);

/// Slurm's KillWait (slurmd's delay between SIGTERM and SIGKILL at a job's end), read from
/// slurm.conf without scontrol: $SLURM_CONF, else /etc/slurm/slurm.conf, else
/// /etc/slurm-llnl/slurm.conf (the first that exists; `KillWait=N`, case-insensitive, comments
/// and Include lines ignored). nullopt when no file names it (Slurm's default then: 30 s).
/// `source` (optional) receives the file read.
std::optional<std::chrono::seconds> slurm_kill_wait(const EnvMap& env,
                                                    std::string* source = nullptr);

/// The stop timing gpurun uses: --stop-timeout and --grace-period as given, else their
/// defaults. Outside Slurm (no SLURM_JOB_ID): 30 s each. Under Slurm the defaults share
/// KillWait minus 2 s (the margin for gpurun's own exit): half each when neither flag is
/// given, the rest of the budget (at least 0 s / 1 s) when one is. `note` says what was
/// decided (printed once at start under Slurm); a warning when the given values exceed KillWait.
struct StopTiming {
  std::chrono::milliseconds stop_timeout{30'000};
  std::chrono::milliseconds grace_period{30'000};
  std::string note;  ///< one console line, empty outside Slurm
};
StopTiming stop_timing(const Options& options, const EnvMap& env);

/// The outcome of --requeue.
struct RequeueResult {
  bool requeued = false;
  std::string message;  ///< one console line (without "gpurun: ")
};

/// Runs `scontrol requeue $SLURM_JOB_ID` (scontrol looked up in env's PATH) and waits for it
/// (at most `timeout`, then it is killed). Says clearly when there is no SLURM_JOB_ID or no
/// scontrol (e.g. inside a container) or when scontrol fails (its exit status). Blocks.
RequeueResult requeue_job(const EnvMap& env,
                          std::chrono::milliseconds timeout = std::chrono::seconds(20));

/// gpurun's exit status after --requeue requeued the job (sysexits' EX_TEMPFAIL: try again).
inline constexpr int kExitRequeued = 75;

}  // namespace gpurun::supervisor
