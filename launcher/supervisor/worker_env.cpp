#include "supervisor/worker_env.hpp"

#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include <fmt/format.h>

#include "gpurun/check.hpp"
#include "gpurun/control/node_messages.hpp"
#include "gpurun/env_names.hpp"
#include "supervisor/gpu_inventory.hpp"
#include "supervisor/slurm.hpp"

extern char** environ;

namespace gpurun::supervisor {

JobPlan make_plan(const Options& o, const EnvMap& inherited, const std::function<int()>& count_gpus,
                  const std::function<int()>& cpu_count,
                  const std::function<std::string()>& random_id) {
  JobPlan plan;
  plan.nnodes = o.nnodes;
  plan.node_rank = o.node_rank;
  plan.device = o.device;
  plan.max_restarts = o.max_restarts;
  plan.master_addr = o.standalone ? "localhost" : o.master_addr;
  plan.master_port = o.standalone ? 0 : o.master_port;
  plan.run_id = (o.standalone && !o.run_id_given) ? random_id() : o.run_id;

  std::optional<std::string> cvd;
  if (auto it = inherited.find("CUDA_VISIBLE_DEVICES"); it != inherited.end()) cvd = it->second;
  std::vector<std::string> gpus;
  bool gpus_known = false;
  auto visible = [&]() -> const std::vector<std::string>& {
    if (!gpus_known) {
      gpus = slot_gpu_ids(cvd, count_gpus);
      gpus_known = true;
    }
    return gpus;
  };

  switch (o.nproc_mode) {
    case NprocMode::kCount:
      plan.nproc = o.nproc;
      break;
    case NprocMode::kCpu:
      plan.nproc = std::max(1, cpu_count());
      break;
    case NprocMode::kGpu:
      if (o.device == Device::kCpu)
        throw UsageError("--nproc gpu needs --device cuda (got --device cpu)");
      plan.nproc = static_cast<int>(visible().size());
      if (plan.nproc == 0)
        throw UsageError("--nproc gpu: no GPU visible (CUDA_VISIBLE_DEVICES empty or no driver)");
      break;
    case NprocMode::kAuto:
      if (o.device == Device::kCpu) {
        plan.nproc = std::max(1, cpu_count());
      } else {
        plan.nproc = static_cast<int>(visible().size());
        if (plan.nproc == 0)
          throw UsageError(
              "--nproc auto: no GPU visible (CUDA_VISIBLE_DEVICES empty or no driver); use "
              "--device cpu");
      }
      break;
  }

  if (o.device == Device::kCuda) {
    const auto& ids = visible();
    if (static_cast<int>(ids.size()) < plan.nproc) {
      throw UsageError(fmt::format(
          "--nproc {} needs {} GPUs but only {} {} visible ({}); lower --nproc or use --device cpu",
          plan.nproc, plan.nproc, ids.size(), ids.size() == 1 ? "is" : "are",
          cvd ? fmt::format("CUDA_VISIBLE_DEVICES='{}'", *cvd)
              : std::string("counted with nvidia-smi -L / /proc/driver/nvidia/gpus")));
    }
    // Two slots on one GPU would each think it owns it (memory, NCCL): refuse the list. An
    // index is compared as a number ("0" and "00" are one GPU to CUDA), a UUID as text.
    const auto same_gpu = [](const std::string& a, const std::string& b) {
      const auto index = [](const std::string& s) -> long {
        if (s.empty() || s.size() > 9 || s.find_first_not_of("0123456789") != std::string::npos)
          return -1;
        return std::stol(s);
      };
      const long ia = index(a), ib = index(b);
      return ia >= 0 && ib >= 0 ? ia == ib : a == b;
    };
    for (std::size_t i = 0; i < ids.size(); ++i) {
      for (std::size_t j = i + 1; j < ids.size(); ++j) {
        if (!same_gpu(ids[i], ids[j])) continue;
        throw UsageError(fmt::format(
            "CUDA_VISIBLE_DEVICES='{}' names GPU {} twice (entries {} and {}): every worker "
            "needs a GPU of its own; list each GPU once",
            cvd.value_or(""), ids[i], i, j));
      }
    }
    plan.gpu_ids.assign(ids.begin(), ids.begin() + plan.nproc);
  }
  plan.world_size = plan.nproc * plan.nnodes;
  plan.role = o.role;
  plan.virtual_local_rank = o.virtual_local_rank;
  plan.signals_to_handle = o.signals_to_handle;
  plan.set_omp_num_threads = plan.nproc > 1 && !inherited.count("OMP_NUM_THREADS");
  return plan;
}

std::string error_file_path(const JobPlan& plan, int attempt, int rank) {
  return fmt::format("{}/attempt_{}/{}/error.json", plan.run_dir, attempt, rank);
}

EnvMap build_worker_env(const JobPlan& plan, int local_rank, int attempt, const EnvMap& inherited) {
  GPURUN_CHECK(local_rank >= 0 && local_rank < plan.nproc, "local rank {} of {}", local_rank,
               plan.nproc);
  EnvMap env = inherited;
  remove_slurm_task_vars(env);  // a worker is not a Slurm task (docs/cli.md#slurm)
  const int rank = plan.node_rank * plan.nproc + local_rank;
  auto set = [&](const char* k, std::string v) { env[k] = std::move(v); };
  set("RANK", std::to_string(rank));
  set("LOCAL_RANK", std::to_string(local_rank));
  set("WORLD_SIZE", std::to_string(plan.world_size));
  set("LOCAL_WORLD_SIZE", std::to_string(plan.nproc));
  set("GROUP_RANK", std::to_string(plan.node_rank));
  set("GROUP_WORLD_SIZE", std::to_string(plan.nnodes));
  set("ROLE_RANK", std::to_string(rank));
  set("ROLE_WORLD_SIZE", std::to_string(plan.world_size));
  set("ROLE_NAME", plan.role);
  set("MASTER_ADDR", plan.master_addr);
  set("MASTER_PORT", std::to_string(plan.master_port));
  set("TORCHELASTIC_USE_AGENT_STORE", "True");
  set("TORCHELASTIC_RUN_ID", plan.run_id);
  set("TORCHELASTIC_RESTART_COUNT", std::to_string(attempt));
  set("TORCHELASTIC_MAX_RESTARTS", std::to_string(plan.max_restarts));
  set("TORCHELASTIC_ERROR_FILE", error_file_path(plan, attempt, rank));
  set("TORCHELASTIC_SIGNALS_TO_HANDLE", plan.signals_to_handle);
  if (!env.count("TORCH_NCCL_ASYNC_ERROR_HANDLING")) set("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1");
  if (plan.set_omp_num_threads) set("OMP_NUM_THREADS", "1");
  set(env::kRunId, plan.run_id);
  set(env::kStoreAddr, plan.master_addr);
  set(env::kStorePort, std::to_string(plan.master_port));
  // The job slot id and the node-local one: equal here; elastic_worker_env's overlay gives
  // another node's slot its job id (node k's local slot i is k*1000+i).
  set(env::kSlot, std::to_string(local_rank));
  set(env::kLocalSlot, std::to_string(local_rank));
  set(env::kDevice, plan.device == Device::kCuda ? "cuda" : "cpu");
  set(env::kRunDir, plan.run_dir);
  if (!plan.run_dir.empty()) {
    set(env::kSnapshotPath, snapshot_path(plan.run_dir));
    if (auto fallback = snapshot_fallback_path(plan.run_dir); !fallback.empty()) {
      set(env::kSnapshotFallbackPath, std::move(fallback));
    } else {
      env.erase(env::kSnapshotFallbackPath);
    }
  } else {
    env.erase(env::kSnapshotFallbackPath);
  }
  if (plan.device == Device::kCuda) {
    set(env::kGpuId, plan.gpu_ids.at(static_cast<size_t>(local_rank)));
  } else {
    env.erase(env::kGpuId);
  }
  if (!plan.worker_library.empty()) set(env::kWorkerLibrary, plan.worker_library);
  if (plan.virtual_local_rank) {  // torchrun's --virtual-local-rank: one GPU, index 0
    set("LOCAL_RANK", "0");
    if (plan.device == Device::kCuda)
      set("CUDA_VISIBLE_DEVICES", plan.gpu_ids.at(static_cast<size_t>(local_rank)));
  }
  return env;
}

std::string find_worker_library(const std::string& self_exe) {
  return find_library_beside(self_exe, "libgpurun_worker.so");
}

std::string find_library_beside(const std::string& self_exe, const std::string& file_name) {
  namespace fs = std::filesystem;
  if (self_exe.empty()) return {};
  const fs::path dir = fs::path(self_exe).parent_path();
  std::vector<fs::path> candidates = {dir / file_name, dir / ".." / "lib" / file_name};
  std::error_code ec;
  if (fs::is_directory(dir / ".." / "lib", ec))
    for (const auto& e : fs::directory_iterator(dir / ".." / "lib", ec))
      if (e.is_directory(ec)) candidates.push_back(e.path() / file_name);
  for (const fs::path& p : candidates)
    if (fs::is_regular_file(p, ec)) return fs::weakly_canonical(p, ec).string();
  return {};
}

std::string snapshot_path(const std::string& run_dir) {
  namespace fs = std::filesystem;
  const std::string name = fs::path(run_dir).filename().string();
  if (::access("/dev/shm", W_OK | X_OK) == 0)
    return fmt::format("/dev/shm/gpurun-{}-{}.snapshot", ::getuid(), name);
  return run_dir + "/state.snapshot";
}

std::string snapshot_fallback_path(const std::string& run_dir) {
  std::string fallback = run_dir + "/state.snapshot";
  return fallback == snapshot_path(run_dir) ? std::string() : fallback;
}

void remove_snapshot(const std::string& run_dir) {
  namespace fs = std::filesystem;
  for (const std::string& path : {snapshot_path(run_dir), snapshot_fallback_path(run_dir)}) {
    if (path.empty()) continue;
    const fs::path snap = path;
    const std::string prefix = snap.filename().string();
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(snap.parent_path(), ec)) {
      if (e.path().filename().string().rfind(prefix, 0) == 0) fs::remove(e.path(), ec);
    }
  }
}

