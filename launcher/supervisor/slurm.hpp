// gpurun::supervisor Slurm front end: gpurun started as one task of a Slurm step (srun) takes
// its node count, node rank, store address/port and default --nproc from Slurm's environment,
// and its workers stop looking like Slurm tasks. Reference: docs/cli.md#slurm. Pure functions
// over an environment map: no scontrol, no getenv.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "supervisor/options.hpp"

namespace gpurun::supervisor {

/// Most host names one hostlist expression may expand to: Slurm's own bound (MAX_RANGE =
/// MAX_SLURM_NODES, 64K hosts, in src/common/hostlist.h).
inline constexpr std::size_t kMaxHostlistHosts = 65'536;

/// Expands a Slurm hostlist expression ("gpu[01-04,07],cpu5") into host names, in Slurm's
/// order (src/common/hostlist.c): hosts are separated by ',', ' ', '\t' or '\n' outside
/// brackets (consecutive separators are skipped); inside "[...]" a comma separates numbers and
/// "lo-hi" ranges; each number is zero-padded to the width of the range's low end as written
/// ("n[08-11]" -> n08 n09 n10 n11); a name may hold several groups and text after them, the
/// leftmost group varying slowest ("rack[1-2]-n[1-2]" -> rack1-n1 rack1-n2 rack2-n1 rack2-n2).
/// Throws gpurun::UsageError naming the expression and the 1-based character position for an
/// unbalanced or nested bracket, an empty group or item ("[]", "[1,,2]", "[1-]"), a reversed
/// range ("[5-3]"), a non-numeric one ("[a-c]"), an expression naming no host, or more than
/// kMaxHostlistHosts hosts (checked before anything is built).
std::vector<std::string> expand_hostlist(std::string_view expression);

/// What gpurun reads of Slurm's environment when it runs as a step's task.
struct SlurmEnv {
  using Map = std::map<std::string, std::string>;

  std::string job_id;                  ///< SLURM_JOB_ID, decimal digits (SLURM_JOBID as a fallback)
  uint64_t job_number = 0;             ///< SLURM_JOB_ID as a number (the port formula uses it)
  std::string step_id;                 ///< SLURM_STEP_ID (SLURM_STEPID as a fallback), verbatim
  int nnodes = 1;                      ///< nodes of the step (see nnodes_var)
  std::string nnodes_var;              ///< the variable nnodes came from
  int node_id = 0;                     ///< SLURM_NODEID: this node's index in the step, [0, nnodes)
  std::string nodelist;                ///< the hostlist expression as Slurm wrote it
  std::string nodelist_var;            ///< the variable nodelist came from
  std::vector<std::string> nodes;      ///< expand_hostlist(nodelist); nodes.size() == nnodes
  std::optional<int> ntasks;           ///< SLURM_NTASKS (tasks of the step), when set
  std::optional<int> ntasks_per_node;  ///< SLURM_NTASKS_PER_NODE, when set
  std::optional<std::string> step_tasks_per_node;  ///< SLURM_STEP_TASKS_PER_NODE ("1(x4)")
  std::optional<int> local_id;                     ///< SLURM_LOCALID (task index on the node)
  std::optional<int> gpus;  ///< GPUs of this task (see gpus_var); nullopt when none says
  std::string gpus_var;     ///< CUDA_VISIBLE_DEVICES, SLURM_STEP_GPUS or SLURM_GPUS_ON_NODE

  /// True when gpurun itself is a Slurm step's task: SLURM_JOB_ID and SLURM_STEP_ID are both
  /// set (a batch script has no SLURM_STEP_ID: there, run gpurun through srun).
  static bool detect(const Map& env);

  /// Reads the variables above. nnodes: SLURM_STEP_NUM_NODES, else SLURM_NNODES, else
  /// SLURM_JOB_NUM_NODES; the node list: SLURM_STEP_NODELIST, else SLURM_NODELIST, else
  /// SLURM_JOB_NODELIST; GPUs: the entries of CUDA_VISIBLE_DEVICES (what the workers will
  /// see), else the entries of SLURM_STEP_GPUS, else SLURM_GPUS_ON_NODE. Throws
  /// gpurun::UsageError naming the variable and its value when a required one (job id, step
  /// id, node count, node id, node list) is missing or malformed, when the node list does not
  /// expand to nnodes hosts, or when SLURM_NODEID is outside [0, nnodes).
  static SlurmEnv parse(const Map& env);
};

/// MASTER_PORT for a Slurm job: 20000 + job_id % 10000, in [20000, 29999]. Every node derives
/// the same port from the job id alone; the range is below Linux's ephemeral ports
/// (net.ipv4.ip_local_port_range, 32768-60999 by default), so an outgoing connection never
/// holds it. Same idea as Lightning's SLURMEnvironment.main_port (15000 + the last 4 digits).
uint16_t slurm_master_port(uint64_t job_number);

/// Fills `options` from `slurm` (what --slurm does): nnodes, node_rank, master_addr (the first
/// host of the node list) and master_port (slurm_master_port) unless --master-addr /
/// --master-port were given (the flags win); nproc = slurm.gpus when --nproc was not given,
/// --device is cuda and Slurm gave the task GPUs. Throws gpurun::UsageError when gpurun is not
/// one task per node (SLURM_NTASKS != nnodes, SLURM_NTASKS_PER_NODE or
/// SLURM_STEP_TASKS_PER_NODE != 1, SLURM_LOCALID != 0), when --nnodes or --node-rank was given
/// and disagrees with Slurm, with --standalone, or for --master-port 0 on a node other than 0.
/// With --config (an elastic job) --nnodes MIN:MAX must hold Slurm's count: nnodes becomes
/// Slurm's, nnodes_max stays MAX, the most nodes the job may have (later allocations join it).
void apply_slurm(Options& options, const SlurmEnv& slurm);

/// The console line for a Slurm run: "Slurm job J step S: node N of M, master HOST:PORT"
/// (N from 0, like --node-rank), plus "; --nproc K from VAR" when the GPUs set --nproc.
std::string slurm_banner(const Options& options, const SlurmEnv& slurm);

/// Decides whether this run uses Slurm (Options::slurm, SlurmEnv::detect) and applies it.
/// kOff: nothing. kOn: parse + apply_slurm, and a UsageError when not inside a step. kAuto:
/// when detect() is true and none of --nnodes, --node-rank, --standalone was given, as kOn;
/// when one was, nothing is applied. Returns the line to print once (the banner, or why a
/// detected step is not used); nullopt when there is nothing to say. Throws what parse and
/// apply_slurm throw.
std::optional<std::string> use_slurm(Options& options, const SlurmEnv::Map& env);

/// The SLURM_* variables workers keep: job-level identity (for logs, checkpoint names, array
/// sweeps) and what `scontrol requeue $SLURM_JOB_ID` needs. Task-level ones (SLURM_NTASKS,
/// SLURM_PROCID, SLURM_LOCALID, SLURM_NODEID, SLURM_STEP_*, ...) are not kept: a worker is a
/// gpurun worker, not a Slurm task, and e.g. Lightning's SLURMEnvironment.detect() is true as
/// soon as SLURM_NTASKS is set. Sorted.
const std::vector<std::string>& slurm_vars_for_workers();

/// Removes from `env` every variable whose name starts with "SLURM_" and is not in
/// slurm_vars_for_workers(). build_worker_env() runs it on every worker's environment.
void remove_slurm_task_vars(std::map<std::string, std::string>& env);

}  // namespace gpurun::supervisor
