// gpurun's subcommands (`gpurun status|lend|reclaim|set|report`, and the power-limit guard
// helper gpurun starts for itself): each is a program of its own, dispatched before any
// launch flag is parsed.
#pragma once

#include <optional>

namespace gpurun::commands {

/// Runs the subcommand named by argv[1] and returns its exit status; nullopt when argv[1]
/// names none (a launch: `gpurun [flags] program ...`). Blocks until the subcommand ends.
std::optional<int> run_subcommand(int argc, char** argv);

}  // namespace gpurun::commands