EnvMap elastic_worker_env(const control::Decision& d, const ElasticSpawn& spawn) {
  EnvMap env;
  if (spawn.warm < 0) {
    // LOCAL_RANK is left as build_worker_env made it, the slot's device index: a program picks
    // its GPU from it at its start (`cuda:LOCAL_RANK`, as under torchrun), and a generation
    // whose active set is not 0..k-1 would otherwise point it at another slot's GPU. From its
    // first generation on, the runtime sets the generation's value (docs/cli.md).
    for (auto& [name, value] : control::generation_env(d, spawn.slot))
      if (name != "LOCAL_RANK") env[name] = value;
    env[env::kJoinGeneration] = std::to_string(spawn.generation);
  } else {
    // Its generation is known only at its admission (the runtime then sets the real values).
    const std::string rank = std::to_string(d.rank_of(spawn.slot));
    const std::string world = std::to_string(d.active.size());
    const int node = control::slot_node(spawn.slot);
    const auto on_node = std::count_if(d.active.begin(), d.active.end(),
                                       [node](int s) { return control::slot_node(s) == node; });
    env["RANK"] = rank;
    env["ROLE_RANK"] = rank;
    env["WORLD_SIZE"] = world;
    env["ROLE_WORLD_SIZE"] = world;
    env["LOCAL_WORLD_SIZE"] = std::to_string(on_node);  // the slots of its node
    env[env::kWarm] = std::to_string(spawn.warm);       // joins no generation until it is admitted
    if (spawn.standby) env[env::kStandby] = "1";        // and touches no device until told to go
  }
  env[env::kSlot] = std::to_string(spawn.slot);  // the job slot id: its keys, its rank
  env[env::kElastic] = "1";
  env[env::kActiveGpus] = control::join_ids(d.active);
  env[env::kParkMode] = std::string(control::to_string(d.park_mode));
  if (!spawn.config_path.empty()) env[env::kConfig] = spawn.config_path;
  return env;
}

EnvMap current_environment() {
  EnvMap env;
  for (char** e = environ; e && *e; ++e) {
    std::string_view kv(*e);
    auto eq = kv.find('=');
    if (eq == std::string_view::npos || eq == 0) continue;
    env.emplace(std::string(kv.substr(0, eq)), std::string(kv.substr(eq + 1)));
  }
  return env;
}

}  // namespace gpurun::supervisor
