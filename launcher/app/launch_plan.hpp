// What gpurun decides before it starts anything: the command line and the environment
// (torchrun's PET_* variables, Slurm's) turned into a checked plan — the node's place, the
// master address, the slots, the elastic config, the descriptor budget, the worker command.
// Part of the composition root (main.cpp); docs/cli.md.
#pragma once

#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "cli/cli.hpp"
#include "control/config.hpp"
#include "supervisor/fd_limit.hpp"
#include "supervisor/worker_env.hpp"

namespace gpurun::app {

/// A launch that passed every start check.
struct Launch {
  supervisor::Options opt;
  supervisor::EnvMap inherited;  ///< gpurun's environment when it started
  supervisor::JobPlan plan;      ///< node, ranks, master address, run id, ...
  /// --config (elastic mode): the initial config; nullopt for a plain run.
  std::optional<control::Config> config;
  std::vector<int> slot_ids;       ///< the slots active_gpus may name (elastic), else 0..nproc-1
  std::vector<int> launch_ids;     ///< the workers a plain run starts: 0..nproc-1
  supervisor::FdLimit fd_limit;    ///< RLIMIT_NOFILE as raised for the workers
  std::vector<std::string> wargv;  ///< the worker command; [0] found on the PATH
  std::vector<std::string> store_hosts;  ///< where node 0's store listens
  /// c10d with a node range or without --node-rank: node ranks are given in join order.
  bool rank_by_join = false;
};

/// Parses argv and the environment and runs every start check (Slurm topology, the plan,
/// c10d host placement, the master address, the elastic config, the local ranks named by
/// --redirects/--tee, the descriptor budget, the worker command). Prints what it finds on
/// stderr ("gpurun: error: …", warnings). Returns the Launch, or the status gpurun exits
/// with at once: 0 after --help/--version, kExitUsage (2) for a usage error, kExitNotFound
/// (127) for a worker command that cannot run (start_checks.hpp). Blocks for the address
/// lookup and nvidia-smi (each bounded).
std::variant<Launch, int> prepare_launch(int argc, char** argv);

}  // namespace gpurun::app
