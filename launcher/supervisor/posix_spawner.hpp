// Real worker processes via Boost.Process v2, with stdout/stderr on Asio pipes.
#pragma once

#include <boost/asio/io_context.hpp>

#include "supervisor/process_spawner.hpp"

namespace gpurun::supervisor {

/// Spawns each worker as the leader of a new process group (setpgid(0,0)) with
/// PR_SET_PDEATHSIG=SIGKILL, so it dies with gpurun even after `kill -9`.
/// If gpurun died between fork and prctl, the child exits at once (127).
/// The child gets default signal dispositions and an empty signal mask; stdin
/// is inherited, stdout/stderr are pipes read on `io`'s thread.
/// Grandchildren are not covered by the death signal: they die with gpurun only
/// if the worker forwards it (docs/cli.md, "Process lifetime").
class PosixSpawner : public ProcessSpawner {
 public:
  explicit PosixSpawner(boost::asio::io_context& io) : io_(io) {}
  std::unique_ptr<WorkerProcess> spawn(const SpawnRequest& request,
                                       WorkerCallbacks callbacks) override;

 private:
  boost::asio::io_context& io_;
};

}  // namespace gpurun::supervisor
