// The OS seam of the supervisor: starting a worker process and signalling its
// process group. PosixSpawner is the real one, FakeSpawner the test double.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "supervisor/worker_env.hpp"

namespace gpurun::supervisor {

/// How a process ended: exited with `code`, or killed by `signal` (then code is unused).
struct ExitStatus {
  ExitStatus() = default;
  ExitStatus(int exit_code, int signal_number, std::string why = {})
      : code(exit_code), signal(signal_number), cause(std::move(why)) {}

  int code = 0;
  int signal = 0;
  /// What gpurun learned of the death beyond the status, said after it: "killed by the
  /// kernel's out-of-memory killer (host memory; cgroup … oom_kill 1)" (root_cause.hpp).
  std::string cause;

  bool success() const { return signal == 0 && code == 0; }
  /// The shell's convention: the code, or 128 + signal number.
  int shell_code() const { return signal != 0 ? 128 + signal : code; }
  /// "exit code 7" or "signal SIGSEGV (11)", then ": <cause>" when there is one.
  std::string describe() const;
};

/// Name of a signal, e.g. "SIGSEGV"; "signal 42" for unnamed ones.
std::string signal_name(int sig);

enum class StreamId { kStdout = 1, kStderr = 2 };

/// What to start. `argv[0]` is the resolved executable path.
struct SpawnRequest {
  int rank = 0;
  int local_rank = 0;
  std::vector<std::string> argv;
  EnvMap env;
  /// Give the worker a pseudo-terminal instead of a pipe as its stdout / stderr (the
  /// supervisor asks for one when that stream is shown on a terminal), so isatty() is true in
  /// the worker and progress bars redraw. The spawner falls back to a pipe when no
  /// pseudo-terminal can be opened.
  bool stdout_pty = false;
  bool stderr_pty = false;
  /// Columns the supervisor puts before each of the worker's lines (its console prefix,
  /// `[rank0]: ` = 9): a pseudo-terminal is that much narrower than gpurun's own terminal, so
  /// a progress bar sized to the terminal's width fits on one line after the prefix.
  int pty_margin_columns = 0;
};

/// Notifications from one worker; all run on the supervisor's io thread.
struct WorkerCallbacks {
  std::function<void(StreamId, std::string_view bytes)> on_output;
  std::function<void(StreamId)> on_stream_closed;  ///< EOF on that stream (once each)
  std::function<void(ExitStatus)> on_exit;         ///< the worker process was reaped (once)
};

/// A started worker, the leader of its own process group (pgid == pid).
/// Destroying the handle stops notifications; it does not signal the process.
class WorkerProcess {
 public:
  virtual ~WorkerProcess() = default;
  virtual int pid() const = 0;
  /// Sends `sig` to the worker's whole process group. Returns false when the
  /// group has no process left (ESRCH); throws ProcessError on other failures.
  virtual bool signal_group(int sig) = 0;
  /// Whether any process of the group is still alive (signal 0 probe).
  virtual bool group_alive() const = 0;
  /// gpurun's terminal changed size (SIGWINCH): the worker's pseudo-terminals, if any, get the
  /// new size less the request's pty_margin_columns, and its process group gets SIGWINCH (a
  /// pseudo-terminal that is nobody's controlling terminal sends none itself). No-op without one.
  virtual void terminal_resized() {}
};

/// Starts workers. Throws ProcessError naming the rank and command when a
/// worker cannot be started (the exec failure's errno included).
class ProcessSpawner {
 public:
  virtual ~ProcessSpawner() = default;
  virtual std::unique_ptr<WorkerProcess> spawn(const SpawnRequest& request,
                                               WorkerCallbacks callbacks) = 0;
};

}  // namespace gpurun::supervisor
