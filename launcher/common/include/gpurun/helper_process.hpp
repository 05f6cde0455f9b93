// gpurun::HelperProcess — the one way gpurun starts a short-lived helper program and waits
// for it: a [notify] command, `scontrol requeue`, the power-limit guard, gnuplot, nvidia-smi.
// (Workers are started by supervisor::PosixSpawner, which has rules of its own.)
//
// Every helper starts with an empty signal mask and every signal at its default disposition
// (gpurun blocks signals in its threads and ignores SIGPIPE and SIGXFSZ; neither may leak into
// a program that expects a normal start), except the signals HelperOptions::blocked_signals
// names. Descriptors other than 0–2 and HelperOptions::fds are closed in the child, marked
// close-on-exec or not. Each helper is registered, from its spawn until it is reaped or
// released, as a child its owner waits for: reap_children_except() leaves it alone.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "gpurun/error.hpp"
#include "gpurun/unique_fd.hpp"

namespace gpurun {

/// Where one of a helper's standard streams (0, 1 or 2) goes.
struct HelperStream {
  enum class Kind {
    kInherit,  ///< gpurun's own
    kNull,     ///< /dev/null (read-only for stdin, write-only for stdout and stderr)
    kPipe,     ///< a new pipe; the caller's end is HelperProcess::pipe(fd), close-on-exec
    kFile,     ///< `path`, created or truncated (mode 0644)
    kFd,       ///< a copy of the caller's descriptor `fd` (the caller keeps and closes its own)
    kStdout,   ///< stderr only: the same as the helper's stdout (2>&1)
  };
  Kind kind = Kind::kInherit;
  std::string path;  // kFile
  int fd = -1;       // kFd

  static HelperStream inherit() { return {}; }
  static HelperStream null() { return {Kind::kNull, {}, -1}; }
  static HelperStream pipe() { return {Kind::kPipe, {}, -1}; }
  static HelperStream file(std::string path) { return {Kind::kFile, std::move(path), -1}; }
  static HelperStream from_fd(int fd) { return {Kind::kFd, {}, fd}; }
  static HelperStream to_stdout() { return {Kind::kStdout, {}, -1}; }
};

/// Which process group the helper runs in.
enum class HelperGroup {
  kInherit,     ///< gpurun's: Ctrl-C and a group kill reach it too
  kOwnGroup,    ///< its own group (pgid = its pid): kill() reaches what it started as well
  kOwnSession,  ///< its own session and group: no terminal, no signal aimed at gpurun's group
};

/// What to start and how. Defaults: gpurun's environment and streams, gpurun's group.
struct HelperOptions {
  /// argv[0] is the program: a path, or with `search_path` a name looked up on $PATH (as
  /// execvp does). Must not be empty.
  std::vector<std::string> argv;
  bool search_path = false;
  /// gpurun's environment, or none; then `environment` ("NAME=value"), each replacing an
  /// inherited NAME.
  bool inherit_environment = true;
  std::vector<std::string> environment;
  HelperStream stdin_stream, stdout_stream, stderr_stream;
  HelperGroup group = HelperGroup::kInherit;
  /// Signals blocked when the helper starts, their dispositions left as gpurun's (the helper
  /// sets its own, e.g. SIG_IGN, then unblocks). Every other signal starts unblocked at SIG_DFL.
  std::vector<int> blocked_signals;
  /// {gpurun's descriptor, the helper's number for it}, e.g. {pipe_end, 3}: dup'd in the child
  /// (not close-on-exec there). Any numbering works, a swap included.
  std::vector<std::pair<int, int>> fds;
};

/// The helper could not be started, or waiting for it failed. what() names the program and
/// the error; error_number() is the errno (ENOENT: no such program; ECHILD: reaped elsewhere).
class HelperError : public ProcessError {
 public:
  HelperError(const std::string& what, int error_number)
      : ProcessError(what), error_number_(error_number) {}
  int error_number() const { return error_number_; }

 private:
  int error_number_;
};

/// One running helper. Move-only; not thread-safe (one owner thread).
class HelperProcess {
 public:
  /// Starts it (posix_spawn; blocks for the exec only). Throws HelperError "cannot start
  /// <argv[0]>: <strerror>" when the program cannot be run (not found, not executable, ...),
  /// or when a pipe or a kFile cannot be made.
  explicit HelperProcess(const HelperOptions& options);
  /// Still running and not released: SIGKILL (to its group when it has its own) and reaped.
  ~HelperProcess();
  HelperProcess(HelperProcess&& other) noexcept;
  HelperProcess& operator=(HelperProcess&& other) noexcept;
  HelperProcess(const HelperProcess&) = delete;
  HelperProcess& operator=(const HelperProcess&) = delete;

  pid_t pid() const { return pid_; }
  /// The caller's end of a kPipe stream (`fd` 0: the write end; 1, 2: read ends), or an empty
  /// UniqueFd. The caller may take it (std::move) or set O_NONBLOCK on it.
  UniqueFd& pipe(int fd) { return pipes_[fd]; }

  /// Reads the stdout pipe to EOF (blocks until the helper and everything it started closed
  /// it). Throws HelperError when reading fails.
  std::string read_stdout();

  /// Never blocks: its wait status (as waitpid's; exit code via WEXITSTATUS) once it exited,
  /// else nullopt. Throws HelperError (ECHILD: reaped by someone else; the process is then
  /// given up). After an exit, later calls return the same status.
  std::optional<int> try_wait();
  /// Blocks at most `timeout` (poll on a pidfd; EINTR retried): as try_wait() once it exited,
  /// nullopt when still running.
  std::optional<int> wait_for(std::chrono::milliseconds timeout);
  /// Blocks until it exits; as try_wait(). -1 when it was released.
  int wait();
  /// SIGKILL to it (to its group when it has its own: what it started too), then reaps it.
  /// Returns the wait status. No-op returning the status when it already exited (-1 when it
  /// was released).
  int kill_and_wait();
  /// Gives it up without a kill or a wait: it goes on by itself (no longer registered, so
  /// reap_children_except may reap it). Used for a helper meant to outlive its wait.
  void release();

 private:
  void reaped(int status);
  void end() noexcept;  // the destructor's kill and reap
  pid_t pid_ = -1;
  HelperGroup group_ = HelperGroup::kInherit;
  std::string name_;
  UniqueFd pipes_[3];
  UniqueFd pidfd_;
  std::optional<int> status_;
  bool released_ = false;
};

/// The stdout of `argv` (argv[0] looked up on PATH; stdin gpurun's, stderr to /dev/null) once
/// it exited with status 0; nullopt when it cannot start (not installed) or fails. Without
/// `timeout` it blocks until it exits (like popen). With one it runs in its own process group
/// and stdin /dev/null, and one still running after `timeout` is killed with its group (nullopt);
/// its output must then fit the pipe (64 KiB) until it exits. For probes such as
/// `nvidia-smi -L` or a Python interpreter's torch version.
std::optional<std::string> output_of(
    const std::vector<std::string>& argv,
    std::optional<std::chrono::milliseconds> timeout = std::nullopt);

/// Reaps (waitpid WNOHANG) every direct child of this process (/proc/self/task/*/children)
/// that is neither in `keep` nor a HelperProcess whose owner waits for it, under the helper
/// registry's lock, so that no helper's exit is taken from its owner. Thread-safe.
void reap_children_except(const std::set<int>& keep);

}  // namespace gpurun
