// gpurun::control — Slurm's SIGTERM in a worker process (docs/cli.md#preemption): the one handler
// both runtimes install (the C++ runtime directly, the Python package through
// libgpurun_worker.so).
#pragma once

namespace gpurun::control {

/// Under Slurm (SLURM_JOB_ID set) with gpurun's preemption directory (GPURUN_PREEMPT_DIR set),
/// slurmstepd sends SIGTERM to every process of the step — the workers as well as gpurun, which
/// asks them to stop at their next boundary. Installs a SIGTERM handler (SA_SIGINFO |
/// SA_RESTART) unless the program has one of its own: a SIGTERM from the parent (gpurun, after
/// --stop-timeout) keeps the default action (the process ends at once); one from anyone else
/// only counts (external_term_seen()), so the worker reaches that boundary. Returns true when
/// installed (false: not under Slurm and gpurun, or the program handles SIGTERM). Idempotent;
/// async-signal-safe handler; not thread-safe against the program's own sigaction calls.
bool install_external_term_handler();

/// Whether a SIGTERM not from the parent arrived since install_external_term_handler().
bool external_term_seen();

}  // namespace gpurun::control
