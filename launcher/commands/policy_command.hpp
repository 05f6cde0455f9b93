// `gpurun lend`, `gpurun reclaim` and `gpurun set`: change a running elastic job's GPU set
// without editing config.toml by hand. Reference: docs/sharing.md.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "gpurun/regular_file.hpp"

namespace gpurun::commands {

/// `gpurun lend GPUS [--for DURATION] [--note TEXT] [--run-id ID | --pid PID | --run-dir DIR]`
/// (args after "lend"): adds a lease to the run's leases.json; the job stops training on those
/// GPUs at its next boundary and takes them back when the lease ends. Blocks on file I/O.
/// Returns the exit status: 0, 1 (no such run, a file error, a file that kept changing), 2
/// (usage). A leases file changed by hand between the read and the rename is read again (no
/// edit is lost: update_leases). `hook`: a test's seam (gpurun::replace_file_if_unchanged).
int lend_command(const std::vector<std::string>& args, const ReplaceHook& hook = {});

/// `gpurun reclaim [GPUS] [--run-id ID | --pid PID | --run-dir DIR]`: ends the leases of those
/// GPUs (all leases without GPUS) now. Exit status as lend_command.
int reclaim_command(const std::vector<std::string>& args, const ReplaceHook& hook = {});

/// `gpurun set KEY=VALUE... [--config PATH | --run-id ID | --pid PID | --run-dir DIR]`:
/// rewrites the job's config.toml atomically with those keys changed (comments and other keys
/// kept), after checking the result with the same rules and messages as a hand edit; nothing
/// is written when it fails. The file is replaced only if it still holds what was read (by
/// identity and content, gpurun::replace_file_if_unchanged): a hand edit that lands while
/// set works is read again and the keys applied to it, up to 5 times, then set refuses
/// ("changed 5 times while gpurun set rewrote it"); success is printed only for a change that
/// is in the file. Exit status as lend_command.
int set_command(const std::vector<std::string>& args, const ReplaceHook& hook = {});

/// The text of `config` with `key` (`active_gpus` or `table.key`) set to the TOML value
/// `value`: the key's line replaced where it exists, else added (top-level keys before the
/// first table, a table's key after its header, a missing table at the end). Pure.
std::string set_config_key(std::string_view config, std::string_view key, std::string_view value);

}  // namespace gpurun::commands
