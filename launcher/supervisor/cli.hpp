// Command-line parsing for the gpurun binary (reference: docs/cli.md).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "supervisor/options.hpp"

namespace gpurun::supervisor {

/// Parses gpurun's command line (argv[0] is skipped). Accepts `--flag value`
/// and `--flag=value`, `_` or `-` inside flag names (`--nproc_per_node`), and
/// takes the worker command from the first non-flag argument or after `--`.
/// Does not resolve nproc modes or touch the environment.
/// Throws gpurun::UsageError naming the flag and the value on bad input.
Options parse(int argc, const char* const* argv);
Options parse(const std::vector<std::string>& args);  ///< args without argv[0]

/// Parses a --redirects/--tee value ("3", "0:1,1:2"). Throws UsageError.
StdSpec parse_std_spec(std::string_view flag, std::string_view value);

/// The --help text, with examples.
std::string help_text();

/// The --version line, e.g. "gpurun 0.1.0".
std::string version_text();

}  // namespace gpurun::supervisor
