// Real worker processes via Boost.Process v2, with stdout/stderr on Asio pipes.
#pragma once

#include <sys/resource.h>

#include <memory>
#include <optional>

#include <boost/asio/io_context.hpp>

#include "supervisor/process_spawner.hpp"

namespace gpurun::supervisor {

/// Settings of PosixSpawner; the defaults leave the worker's limits as inherited.
struct PosixSpawnerOptions {
  /// RLIMIT_NOFILE each worker gets, e.g. the limit gpurun was started with before it
  /// raised its own soft limit (fd_limit.hpp). nullopt: inherit gpurun's.
  std::optional<rlimit> worker_nofile;
};

/// Spawns each worker as the leader of a new process group (setpgid(0,0)) with
/// PR_SET_PDEATHSIG=SIGKILL, so it dies with gpurun even after `kill -9`.
/// If gpurun died between clone and prctl, the child exits at once (127).
/// The child gets default signal dispositions and an empty signal mask; stdin
/// is inherited, stdout/stderr are pipes read on `io`'s thread, or pseudo-terminals when the
/// request asks (stdout_pty/stderr_pty): raw mode (no ONLCR, no echo: the bytes are the
/// worker's), the window size of gpurun's own fd 1/2, not the worker's controlling terminal;
/// the hang-up at the master (EIO once every slave fd is closed) counts as end of stream,
/// after every byte written before it has been delivered. No other
/// descriptor of gpurun is inherited. Spawning costs O(1) in the number of workers
/// already running (clone(CLONE_VM|CLONE_VFORK), not fork: see posix_spawner.cpp).
/// Grandchildren are not covered by the death signal: they die with gpurun only
/// if the worker forwards it (docs/cli.md, "Process lifetime").
///
/// Constructing one makes gpurun a child subreaper (PR_SET_CHILD_SUBREAPER): processes a
/// worker leaves behind are re-parented to gpurun, which reaps them (whenever a worker
/// exits and whenever group_alive() is asked), so a process group whose remaining
/// members have all died is reported empty without waiting for init.
class PosixSpawner : public ProcessSpawner {
 public:
  explicit PosixSpawner(boost::asio::io_context& io, PosixSpawnerOptions options = {});
  ~PosixSpawner() override;
  std::unique_ptr<WorkerProcess> spawn(const SpawnRequest& request,
                                       WorkerCallbacks callbacks) override;

  struct Reaper;

 private:
  boost::asio::io_context& io_;
  PosixSpawnerOptions options_;
  std::shared_ptr<Reaper> reaper_;
};

}  // namespace gpurun::supervisor
