// Reads the TORCHELASTIC_ERROR_FILE a failed worker may have written
// (torch's @record decorator) for the root-cause summary.
#pragma once

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace gpurun::supervisor {

/// What a worker reported about its own failure.
struct WorkerErrorReport {
  std::string message;    ///< the error message (e.g. a Python exception line)
  std::string traceback;  ///< extraInfo.py_callstack, empty if absent
  std::string timestamp;  ///< extraInfo.timestamp as written (unix seconds), empty if absent
  /// When the file was last written (its mtime; read_error_file only): when the worker failed,
  /// to the nanosecond where the file system keeps it (extraInfo.timestamp has seconds).
  std::optional<std::chrono::system_clock::time_point> written_at;
  /// Non-empty when the file exists but holds no report: what is wrong with it, e.g. "is not
  /// valid JSON (syntax error at line 1, column 13); first bytes: '{oops'". `message` then
  /// holds the same sentence with the path: "error file <path> <problem>".
  std::string problem;
};

/// Largest error file read_error_file parses, in bytes.
inline constexpr std::size_t kMaxErrorFileBytes = 1 << 20;

/// Parses the error file content. Accepts {"message": {"message": "...",
/// "extraInfo": {"py_callstack": "...", "timestamp": "..."}}} and {"message": "..."}.
/// Returns nullopt for anything else (invalid JSON, no message). Never throws.
std::optional<WorkerErrorReport> parse_error_file(std::string_view content);

/// Reads and parses `path` (at most kMaxErrorFileBytes; a FIFO or other special file is never
/// opened). nullopt only when nothing exists at `path` (the worker wrote none). A file that
/// exists but holds no report (a directory, unreadable, empty, too large, not JSON, JSON
/// without a message) gives a report whose `problem` says so and whose `message` is
/// "error file <path> <problem>". Blocks on file I/O. Never throws.
std::optional<WorkerErrorReport> read_error_file(const std::string& path);

}  // namespace gpurun::supervisor
