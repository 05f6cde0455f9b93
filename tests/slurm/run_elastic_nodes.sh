#!/usr/bin/env bash
# ctest slurm_elastic_nodes_<case>: one elastic job (--config) over two Slurm "nodes" (the two
# slurmd of cluster.sh on this machine) through scripts/slurm/elastic-nodes.sbatch and
# elastic-join.sbatch (docs/cli.md#an-elastic-job-over-several-nodes-under-slurm). Every node
# runs 2 CPU slots (gloo) of tests/python/decorated_train.py (Debian's torch 1.13).
#   shrink  a 2-node job; once node 1's slots train (world 4), `scontrol update JobId=J
#           NodeList=<node 0's host>`: Slurm 22.05 SIGKILLs the step's processes on the node it
#           takes away at once (slurmctld: "Killing JobId=J StepId=0 on failed node ..."), so
#           node 1's gpurun and workers die; node 0 finds node 1 lost (its store connection
#           closed), the survivors go on (world 2), node 0 exits 0 and the job is COMPLETED 0:0
#           although srun exited 137.
#   join    a 1-node job with GPURUN_MAX_NODES=2 (--slurm --nnodes 1:2: room for one more node); once
#           it trains, a second allocation (JOIN_JOB=J sbatch elastic-join.sbatch) on the other
#           node joins it: its slots enter at a boundary (world 4), node 0 ends the job, both
#           jobs are COMPLETED 0:0.
# Both assert: each epoch trains each of the 240 samples exactly once over all ranks, every
# rank of an epoch starts it from the same state checksum, node 1's slots 1000, 1001 trained.
# Exit 0: passed; 1: failed (logs printed, dir kept); 77: Slurm, munge or torch missing.
# Usage: run_elastic_nodes.sh shrink|join GPURUN
set -uo pipefail
case=${1:?usage: run_elastic_nodes.sh shrink|join GPURUN}
GPURUN=$(realpath "${2:?the gpurun binary}")
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
scripts=$repo/scripts/slurm
PY=$("$repo/tests/python/find_torch_python.sh") || { echo "SKIP: no python3 with torch"; exit 77; }

. "$here/cluster.sh"  # Slurm up: $T, $N1, $N2, submit, expect, …
W=$T/work
mkdir -p "$W/out"
EPOCHS=60                # ~0.5 s an epoch until out/fast: room for the case's resize
export STEP_SLEEP=0.03   # per optimizer step until out/fast (tests/python/decorated_train.py)
export GPURUN_COMM_TIMEOUT_MS=20000
printf 'active_gpus = [0, 1]\n' > "$W/c.toml"
export GPURUN GPURUN_CONFIG=$W/c.toml
export GPURUN_ARGS="--device cpu --nproc 2 --event-log $W/events.jsonl $extra_gpurun_args"
train=("$PY" "$repo/tests/python/decorated_train.py" "$W/out" "$EPOCHS")

# a step of any rank at world $1 (the slots' step logs, one JSON line per step)
at_world() { cat "$W"/out/steps.* 2>/dev/null | grep -q "\"world\": $1,"; }
decided() { grep -qs "\"event\": \"decision\".*$1" "$W/events.jsonl"; }

if [[ $case == shrink ]]; then
  j=$(submit "$scripts/elastic-nodes.sbatch" "${train[@]}") || exit 1
  o=$T/out/gpurun-elastic-$j.out
  wait_for 90 "node 1's slots training (world 4)" at_world 4 || exit 1
  scontrol update JobId="$j" NodeList="$N1" || fail "scontrol update JobId=$j NodeList=$N1"
  [[ $(job_field "$j" NodeList) == "$N1" ]] || fail "job $j still holds $(job_field "$j" NodeList)"
  wait_for 60 "node 0's decision without node 1's slots" decided '"failed": \[1000,1001\]'
  touch "$W/out/fast"
  expect_state "$j" "COMPLETED 0:0" "shrink"
  expect "$o" "^srun: error: $N2: task 1: Killed" 1 "shrink: Slurm killed node 1's gpurun"
  expect "$o" "^gpurun: node 1 \([^,]+, gpurun pid [0-9]+\) was lost" 1 "shrink: node 0 saw node 1 lost"
  expect "$o" "node 0's gpurun exited 0" 1 "shrink: the job's status is node 0's"
  grep -q "Killing JobId=$j StepId=0 on failed node $N2" "$T/log/slurmctld.log" ||
    fail "shrink: slurmctld did not kill step $j.0 on $N2"
  WORLDS="4 2"
elif [[ $case == join ]]; then
  export GPURUN_MAX_NODES=2
  j=$(submit --nodes=1 --nodelist="$N1" "$scripts/elastic-nodes.sbatch" "${train[@]}") || exit 1
  unset GPURUN_MAX_NODES
  o=$T/out/gpurun-elastic-$j.out
  wait_for 90 "job $j training (world 2)" at_world 2 || exit 1
  expect "$o" "^gpurun: Slurm job $j step 0: node 0 of 1, .*an elastic job of up to 2 nodes" 1 "join: job $j's room"
  export JOIN_JOB=$j GPURUN_ARGS="--device cpu --nproc 2"
  [[ $master == 127.0.0.1 ]] && JOIN_ADDR=$master:$(port_of "$j") && export JOIN_ADDR  # names do not resolve
  k=$(submit --nodelist="$N2" "$scripts/elastic-join.sbatch" "${train[@]}") || exit 1
  ok=$T/out/gpurun-join-$k.out
  wait_for 90 "the second allocation's slots training (world 4)" at_world 4 || exit 1
  touch "$W/out/fast"
  expect_state "$j" "COMPLETED 0:0" "join: the first job"
  expect_state "$k" "COMPLETED 0:0" "join: the second allocation"
  expect "$ok" "^gpurun: node 1: joined node 0's elastic job '[^']*' at [^ ]+:$(port_of "$j") with 2 slot" 1 \
    "join: the second allocation's gpurun joined"
  expect "$ok" "^gpurun: node 1: node 0 ended the job \(the job finished\): exit status 0" 1 \
    "join: node 0 ended node 1"
  expect "$o" "^gpurun: node 1 \([^,]+, gpurun pid [0-9]+\) joined the job" 1 "join: node 0 took node 1"
  WORLDS="2 4"
else
  fail "unknown case '$case' (shrink, join)"
  exit 1
fi

PYTHONPATH=$repo/tests/python "$PY" - "$W/out" "$EPOCHS" "$WORLDS" <<'PY' || fail "$case: the training checks above"
import sys
import nodes_check as nc
out, epochs, want = sys.argv[1], int(sys.argv[2]), [int(w) for w in sys.argv[3].split()]
worlds = nc.exactly_once(nc.read(out, "steps"), nc.read(out, "epochs"), epochs)
print("worlds in order:", worlds)
# WANT in order (a warm joiner not ready in time enters a boundary later: world 3 between)
it = iter(worlds)
assert all(w in it for w in want), f"worlds {worlds}, want {want} in this order"
assert worlds[-1] == want[-1], f"the job ended at world {worlds[-1]}, want {want[-1]}"
slots = nc.slots(out)
print("job slots that trained:", sorted(slots))
assert slots == {0, 1, 1000, 1001}, sorted(slots)
PY

if ((failed)); then
  say "FAILED ($case) after $((SECONDS - start_time)) s"
  exit 1
fi
say "passed (elastic nodes, $case) in $((SECONDS - start_time)) s"
