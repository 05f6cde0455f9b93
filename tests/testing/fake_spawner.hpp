// Test double of ProcessSpawner: no real processes; tests drive exits and output.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include <boost/asio/io_context.hpp>

#include "supervisor/process_spawner.hpp"

namespace gpurun::supervisor {

/// Records every spawn and every signal. Exits and output happen when the test
/// calls exit()/output(), or (posted on `io`) when a process is signalled and
/// its `dies_on` says so. Pids start at 1000 and increase.
class FakeSpawner : public ProcessSpawner {
 public:
  struct Proc {
    SpawnRequest request;
    WorkerCallbacks callbacks;
    int pid = 0;
    std::vector<int> signals;  ///< signals received, in order
    bool exited = false;       ///< on_exit delivered
    bool group_alive =
        true;  ///< what group_alive() answers; cleared on exit unless `leaves_children`
    bool leaves_children = false;  ///< group stays alive after exit until SIGKILL
    bool ignores_sigterm = false;  ///< only SIGKILL ends it
    bool detached = false;         ///< the supervisor dropped its handle
  };

  explicit FakeSpawner(boost::asio::io_context& io) : io_(io) {}

  std::unique_ptr<WorkerProcess> spawn(const SpawnRequest& request,
                                       WorkerCallbacks callbacks) override;

  /// Makes process `index` (spawn order) write `text` on `stream`.
  void output(std::size_t index, StreamId stream, std::string_view text);
  /// Ends process `index`: closes both streams, then reports `status`.
  void exit(std::size_t index, ExitStatus status);

  /// Every process spawned so far, in spawn order (all attempts).
  std::vector<std::shared_ptr<Proc>> procs;
  /// Called before each spawn; return true to make it throw ProcessError.
  std::function<bool(const SpawnRequest&)> fail_spawn;
  /// Applied to each new Proc (e.g. set ignores_sigterm).
  std::function<void(Proc&)> configure;

 private:
  void end(const std::shared_ptr<Proc>& p, ExitStatus status);
  boost::asio::io_context& io_;
  int next_pid_ = 1000;
};

}  // namespace gpurun::supervisor
