// gpurun::supervisor run directory: where error files and per-rank logs of one run live
// (GPURUN_RUN_DIR). Unique per run, so runs with the same run id never overwrite each other.
#pragma once

#include <optional>
#include <string>

namespace gpurun::supervisor {

/// One run's directory.
struct RunDir {
  std::string path;        ///< absolute
  bool temporary = false;  ///< no --log-dir: under temp_run_base(), removed at exit unless kept
};

/// Creates the run directory. With `log_dir`: `<log_dir>/<run_id>_XXXXXX` (mkdtemp, mode
/// 0700, like torchrun's `tempfile.mkdtemp(prefix=f"{run_id}_", dir=log_dir)`), creating
/// log_dir if needed. Without: `temp_run_base()/<run_id>-XXXXXX` holding an `owner` file
/// ("<pid> <start time>") so that remove_stale_run_dirs() can tell a dead owner. `run_id`
/// has been validated by the CLI (no '/', not "." or ".."); in the temporary name any
/// character other than [A-Za-z0-9-] becomes '_'. Throws gpurun::Error naming the path.
RunDir make_run_dir(const std::optional<std::string>& log_dir, const std::string& run_id);

/// `$TMPDIR` (else /tmp) + `/gpurun-<uid>/runs`: temporary run directories of this user.
std::string temp_run_base();

/// Removes the directories under `base` whose `owner` process is gone (a gpurun killed
/// with SIGKILL cannot clean up after itself), and the pause snapshot each of them may have
/// left (worker_env.hpp: snapshot_path). Directories without an owner file (kept logs) are
/// left alone. Returns how many were removed; errors are ignored.
int remove_stale_run_dirs(const std::string& base);

/// At exit: a temporary directory is removed, or, with `keep`, kept (its owner file is
/// removed so that no later run deletes it). Directories under --log-dir are never touched.
void release_run_dir(const RunDir& dir, bool keep);

}  // namespace gpurun::supervisor
