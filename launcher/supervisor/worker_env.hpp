// The environment each worker process gets: torchrun's set (docs/cli.md#worker-environment)
// plus GPURUN_* variables for the worker runtime. Pure functions, no I/O.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "gpurun/control/decision.hpp"
#include "supervisor/options.hpp"

namespace gpurun::supervisor {

using EnvMap = std::map<std::string, std::string>;

/// Options resolved against the machine: slot count, GPU ids, store endpoint.
struct JobPlan {
  int nproc = 1;       ///< workers on this node
  int world_size = 1;  ///< nproc * nnodes
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr;   ///< MASTER_ADDR given to workers
  uint16_t master_port = 0;  ///< MASTER_PORT given to workers (the bound port when 0 was asked)
  std::string run_id;
  int max_restarts = 0;
  Device device = Device::kCuda;
  std::vector<std::string> gpu_ids;  ///< per local slot; empty with --device cpu
  std::string run_dir;               ///< GPURUN_RUN_DIR: per-run directory for error files and logs
  bool set_omp_num_threads = false;  ///< OMP_NUM_THREADS=1 is added (nproc > 1, not inherited)
  /// GPURUN_WORKER_LIBRARY: libgpurun_worker.so of this gpurun (find_worker_library); empty:
  /// not set (the Python package then says it needs gpurun's library for an elastic run).
  std::string worker_library;
  std::string role = "default";  ///< ROLE_NAME (--role)
  /// --virtual-local-rank: LOCAL_RANK=0 and CUDA_VISIBLE_DEVICES = the worker's own GPU.
  bool virtual_local_rank = false;
  /// TORCHELASTIC_SIGNALS_TO_HANDLE (--signals-to-handle), as torchrun gives its workers.
  std::string signals_to_handle = "SIGTERM,SIGINT,SIGHUP,SIGQUIT";
};

/// The worker engine's C library that belongs to the gpurun binary `self_exe`: the first of
/// <dir>/libgpurun_worker.so (the build tree), <dir>/../lib/libgpurun_worker.so and
/// <dir>/../lib/<multiarch>/libgpurun_worker.so (an install) that exists; "" when none does.
std::string find_worker_library(const std::string& self_exe);
/// A library gpurun ships (`file_name`, e.g. "libgpurun_simulated_nvml.so") as gpurun at
/// `self_exe` finds it: next to it, in ../lib, or in ../lib/<one level down>. "" when none.
std::string find_library_beside(const std::string& self_exe, const std::string& file_name);

/// Resolves nproc (auto/gpu/cpu), the GPU of each slot, MASTER_ADDR and the run id.
/// `count_gpus` is called only when CUDA_VISIBLE_DEVICES is unset and a GPU count
/// is needed; `cpu_count` for --nproc cpu/auto; `random_id` for --standalone.
/// master_port and run_dir are left for the caller (they need the store and a dir).
/// Throws UsageError when --nproc exceeds the visible GPUs with --device cuda.
JobPlan make_plan(const Options& options, const EnvMap& inherited,
                  const std::function<int()>& count_gpus, const std::function<int()>& cpu_count,
                  const std::function<std::string()>& random_id);

/// GPURUN_SNAPSHOT_PATH: where the worker runtime keeps the training state across a pause
/// (active_gpus = []). In shared memory (/dev/shm/gpurun-<uid>-<run dir name>.snapshot) when
/// /dev/shm is a writable directory, else <run_dir>/state.snapshot. The supervisor owns it:
/// remove_snapshot() deletes it (and the writer's temporary files) when gpurun exits.
std::string snapshot_path(const std::string& run_dir);

/// GPURUN_SNAPSHOT_FALLBACK_PATH: <run_dir>/state.snapshot, where the worker runtime writes
/// the snapshot when the primary path cannot hold it (/dev/shm full: ENOSPC, EDQUOT, EFBIG);
/// empty when the primary already is that file (then the variable is not set).
std::string snapshot_fallback_path(const std::string& run_dir);

/// Deletes the snapshot files of the run: the primary and the fallback, and the writer's
/// temporary files next to each (<path>.tmp.<pid>.<n>). Never throws (errors are ignored:
/// a file that is already gone is the normal case).
void remove_snapshot(const std::string& run_dir);

/// Path of TORCHELASTIC_ERROR_FILE for one worker of one attempt.
std::string error_file_path(const JobPlan& plan, int attempt, int rank);

/// Complete environment of local slot `local_rank` in restart attempt `attempt`:
/// the inherited environment plus the worker variables (which override it), without the
/// SLURM_* variables that describe a Slurm task (remove_slurm_task_vars in slurm.hpp).
EnvMap build_worker_env(const JobPlan& plan, int local_rank, int attempt, const EnvMap& inherited);

/// Elastic mode (--config): what a slot's process is spawned for.
struct ElasticSpawn {
  /// The job slot id (GPURUN_SLOT): node k's local slot i is k*1000+i (control::job_slot). Its
  /// device and LOCAL_RANK at spawn are build_worker_env's local index (GPURUN_LOCAL_SLOT).
  int slot = 0;
  /// The generation it joins (GPURUN_JOIN_GENERATION); ignored for a warm joiner.
  int64_t generation = 0;
  int64_t warm = -1;        ///< GPURUN_WARM: a warm joiner's id, -1: a joiner of `generation`
  bool standby = false;     ///< GPURUN_STANDBY=1 (with warm)
  std::string config_path;  ///< GPURUN_CONFIG: --config made absolute; "" = not set
};

/// Elastic mode: the variables a slot's process gets on top of build_worker_env (the overlay
/// of Supervisor::spawn_elastic). `d` is the decision it joins by (a warm joiner's: the
/// provisional world gpurun expects it to join). A joiner of a known generation gets that
/// generation's RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE,
/// ROLE_RANK and ROLE_WORLD_SIZE (control::generation_env, the rule the runtimes apply at every
/// generation); a warm joiner or standby, whose generation is unknown until its admission,
/// gets the provisional RANK, ROLE_RANK, WORLD_SIZE, ROLE_WORLD_SIZE and LOCAL_WORLD_SIZE (the
/// slots of its node in `d.active`; its LOCAL_RANK stays the slot's). Plus GPURUN_SLOT (the job
/// slot id, over build_worker_env's local index), GPURUN_ELASTIC, GPURUN_JOIN_GENERATION or
/// GPURUN_WARM (+ GPURUN_STANDBY), GPURUN_ACTIVE_GPUS, GPURUN_PARK_MODE and GPURUN_CONFIG.
EnvMap elastic_worker_env(const control::Decision& d, const ElasticSpawn& spawn);

/// The process's own environment as a map.
EnvMap current_environment();

}  // namespace gpurun::supervisor
