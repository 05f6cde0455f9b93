// gpurun::supervisor::SlotController — the seam through which elastic mode
// (gpurun::control::ElasticController, docs/control-protocol.md) decides which
// slots run and how their exits count. Without one the Supervisor behaves as a
// plain torchrun replacement.
#pragma once

#include <string>

#include "supervisor/process_spawner.hpp"

namespace gpurun::supervisor {

/// Called on the supervisor's io thread only.
class SlotController {
 public:
  virtual ~SlotController() = default;
  /// Attempt `attempt` begins with no process running: start the slots that should run
  /// (Supervisor::spawn_slot).
  virtual void on_attempt_start(int attempt) = 0;
  /// The current process of slot `local_rank` was reaped. `can_restart`: the supervisor
  /// would restart the whole set for a failure. Return true when elastic mode absorbs the
  /// exit (a parked leaver, or a failure that only removes the slot): no teardown.
  virtual bool on_worker_exit(int local_rank, ExitStatus status, bool can_restart) = 0;
  /// True while the job must stay up although no process runs (paused).
  virtual bool holds_job_open() const = 0;
  /// True while the job is paused (no member trains; it waits for a resume): a stop signal then
  /// ends the waiting processes at once instead of at a boundary. Default: holds_job_open()
  /// (one node: the job is held open only while paused).
  virtual bool paused() const { return holds_job_open(); }
  /// True when a member finished training and no worker failed after that (decides the exit
  /// status after absorbed failures).
  virtual bool succeeded() const = 0;
  /// Why the elastic job failed when succeeded() is false (the end of the failure line).
  virtual std::string failure_summary() const { return "every elastic worker failed"; }
  /// Non-empty when the job failed whatever its workers' exit statuses say: the elastic job's
  /// training state is lost (its workers may all have exited 0, told to). gpurun then never
  /// exits 0: it exits with the first failed worker's status, else 1.
  virtual std::string job_failed() const { return {}; }
  /// SIGHUP: reload the config.
  virtual void on_reload_request() = 0;
  /// The preemption-warning signal: every worker sees a checkpoint request at its next
  /// boundary (the same one on every rank).
  virtual void on_checkpoint_request() {}
  /// SIGTERM (docs/cli.md#preemption): stop every worker at its next boundary (their loops
  /// end; they exit 0). Returns false when it cannot (no boundary will come: paused).
  virtual bool on_stop_request(const std::string& /*why*/) { return false; }
};

}  // namespace gpurun::supervisor
