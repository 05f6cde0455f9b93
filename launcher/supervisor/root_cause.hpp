// Which worker's failure is an attempt's root cause (docs/errors.md, "The real cause wins"),
// and whether the kernel's out-of-memory killer ended a worker (the memory cgroup's oom_kill
// count). Pure functions over records, plus the one file read of the OOM count (a seam: the
// paths are given).
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "supervisor/error_file.hpp"
#include "supervisor/process_spawner.hpp"

namespace gpurun::supervisor {

using WallClock = std::chrono::system_clock;

/// One worker of an attempt as the supervisor saw it end.
struct FailureRecord {
  int rank = 0;
  int local_rank = 0;
  int pid = -1;
  ExitStatus status;
  WallClock::time_point reaped_at;  ///< when gpurun reaped it
  /// Its own error file's report (torch's @record), if it wrote one; `report->written_at`
  /// is when.
  std::optional<WorkerErrorReport> report;
  /// Its last stderr lines, joined with "\n" (a program without @record prints its error there).
  std::string stderr_tail;
  /// Reaped after gpurun began to stop the workers (SIGTERM to every group).
  bool after_teardown = false;
};

/// Within this much of the earliest failure, a rank whose own error is not a connection or
/// teardown error is preferred to one whose error is (docs/errors.md, "The root cause"); the
/// supervisor holds its teardown this long after such a first failure (its teardown_hold) so
/// that the rank can fail within it.
inline constexpr std::chrono::seconds kRootCauseWindow{5};

/// True when `text` is a collective or store failing because a peer went away: "Connection
/// closed by peer", "Connection reset by peer", "Broken pipe", an NCCL abort, a socket timeout
/// (the marks of worker_runtime/python/gpurun/_comm.py's is_comm_failure, as gpurun sees them
/// in an error file or on stderr). A DataLoader's own timeout is not.
bool is_teardown_error(std::string_view text);

/// The error a record is judged by, in one line: the last line of its error file's message,
/// else of its stderr, at most 200 bytes (its end kept); "" when it said nothing.
std::string error_line(const FailureRecord& r);

/// Whether the record's error (its error file's message, else its stderr) is a teardown error.
bool has_teardown_error(const FailureRecord& r);

/// An error message as said: trailing blanks dropped, and "KeyboardInterrupt: " (torch's
/// "{type}: {str(e)}" of an exception without a message) is "KeyboardInterrupt".
std::string tidy_message(std::string_view message);

/// When the record's worker failed: its error file's time when it wrote one (the error comes
/// before the exit), else its reap time.
WallClock::time_point failed_at(const FailureRecord& r);

/// Whether the record is a failure of its own: a non-zero exit, not a SIGTERM/SIGKILL death
/// after gpurun began the teardown (that is gpurun's doing) unless it wrote an error file
/// before.
bool is_own_failure(const FailureRecord& r, std::optional<WallClock::time_point> teardown_at);

/// The index in `records` of the root cause: among the own failures, the earliest in time
/// (ties: the lower rank); but when that one's error (its error file's message, else its
/// stderr) is a teardown error, the earliest own failure within kRootCauseWindow of it whose
/// error is not one (a rank that tore its group down before it raised: its peers fail first,
/// of a closed connection). `first_observed` (the failure gpurun saw first) when no record is
/// an own failure. Never throws.
std::size_t choose_root_cause(const std::vector<FailureRecord>& records,
                              std::optional<WallClock::time_point> teardown_at,
                              std::size_t first_observed);

/// The "oom_kill N" count of a cgroup v2 memory.events file (or a cgroup v1
/// memory.oom_control, which has the same line); nullopt when the file cannot be read or has
/// no such line. Reads at most 64 KiB; never blocks on a special file; never throws.
std::optional<std::uint64_t> read_oom_kill_count(const std::string& path);

/// The memory cgroup files of the process whose /proc/<pid>/cgroup is `proc_cgroup`: the v2
/// "0::/path" gives `root`/path/memory.events, a v1 "N:memory:/path" gives
/// `root`/memory/path/memory.oom_control. The root cgroup ("/") has no such file: skipped.
std::vector<std::string> memory_event_files(std::string_view proc_cgroup,
                                            const std::string& root = "/sys/fs/cgroup");

/// OOM kills counted by the memory cgroups of gpurun and its workers: a baseline before the
/// job, read again at a SIGKILL death.
class OomWatch {
 public:
  /// Watches `files` (paths as memory_event_files gives them; a test passes a fake file).
  explicit OomWatch(std::vector<std::string> files = {});
  /// gpurun's own cgroup's files (/proc/self/cgroup), nothing when it cannot be read.
  static OomWatch for_self();
  /// Adds the cgroup files of worker `pid` (its /proc/<pid>/cgroup, read while it runs) and
  /// takes their baseline; files already watched are kept as they are.
  void add_process(int pid);
  /// Takes the baseline of every watched file.
  void baseline();
  /// When a watched file's count rose above its baseline: "cgroup <dir> oom_kill N" (N the
  /// new count) of the first such file; nullopt otherwise.
  std::optional<std::string> rose() const;

 private:
  struct Watched {
    std::string path;
    std::optional<std::uint64_t> base;
  };
  std::vector<Watched> files_;
};

/// The sentence for an OOM-killed worker: "killed by the kernel's out-of-memory killer (host
/// memory; cgroup <dir> oom_kill N)".
std::string oom_kill_sentence(const std::string& counted);

/// When `text` (an error file's message or a stderr tail) is a CUDA out-of-memory error
/// ("CUDA out of memory", torch.OutOfMemoryError, cudaErrorMemoryAllocation): "the GPU ran out
/// of device memory (CUDA out of memory), not the host"; nullopt otherwise.
std::optional<std::string> device_oom_sentence(std::string_view text);

}  // namespace gpurun::supervisor
