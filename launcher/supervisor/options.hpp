// gpurun::supervisor::Options — everything the command line can set, with the
// defaults documented in docs/cli.md. Filled by parse() in cli.hpp.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace gpurun::supervisor {

/// How --nproc was given: a number, or one of torchrun's symbolic values.
enum class NprocMode { kCount, kAuto, kGpu, kCpu };

/// Compute device of the workers (--device). Decides whether slots map to GPUs.
enum class Device { kCuda, kCpu };

/// torchrun's --redirects / --tee value: a bit set (1 = stdout, 2 = stderr),
/// either one value for every local rank or a per-local-rank map ("0:1,1:2").
struct StdSpec {
  static constexpr int kNone = 0;
  static constexpr int kStdout = 1;
  static constexpr int kStderr = 2;
  static constexpr int kBoth = 3;

  int all = kNone;              ///< value for ranks absent from per_rank
  std::map<int, int> per_rank;  ///< local rank -> value; empty when `all` applies to all
  std::string text;             ///< the value as given on the command line (for messages)

  /// Bit set for one local rank.
  int for_local_rank(int local_rank) const {
    auto it = per_rank.find(local_rank);
    return it == per_rank.end() ? all : it->second;
  }
  bool any() const { return all != kNone || !per_rank.empty(); }
};

/// --slurm / --no-slurm: whether Slurm's environment sets the topology (docs/cli.md#slurm).
enum class SlurmMode { kAuto, kOn, kOff };

/// --rdzv-backend: static (every node given --node-rank) or c10d (torchrun's default for
/// multi-node: without --node-rank, node ranks are given in join order; docs/cli.md#c10d).
enum class RdzvBackend { kStatic, kC10d };

/// --energy: whether the supervisor monitors GPU energy (docs/energy.md).
enum class EnergyMode { kAuto, kOn, kOff };

/// Parsed command line. Every default here is the documented default.
struct Options {
  // --- topology -----------------------------------------------------------
  NprocMode nproc_mode = NprocMode::kCount;
  int nproc = 1;       ///< workers on this node (resolved later for non-count modes)
  int nnodes = 1;      ///< number of nodes (the minimum of --nnodes MIN:MAX)
  int nnodes_max = 1;  ///< the maximum of --nnodes MIN:MAX (= nnodes for a plain N)
  int node_rank = 0;   ///< this node's index in [0, nnodes)

