#include "app/launch_plan.hpp"

#include <cstdio>
#include <random>
#include <thread>

#include <fmt/format.h>

#include "app/energy_setup.hpp"
#include "app/start_checks.hpp"
#include "gpurun/error.hpp"
#include "supervisor/gpu_inventory.hpp"
#include "supervisor/slurm.hpp"
#include "supervisor/worker_command.hpp"

namespace gpurun::app {

namespace sv = gpurun::supervisor;

namespace {

std::string random_uuid() {
  std::random_device rd;
  std::mt19937_64 gen((static_cast<uint64_t>(rd()) << 32) ^ rd());
  uint64_t a = gen(), b = gen();
  a = (a & ~0xF000ull) | 0x4000ull;                         // version 4
  b = (b & 0x3FFFFFFFFFFFFFFFull) | 0x8000000000000000ull;  // variant 1
  return fmt::format("{:08x}-{:04x}-{:04x}-{:04x}-{:012x}", a >> 32, (a >> 16) & 0xFFFF, a & 0xFFFF,
                     b >> 48, b & 0xFFFFFFFFFFFFull);
}

// Elastic mode (--config): the plan's nodes, restarts and slots. --nnodes > 1 is one elastic job
// over several nodes (docs/cli.md#elastic-nodes): node 0 decides for every node; the others'
// gpurun are slot agents (launcher/nodes/node_agent). With --device cuda every visible GPU is a
// slot.
void elastic_plan(const sv::Options& opt, const sv::EnvMap& inherited,
                  const std::function<int()>& count_gpus, sv::JobPlan& plan) {
  // --nnodes MIN:MAX with a static rendezvous: as many nodes as MAX may take part.
  if (opt.nnodes_max > plan.nnodes) plan.nnodes = opt.nnodes_max;
  // torchrun's elastic lines carry --max-restarts (its membership changes are restarts);
  // here a node joining, leaving or dying is a resize at a boundary, never a restart.
  if (plan.nnodes > 1 && plan.max_restarts > 0) {
    print_err(fmt::format(
        "warning: --max-restarts {} is not used: an elastic job over several nodes (--config, "
        "--nnodes {}) takes nodes joining, leaving and dying at a boundary without restarting "
        "any worker (docs/cli.md#elastic-nodes)",
        plan.max_restarts, plan.nnodes));
    plan.max_restarts = 0;
  }
  if (plan.device == sv::Device::kCuda) {
    const auto cvd = inherited.find("CUDA_VISIBLE_DEVICES");
    plan.gpu_ids = sv::slot_gpu_ids(
        cvd != inherited.end() ? std::optional<std::string>(cvd->second) : std::nullopt,
        count_gpus);
    plan.nproc = static_cast<int>(plan.gpu_ids.size());
    plan.world_size = plan.nproc;
  }
}

}  // namespace

std::variant<Launch, int> prepare_launch(int argc, char** argv) {
  sv::Options opt;
  const sv::EnvMap inherited = sv::current_environment();
  try {
    opt = sv::parse(argc, argv, inherited);  // torchrun's PET_* variables too
  } catch (const gpurun::UsageError& e) {
    print_err(fmt::format("error: {}", e.what()));
    return kExitUsage;
  }
  if (opt.help) {
    std::fputs(sv::help_text().c_str(), stdout);
    return 0;
  }
  if (opt.version) {
    std::puts(sv::version_text().c_str());
    return 0;
  }

  for (const std::string& line : opt.warnings) print_err("warning: " + line);
  if (opt.virtual_local_rank && opt.config) {
    print_err(
        "error: --virtual-local-rank cannot be combined with --config: the elastic runtime "
        "finds each slot's GPU by its index (docs/cli.md#torchrun-flags)");
    return kExitUsage;
  }
  try {  // inside a Slurm step: topology from Slurm (docs/cli.md#slurm)
    if (const auto line = sv::use_slurm(opt, inherited)) print_err(*line);
  } catch (const gpurun::UsageError& e) {
    print_err(fmt::format("error: {}", e.what()));
    return kExitUsage;
  }
  int gpus_counted = -1;  // nvidia-smi runs at most once
  const auto count_gpus = [&] {
    if (gpus_counted < 0) gpus_counted = sv::count_physical_gpus();
    return gpus_counted;
  };
  sv::JobPlan plan;
  try {
    plan = sv::make_plan(
        opt, inherited, count_gpus,
        [] { return static_cast<int>(std::max(1u, std::thread::hardware_concurrency())); },
        random_uuid);
  } catch (const gpurun::UsageError& e) {
    print_err(fmt::format("error: {}", e.what()));
    return kExitUsage;
  }
  // c10d without --node-rank (docs/cli.md#c10d): the node whose address the endpoint names
  // hosts the store and is node 0 (torchrun's is_host rule; --rdzv-conf is_host= decides
  // instead); the others take node ranks in join order. The multi-node set-up is made for the
  // most nodes --nnodes allows; the count is final after the start rendezvous.
  // A node range always ranks by join order (torchrun's c10d ignores --node-rank altogether);
  // with a fixed count a given --node-rank is kept.
  const bool c10d_range = opt.nnodes_max != opt.nnodes;
  const bool rank_by_join = opt.rdzv_backend == sv::RdzvBackend::kC10d && opt.nnodes_max > 1 &&
                            (!opt.node_rank_given || c10d_range) && plan.nnodes == opt.nnodes;
  if (rank_by_join && opt.node_rank_given)
    print_err(
        fmt::format("warning: --node-rank {} is not used: with --rdzv-backend c10d and "
                    "--nnodes {}:{} node ranks are given in join order (as torchrun does)",
                    opt.node_rank, opt.nnodes, opt.nnodes_max));
  // Without is_host= the master address check below decides: a node is the host when the
  // endpoint names one of its addresses (or its --local-addr), else it joins (node rank > 0
  // until the join gives it one).
  const bool host_by_address = rank_by_join && !opt.is_host;
  if (rank_by_join) {
    plan.nnodes = opt.nnodes_max;
    plan.world_size = plan.nproc * plan.nnodes;
    plan.node_rank = opt.is_host.value_or(true) ? 0 : 1;
  }
  // The master address: it resolves, and on node 0 it is this host; where the store listens.
  std::vector<std::string> store_hosts;
  if (const auto code = place_master(opt, plan, host_by_address, store_hosts)) return *code;

  // Elastic mode (--config): a bad initial config is a usage error naming file:line:col.
  // Slots (the ids active_gpus may name): with --device cuda every visible GPU, with
  // --device cpu the --nproc slots. --nproc only says which start while active_gpus is
  // absent: the first nproc (docs/config.md#active_gpus).
  std::optional<gpurun::control::Config> config;
  std::vector<int> slot_ids, launch_ids;
  for (int i = 0; i < plan.nproc; ++i) launch_ids.push_back(i);
  if (opt.config) elastic_plan(opt, inherited, count_gpus, plan);
  for (int i = 0; i < plan.nproc; ++i) slot_ids.push_back(i);
  try {  // per-local-rank --redirects/--tee entries name existing slots
    std::string slots_from = fmt::format("--nproc {}", plan.nproc);
    if (opt.config && plan.device == sv::Device::kCuda)
      slots_from = fmt::format("--config with {} visible GPUs", plan.nproc);
    else if (opt.nproc_mode != sv::NprocMode::kCount)
      slots_from = fmt::format("--nproc {} ({} slots)",
                               opt.nproc_mode == sv::NprocMode::kGpu   ? "gpu"
                               : opt.nproc_mode == sv::NprocMode::kCpu ? "cpu"
                                                                       : "auto",
                               plan.nproc);
    sv::check_local_ranks(opt, plan.nproc, slots_from);
  } catch (const gpurun::UsageError& e) {
    print_err(fmt::format("error: {}", e.what()));
    return kExitUsage;
  }
  if (opt.config) {
    try {
      config = gpurun::control::load_config(*opt.config, slot_ids);
    } catch (const gpurun::control::ConfigError& e) {
      print_err(fmt::format("error: {}", e.what()));
      return kExitUsage;
    }
  }

  // gpurun holds a few descriptors per worker: raise the soft limit, refuse what cannot fit.
  const sv::FdLimit fd_limit = sv::raise_fd_limit();
  try {
    sv::check_fd_budget(plan.nproc, opt.log_dir || opt.redirects.any() || opt.tee.any(), fd_limit);
  } catch (const gpurun::UsageError& e) {
    print_err(fmt::format("error: {}", e.what()));
    return kExitUsage;
  }

  opt.local_rank_argument = sv::local_rank_argument_for(opt, inherited);
  std::vector<std::string> wargv = sv::worker_argv(opt, inherited);
  if (const auto code = resolve_worker_command(opt, inherited, wargv)) return *code;

  Launch out;
  out.opt = std::move(opt);
  out.inherited = inherited;
  out.plan = std::move(plan);
  out.config = std::move(config);
  out.slot_ids = std::move(slot_ids);
  out.launch_ids = std::move(launch_ids);
  out.fd_limit = fd_limit;
  out.wargv = std::move(wargv);
  out.store_hosts = std::move(store_hosts);
  out.rank_by_join = rank_by_join;
  return out;
}

}  // namespace gpurun::app
