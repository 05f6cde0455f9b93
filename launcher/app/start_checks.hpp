// Start checks of the gpurun executable that end it with a usage or not-found status: where
// the master address is (and so where the store listens, and which node hosts it), and the
// worker command. Part of the composition root (main.cpp); docs/cli.md, docs/errors.md.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "cli/cli.hpp"
#include "supervisor/worker_env.hpp"

namespace gpurun::app {

/// gpurun's own exit statuses (docs/errors.md): its own failure, a usage error, a worker
/// command that cannot be run (as a shell's 127).
constexpr int kExitLauncherError = 1;
constexpr int kExitUsage = 2;
constexpr int kExitNotFound = 127;

/// The master address (docs/cli.md#master-address-and-where-the-store-listens): one that does
/// not resolve fails now, not in every worker later; on node 0 it must be this host (node 0
/// hosts the store there). The default 127.0.0.1 is a literal (no lookup); --standalone's
/// localhost is not looked up. Sets `store_hosts` (where the store listens) and, when
/// `host_by_address` (c10d by join order without is_host=), plan.node_rank: 0 when the address
/// is this host's, else 1 (joins). Returns kExitUsage after printing why, or nothing. Blocks
/// for the address lookup (bounded: launcher/nodes/master_address.hpp).
std::optional<int> place_master(const supervisor::Options& opt, supervisor::JobPlan& plan,
                                bool host_by_address, std::vector<std::string>& store_hosts);

/// Finds the worker program (argv[0] on the inherited PATH) and replaces argv[0] with its
/// path; a path that exists but cannot run is named for what it is. Returns kExitNotFound
/// after printing why (also for a script argument that cannot be read), or nothing.
std::optional<int> resolve_worker_command(const supervisor::Options& opt,
                                          const supervisor::EnvMap& inherited,
                                          std::vector<std::string>& argv);

}  // namespace gpurun::app
