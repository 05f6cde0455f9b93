// Reads the TORCHELASTIC_ERROR_FILE a failed worker may have written
// (torch's @record decorator) for the root-cause summary.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace gpurun::supervisor {

/// What a worker reported about its own failure.
struct WorkerErrorReport {
  std::string message;    ///< the error message (e.g. a Python exception line)
  std::string traceback;  ///< extraInfo.py_callstack, empty if absent
  std::string timestamp;  ///< extraInfo.timestamp as written (unix seconds), empty if absent
};

/// Parses the error file content. Accepts {"message": {"message": "...",
/// "extraInfo": {"py_callstack": "...", "timestamp": "..."}}} and {"message": "..."}.
/// Returns nullopt for anything else (invalid JSON, no message). Never throws.
std::optional<WorkerErrorReport> parse_error_file(std::string_view content);

/// Reads and parses `path`; nullopt when it does not exist or is not a report.
/// Reads at most 1 MiB. Never throws.
std::optional<WorkerErrorReport> read_error_file(const std::string& path);

}  // namespace gpurun::supervisor
