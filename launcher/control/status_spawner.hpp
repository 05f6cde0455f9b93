// gpurun::control::StatusSpawner — keeps <run_dir>/status.json of a plain run (no
// --config) current, so `gpurun status` finds every running job. A ProcessSpawner
// decorator: it forwards every spawn to the real spawner and records each slot's
// process start and exit. Elastic runs write status.json from their scheduler instead.
// Reference: docs/control-protocol.md#gpurun-status.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "control/status.hpp"
#include "supervisor/console.hpp"
#include "supervisor/process_spawner.hpp"

namespace gpurun::control {

/// Runs on the supervisor's io thread (spawn() and every callback). `inner` and `console`
/// must outlive it. Slot states of a plain run: STARTING (no process yet) -> ACTIVE (its
/// process runs) -> EXITED (exit 0) or FAILED (non-zero exit, a signal, or it could not
/// start); a restart attempt starts the slot again (ACTIVE). Generation is always 0.
class StatusSpawner : public supervisor::ProcessSpawner {
 public:
  /// `nproc` slots (local ranks 0..nproc-1); `snapshot` names the run (config_path empty).
  /// Writes the first status.json (every slot STARTING).
  /// status.json writes are coalesced on `io` (StatusWriter).
  StatusSpawner(boost::asio::io_context& io, supervisor::ProcessSpawner& inner,
                supervisor::Console& console, int nproc, StatusSnapshot snapshot);

  std::unique_ptr<supervisor::WorkerProcess> spawn(const supervisor::SpawnRequest& request,
                                                   supervisor::WorkerCallbacks callbacks) override;

  const RunStatus& status() const { return status_; }
  /// Rewrites status.json (coalesced): the energy columns change without process events.
  void publish_status() { write(); }

 private:
  void set(int local_rank, SlotState to, int pid, const std::string& reason);
  void write();

  supervisor::ProcessSpawner& inner_;
  supervisor::Console& console_;
  StatusSnapshot snapshot_;
  RunStatus status_;
  std::unique_ptr<StatusWriter> writer_;
  std::shared_ptr<int> alive_ = std::make_shared<int>(0);  // callbacks check it via weak_ptr
};

}  // namespace gpurun::control
