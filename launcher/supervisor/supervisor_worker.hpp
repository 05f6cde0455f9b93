// Supervisor's per-worker records (its Stream, Worker and Failure), shared by the
// supervisor's sources: supervisor.cpp (attempts, processes, exits, the summary),
// supervisor_output.cpp (streams and logs), supervisor_signals.cpp (signals, preemption,
// stopping at a boundary). Internal header.
#pragma once

#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "supervisor/line_splitter.hpp"
#include "supervisor/supervisor.hpp"

namespace gpurun::supervisor {

/// One output stream of a worker: its splitter, log file and console routing.
struct Supervisor::Stream {
  bool open = true;  // not yet at EOF
  LineSplitter lines;
  UniqueFd file;
  std::string path;     // the log file's path (for the write-failure warning)
  bool console = true;  // shown on the console
  bool drawn = false;   // a redraw of this stream is the console's open line
};

struct Supervisor::Worker {
  int rank = 0;
  int local_rank = 0;
  int pid = -1;
  std::unique_ptr<WorkerProcess> proc;
  std::optional<ExitStatus> exit;
  Stream out;
  Stream err;
  std::deque<std::string> err_tail;
  std::string prefix;
  std::string error_file;
  std::string start_error;          // why the process could not be started (no pid, no exit status)
  bool killed = false;              // kill_slot() ended it: the controller's own doing, no failure
  WallClock::time_point exited_at;  // when on_exit reaped it
  std::string oom;  // a SIGKILL the memory cgroup counted as an OOM kill: oom_kill_sentence
};

struct Supervisor::Failure {
  int rank = 0;
  int local_rank = 0;
  int pid = -1;
  ExitStatus status;
  std::string reason;
  std::string error_file;
  std::string start_error;  // non-empty: the worker never ran
  std::vector<std::string> tail;
  bool peer = false;  // stop_for_peer: another node failed (no local summary)
  // The root cause's process was then ended by gpurun's teardown (it had written its error
  // file): its status is the signal, the job's is the first failure's (`status`).
  std::string ended_by_teardown;
  // The other workers that failed on their own in this attempt, one line each (the summary's
  // "also failed"), when the root cause is not the first one reaped or more than one failed.
  std::vector<std::string> others;
};

}  // namespace gpurun::supervisor
