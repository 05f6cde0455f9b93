// `gpurun status` and the run choice (--run-id, --pid, --run-dir) that `gpurun lend`,
// `reclaim` and `set` share: programs of their own, which read what a running gpurun
// publishes (its registry entry, status.json). docs/cli.md, docs/sharing.md.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace gpurun::commands {

/// Which run a command (`gpurun status`, `lend`, `reclaim`, `set`) is about.
struct RunChoice {
  std::optional<std::string> run_id;
  std::optional<std::string> run_dir;
  std::optional<int> pid;  ///< the supervisor's
};
/// When args[i] is --run-id, --pid or --run-dir (also as --flag=value), takes it and its
/// value into `choice` (advancing i) and returns true; a missing or bad value sets `error`.
bool take_run_flag(const std::vector<std::string>& args, size_t& i, RunChoice& choice,
                   std::string& error);
/// The run directory of the one registered run `choice` matches (--run-dir: that one).
/// nullopt when none or several match (`error` says which, listing them; `code` 1) or the
/// flags contradict each other (`code` 2). Removes stale registry entries it meets.
std::optional<std::string> choose_run_dir(const RunChoice& choice, std::string& error, int& code);

/// `gpurun status [--json] [--run-id ID] [--pid PID | --run-dir DIR]` (args after "status").
/// --run-id and --pid (the supervisor's) filter the registered runs; --run-dir reads that
/// directory's status.json directly. Prints to stdout; errors to stderr as
/// "gpurun: error: ...". Several matching runs are listed (pid, run dir, start time).
/// Returns the exit status: 0, 1 when no (or more than one) running job matches or
/// status.json is unreadable, 2 for a usage error.
int status_command(const std::vector<std::string>& args);

/// "gpurun: error: <msg>" on stderr: how each command reports what stops it.
void command_error(const std::string& msg);

}  // namespace gpurun::commands
