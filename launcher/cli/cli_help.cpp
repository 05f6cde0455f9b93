// gpurun's --help and --version text (launcher/cli/cli.hpp).
#include <string>

#include <fmt/format.h>

#include "cli/cli.hpp"

#ifndef GPURUN_VERSION
#define GPURUN_VERSION "0.1.0"
#endif

namespace gpurun::supervisor {

std::string version_text() {
  return fmt::format("gpurun {}", GPURUN_VERSION);
}

std::string help_text() {
  return R"(usage: gpurun [options] [--] command [args...]

Launches one worker process per slot, hosts the TCPStore they rendezvous on,
and supervises them (torchrun-compatible environment, flags and exit codes).

Topology:
  --nproc, --nproc-per-node N|auto|gpu|cpu   workers on this node (default 1)
  --nnodes N              static number of nodes (default 1)
  --node-rank R           index of this node (default 0); node 0 hosts the store
  --master-addr ADDR      store address given to workers (default 127.0.0.1)
  --master-port PORT      store port (default 29500); 0 = pick a free port
  --standalone            single node: MASTER_ADDR=localhost, free port, random run id
  --slurm                 take --nnodes, --node-rank, the master and the default --nproc
                          from Slurm (gpurun run by srun, one task per node); automatic
                          inside a Slurm step unless --nnodes/--node-rank/--standalone
  --no-slurm              ignore Slurm's environment
  --store-memory-budget SIZE  bytes the store may hold for all clients together (e.g. 2GiB;
                          default min(RAM/8, 4 GiB); 0 = unlimited); a client whose request
                          would exceed it loses its connection
  --device cuda|cpu       slots are GPUs (default cuda) or CPU-only virtual slots

torchrun's rendezvous (docs/cli.md#c10d):
  --rdzv-backend c10d|static  c10d: with --nnodes > 1 and no --node-rank, the node whose
                          address the endpoint names hosts the store (node 0), the others
                          take node ranks in join order (the same command on every node)
  --rdzv-endpoint HOST[:PORT]  the store (c10d default port 29400; IPv6 as [::1]:29400)
  --rdzv-conf K=V,...     join_timeout, last_call_timeout, is_host, timeout (read_timeout,
                          close_timeout accepted)
  --nnodes MIN:MAX        c10d: start once MIN nodes joined and last_call_timeout passed
  --local-addr ADDR       this node's address (c10d's is_host rule)
  Every torchrun 2.11 flag is accepted (docs/cli.md#torchrun-flags), in both spellings,
  with --flag=value, and from its PET_* variable; --role, --run-path, -r, -t,
  --local-ranks-filter, --signals-to-handle, --virtual-local-rank act as in torchrun;
  --monitor-interval and --start-method have no effect (gpurun forks and execs).
  python -m torch.distributed.launch lines run as gpurun -m torch.distributed.launch ...:
  each worker also gets --local-rank=N (--local_rank=N for torch < 2.0) unless --use-env
  (docs/cli.md#torchdistributedlaunch-lines).

Supervision:
  --max-restarts K        restart the whole worker set at most K times (default 0)
  --grace-period SECONDS  SIGTERM -> SIGKILL delay on teardown (default 30)
  --exit-barrier-timeout SECONDS  with --nnodes > 1: how long node 0 keeps its store up
                          for the other nodes after its own workers succeeded (default 300)
  --join-timeout SECONDS  with --nnodes > 1: how long the start rendezvous waits for every
                          node to join before any worker starts (default 600)
  --node-timeout SECONDS  with --nnodes > 1: node 0 gives up a node whose gpurun sent no
                          heartbeat for this long, a cut-off node stops (default 30; 0: never)

Preemption (docs/cli.md#preemption):
  --preempt-signal SIG    warning signal turned into a checkpoint request at the workers'
                          next boundary (default USR2; none = plain forwarding off)
  --stop-timeout SECONDS  after SIGTERM, how long runtime workers may take to stop at a
                          boundary before they get SIGTERM (default 30; under Slurm the
                          defaults of this and --grace-period share KillWait - 2 s)
  --requeue               after a stop by SIGTERM or the preempt signal: scontrol requeue
                          $SLURM_JOB_ID and exit 75 when it worked

Logs:
  --log-dir DIR           keep DIR/<run_id>_XXXXXX/attempt_<n>/<rank>/{stdout,stderr}.log
                          (a new unique directory per run, printed at start)
  --redirects SPEC        streams sent only to log files: 0 none, 1 stdout, 2 stderr,
                          3 both, or per local rank like 0:1,1:2
  --tee SPEC              streams sent to log files and the console (same syntax)
  --ranks-filter LIST     console shows only these ranks, e.g. 0,3
  --log-line-prefix-template T  console prefix (default "[rank${rank}]: "),
                          with ${rank}, ${local_rank}, ${role_name}
  --event-log FILE        append JSON-lines events (start, worker_started, ...)
  --metrics-port [ADDR:]PORT  Prometheus /metrics of the job's GPUs, resizes and steps
                          (default address 127.0.0.1; 0.0.0.0 for another host's
                          Prometheus; docs/metrics.md)
  --dcgm-job-dir DIR      keep DCGM exporter's per-GPU job files (--hpc-job-mapping-dir)
                          in DIR: the run id in the file of each GPU the job holds

Energy (docs/energy.md):
  --energy auto|on|off    GPU energy monitor through NVML (default auto: on with
                          --device cuda when NVML loads; on: also --device cpu, slot i
                          standing for visible GPU i, e.g. with a fake NVML)
  --energy-summary FILE   write the run's energy/time/cost summary (JSON) at exit
  --simulate-gpus N|FILE  try the energy features without NVIDIA GPUs: N simulated H200s
                          (or a state file's GPUs); workers on the CPU (docs/energy.md)

Identity:
  --run-id, --rdzv-id ID  TORCHELASTIC_RUN_ID (default none)
  --config FILE           elastic mode: config.toml decides the active GPUs at
                          epoch boundaries (docs/control-protocol.md)

Status of a running job (another terminal):
  gpurun status [--json] [--run-id ID] [--pid PID | --run-dir DIR]
                          --pid: the supervisor's pid, when several runs match

Worker command:
  -m, --module            run `python3 -u -m command args...`
  --no-python             run the command as given even if it ends in .py
  A command ending in .py is run as `python3 -u command args...`.

  -h, --help              this text
  --version               print the version

Examples:
  gpurun --nproc 8 ./train --epochs 3
  gpurun --nproc 4 --device cpu python3 train.py
  gpurun --standalone --nproc-per-node=gpu train.py
  gpurun --nproc 2 --max-restarts 3 --log-dir /tmp/logs --tee 3 -- ./train
  CUDA_VISIBLE_DEVICES=2,3 gpurun --nproc 2 ./train     # slots 0,1 on GPUs 2,3
  srun --nodes=4 --ntasks-per-node=1 --gpus-per-node=8 gpurun ./train   # Slurm

Commands about a running job (each has --help; docs/sharing.md):
  gpurun status [--json]             what the job does, per slot
  gpurun lend GPUS [--for 2h]        stop using GPUS at the next boundary, take them back later
  gpurun reclaim [GPUS]              take lent GPUs back now
  gpurun set KEY=VALUE...            change config.toml, checked as a hand edit
  gpurun report EVENTS.jsonl         draw a run's energy and resizes

Exit status: 0 when every worker succeeds; the first failing worker's exit code,
or 128+signal when it was killed by a signal; 1 for a launcher error; 2 for a
usage error; 127 when the command cannot be found. See docs/cli.md.
)";
}

}  // namespace gpurun::supervisor