  bool nproc_given = false;      ///< --nproc / --nproc-per-node was on the command line
  bool nnodes_given = false;     ///< --nnodes was on the command line
  bool node_rank_given = false;  ///< --node-rank was on the command line
  /// auto: use Slurm's environment when gpurun is a step's task and neither --nnodes,
  /// --node-rank nor --standalone was given; on (--slurm): always, else a usage error;
  /// off (--no-slurm): never (supervisor/slurm.hpp).
  SlurmMode slurm = SlurmMode::kAuto;
  RdzvBackend rdzv_backend = RdzvBackend::kStatic;
  /// --rdzv-endpoint HOST[:PORT] as given (IPv6 in brackets); sets master_addr/master_port.
  std::optional<std::string> rdzv_endpoint;
  /// --rdzv-conf is_host=: whether this node hosts the store (c10d; nullopt: torchrun's rule,
  /// the node whose address the endpoint's host names).
  std::optional<bool> is_host;
  /// --rdzv-conf last_call_timeout= (c10d, --nnodes MIN:MAX): after MIN nodes joined, how long
  /// the rendezvous still waits for more (torchrun's default 30 s).
  std::chrono::milliseconds last_call_timeout{30'000};
  /// Lines the parser wants shown (e.g. --rdzv-conf keys gpurun does not use); main prints
  /// each as "warning: ...".
  std::vector<std::string> warnings;
  std::string master_addr = "127.0.0.1";
  bool master_addr_given = false;  ///< --master-addr was on the command line
  uint16_t master_port = 29500;    ///< 0 = bind a free port and tell the workers
  bool master_port_given = false;  ///< --master-port was on the command line
  bool standalone = false;         ///< localhost + free port + random run id
  /// --store-memory-budget: the store's ServerOptions::memory_budget_bytes (bytes; 0 =
  /// unlimited); nullopt = its default, min(RAM / 8, 4 GiB).
  std::optional<std::size_t> store_memory_budget;

  // --- supervision --------------------------------------------------------
  int max_restarts = 0;                            ///< whole-set restarts after a failure
  std::chrono::milliseconds grace_period{30'000};  ///< SIGTERM -> SIGKILL delay
  bool grace_period_given = false;                 ///< --grace-period was on the command line
  // --- preemption (docs/cli.md#preemption) ---------------------------------
  /// --preempt-signal: the warning signal gpurun turns into a checkpoint request (0 = none).
  int preempt_signal = 12;  // SIGUSR2 (NCCL handles SIGUSR1)
  /// --stop-timeout: after a SIGTERM, how long runtime workers may take to stop at their next
  /// boundary before they get SIGTERM. nullopt: 30 s, or a share of Slurm's KillWait.
  std::optional<std::chrono::milliseconds> stop_timeout;
  /// --requeue: after a stop by SIGTERM or the preempt signal, `scontrol requeue` the job.
  bool requeue = false;
  /// --exit-barrier-timeout: with --nnodes > 1, how long node 0 keeps its store up for the
  /// other nodes after its own workers succeeded (docs/cli.md#multi-node).
  std::chrono::milliseconds exit_barrier_timeout{300'000};
  /// --join-timeout: with --nnodes > 1, how long the start rendezvous waits for every node
  /// (docs/cli.md#multi-node).
  std::chrono::milliseconds join_timeout{600'000};
  /// --node-timeout: with --nnodes > 1, how long node 0 waits for a silent node's heartbeat
  /// before it gives the node up (docs/cli.md#multi-node); 0: never.
  std::chrono::milliseconds node_timeout{30'000};

  // --- logs ---------------------------------------------------------------
  std::optional<std::string> log_dir;  ///< keeps <log_dir>/<run_id>_XXXXXX/attempt_<n>/<rank>/
  StdSpec redirects;                   ///< streams sent to files only
  StdSpec tee;                         ///< streams sent to files and console
  std::optional<std::set<int>> ranks_filter;  ///< console shows only these global ranks
  /// --local-ranks-filter (torchrun's): console shows only these local ranks (files unchanged)
  std::optional<std::set<int>> local_ranks_filter;
  std::string log_line_prefix_template = "[rank${rank}]: ";
  std::optional<std::string> event_log;  ///< JSON-lines event file
  /// --metrics-port [ADDRESS:]PORT (docs/metrics.md): /metrics on ADDRESS (default
  /// 127.0.0.1):PORT (0: a free port, printed); nullopt: only on the health check's port.
  std::optional<uint16_t> metrics_port;
  std::string metrics_address = "127.0.0.1";
  /// --dcgm-job-dir DIR: DCGM exporter's per-GPU job files (docs/metrics.md#dcgm-exporter).
  std::optional<std::string> dcgm_job_dir;

  // --- identity / config --------------------------------------------------
  std::string run_id = "none";  ///< TORCHELASTIC_RUN_ID (torchrun's default); no '/', not
                                ///< only dots, no control characters (it names a directory)
  bool run_id_given = false;
  std::optional<std::string> config;  ///< elastic mode: the control file (docs/config.md)
  Device device = Device::kCuda;
  bool device_given = false;  ///< --device on the command line
  /// --simulate-gpus N|FILE (docs/energy.md#simulated-gpus): NVML and CUDA's GPU list are
  /// simulated (N H200s, or the GPUs of a state file); the workers run on the CPU and the
  /// energy monitor is on. nullopt: real GPUs.
  std::optional<std::string> simulate_gpus;
  /// auto: on with --device cuda when NVML loads; on: always (a clear message when NVML is
  /// absent); off: never.
  EnergyMode energy = EnergyMode::kAuto;
  std::optional<std::string> energy_summary;  ///< --energy-summary FILE

  /// --role: ROLE_NAME of every worker (torchrun's default "default"); ${role_name} in the
  /// console prefix.
  std::string role = "default";
  /// --virtual-local-rank: each worker sees only its own GPU (CUDA_VISIBLE_DEVICES) and gets
  /// LOCAL_RANK=0, as under torchrun.
  bool virtual_local_rank = false;
  /// --signals-to-handle: TORCHELASTIC_SIGNALS_TO_HANDLE of every worker (validated names).
  std::string signals_to_handle = "SIGTERM,SIGINT,SIGHUP,SIGQUIT";
  /// --local-addr: this node's address as other nodes reach it (c10d's is_host rule looks at
  /// it too).
  std::optional<std::string> local_addr;
  // --- worker command -----------------------------------------------------
  bool module = false;               ///< -m: run `python3 -u -m <command...>`
  bool run_path = false;             ///< --run-path: the script runs as `python3 -u script`
  bool no_python = false;            ///< --no-python: never wrap the command with python3
  std::vector<std::string> command;  ///< worker argv as given (before python wrapping)
  /// The interpreter the line named before `-m torch.distributed.launch` or
  /// `-m torch.distributed.run` (`gpurun python3.11 -m torch.distributed.launch …`); it runs
  /// the workers' Python, ahead of $PYTHON_EXEC and $PYTHON. nullopt: not named.
  std::optional<std::string> python;
  /// The line has `python -m torch.distributed.launch`'s shape
  /// (docs/cli.md#torchdistributedlaunch-lines): each worker gets its local rank as an argument
  /// too, unless `use_env`.
  bool launch_shape = false;
  bool use_env = false;  ///< --use-env / --use_env: the local rank only in LOCAL_RANK
  /// The argument each worker's command ends with, its value "=<LOCAL_RANK>" appended:
  /// "--local-rank" (torch >= 2.0) or "--local_rank" (older), as torch.distributed.launch
  /// passes it; empty: none (torchrun's shape, or --use-env). Set by the launch plan, which
  /// knows the workers' torch (local_rank_argument()).
  std::string local_rank_argument;

  // --- actions ------------------------------------------------------------
  bool help = false;
  bool version = false;
};

}  // namespace gpurun::supervisor
