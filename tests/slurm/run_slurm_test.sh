#!/usr/bin/env bash
# A real Slurm on this machine (Debian's slurm-wlm + munge, installed by scripts/setup.sh), and
# scripts/slurm/*.sbatch submitted to it with sbatch:
#   run_slurm_test.sh scripts  GPURUN            single-node, multi-node (2 slurmd), a failing
#                                                worker, preempt.sbatch with USR2 + requeue
#   run_slurm_test.sh main-job GPURUN FMNIST     the Fashion-MNIST main job through
#                                                single-node.sbatch, resized twice
# Everything lives in a temp dir: munged with its own key and socket, slurmctld and two slurmd
# (-N names, own ports) in the foreground as this script's children, state, spool, logs.
# Exit 0: passed; 1: failed (the daemons' logs are printed, the dir kept); 77: skipped because
# the Slurm or munge binaries are missing (ctest SKIP_RETURN_CODE). GPURUN_SLURM_TEST_KEEP=1 keeps the
# dir after a pass too; GPURUN_SLURM_TEST_NAMES=unresolvable runs the fallback for machines
# with fewer than two resolvable names.
set -uo pipefail
mode=${1:?usage: run_slurm_test.sh scripts|main-job GPURUN [FMNIST]}
GPURUN=$(realpath "${2:?the gpurun binary}")
FMNIST=${3:+$(realpath "$3")}
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
scripts=$repo/scripts/slurm

for b in munged munge slurmctld slurmd sbatch srun scontrol scancel sinfo; do
  command -v "$b" >/dev/null || PATH=$PATH:/usr/sbin command -v "$b" >/dev/null || {
    echo "SKIP: '$b' not found: install Debian's slurm-wlm and munge (scripts/setup.sh does)"
    exit 77
  }
done
export PATH=$PATH:/usr/sbin
for v in $(compgen -e | grep '^SLURM' || true); do unset "$v"; done  # CI itself under Slurm
start_time=$SECONDS

T=$(mktemp -d "${TMPDIR:-/tmp}/gpurun-slurm-XXXXXX")
chmod 755 "$T"
mkdir -p "$T"/{munge,state,log,out,work}
pids=()  # slurmctld and the slurmd's this script started (its own children)
munged_pid=0
failed=0
say() { echo "slurm-test: $*"; }
fail() { say "FAIL: $*"; failed=1; }
. "$here/../common/wait_for.sh"  # wait_for: on a timeout, fail (the test goes on) and return 1
WAIT_FOR_EVERY=0.2  # scontrol and sinfo are costly on the 2-core machine

cleanup() {
  if ((${#pids[@]})); then  # first Slurm (it needs munge to shut down), then munged
    scancel --quiet --user="$(id -un)" 2>/dev/null
    scontrol shutdown >/dev/null 2>&1  # slurmctld and every slurmd it knows
    for _ in $(seq 50); do
      alive=0
      for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
      ((alive)) || break
      sleep 0.2
    done
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && kill "$p" 2>/dev/null; done
  fi
  ((munged_pid > 1)) && kill "$munged_pid" 2>/dev/null
  wait 2>/dev/null
  if ((failed)); then
    for f in "$T"/log/*.log "$T"/out/*; do
      [[ -f $f ]] && { echo "----- $f (last 40 lines)"; tail -n 40 "$f"; }
    done
    say "kept $T"
  elif [[ ${GPURUN_SLURM_TEST_KEEP:-0} == 1 ]]; then
    say "kept $T"
  else
    rm -rf "$T"
  fi
}
trap cleanup EXIT
trap 'fail "interrupted"; exit 1' INT TERM

free_ports() {  # N free TCP ports on this machine
  python3 - "$1" <<'EOF'
import socket, sys
socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks:
    s.bind(("", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))
EOF
}
port_free() { python3 -c "import socket,sys; socket.socket().bind(('', int(sys.argv[1])))" "$1" 2>/dev/null; }

# ---- node names: gpurun's master is the first host of the node list, so node names must
# resolve to this machine. Slurm replaces NodeName=localhost by the host name, so take other
# names of this machine: the host name and /etc/hosts names of loopback addresses.
mapfile -t candidates < <({
  hostname -s 2>/dev/null; hostname 2>/dev/null
  awk '$1 ~ /^(127\.|::1$)/ { for (i = 2; i <= NF; ++i) print $i }' /etc/hosts 2>/dev/null
} | grep -E '^[A-Za-z][A-Za-z0-9-]*$' | grep -vx localhost | awk '!seen[$0]++')
nodes=()
for n in "${candidates[@]}"; do
  getent hosts "$n" >/dev/null && nodes+=("$n")
  ((${#nodes[@]} == 2)) && break
done
extra_gpurun_args="" master=""
[[ ${GPURUN_SLURM_TEST_NAMES:-} == unresolvable ]] && nodes=()  # tries the fallback below
if ((${#nodes[@]} < 2)); then
  # Not a Slurm limit: the names would not resolve for gpurun. Fall back to --master-addr.
  say "note: fewer than two names of this machine resolve (${nodes[*]:-none}); using nodes" \
    "n1,n2 and --master-addr 127.0.0.1"
  nodes=(n1 n2)
  extra_gpurun_args="--master-addr 127.0.0.1"
  master=127.0.0.1
fi
# Slurm numbers a job's nodes in name order (SLURM_NODEID 0 = the first host of the sorted
# node list): N1 is node 0.
mapfile -t nodes < <(printf '%s\n' "${nodes[@]}" | LC_ALL=C sort)
N1=${nodes[0]} N2=${nodes[1]}
master=${master:-$N1}  # what gpurun must give the workers as MASTER_ADDR

# ---- munge: own key, socket, pid, log; foreground, so $! is munged itself
dd if=/dev/urandom of="$T/munge/munge.key" bs=1024 count=1 status=none
chmod 600 "$T/munge/munge.key"
munged -F -f --socket="$T/munge/socket" --key-file="$T/munge/munge.key" \
  --pid-file="$T/munge/munged.pid" --log-file="$T/log/munged.log" \
  --seed-file="$T/munge/munged.seed" >"$T/log/munged.out" 2>&1 &
munged_pid=$!
wait_for 5 "munged's socket $T/munge/socket" test -S "$T/munge/socket"
munge -S "$T/munge/socket" -n | unmunge -S "$T/munge/socket" >/dev/null ||
  { fail "munged did not start"; exit 1; }

# ---- slurm.conf
read -r ctld_port d1_port d2_port dflt_port < <(free_ports 4)
# gpurun's store port is 20000 + job id % 10000: start at a job id whose port range is free
first_job=1000
for _ in $(seq 20); do
  first_job=$((1000 + RANDOM % 8000))
  ok=1
  for i in $(seq 0 9); do port_free $((20000 + first_job + i)) || ok=0; done
  ((ok)) && break
done
user=$(id -un)
mem_mb=$(awk '/MemTotal/ { print int($2 / 1024 / 4) }' /proc/meminfo)
export SLURM_CONF=$T/slurm.conf
cat >"$SLURM_CONF" <<EOF
ClusterName=gpuruntest
SlurmctldHost=$(hostname -s)(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$dflt_port
SlurmUser=$user
SlurmdUser=$user
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$T/munge/socket
StateSaveLocation=$T/state
SlurmdSpoolDir=$T/spool/%n
SlurmctldPidFile=$T/slurmctld.pid
SlurmdPidFile=$T/slurmd.%n.pid
SlurmctldLogFile=$T/log/slurmctld.log
SlurmdLogFile=$T/log/slurmd.%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$T/log/jobcomp.txt
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
FirstJobId=$first_job
MinJobAge=3600
KillWait=10
# two slurmd on this machine, one per node name, each on its own port; 1 CPU each (task/none
# does not pin, so gpurun's workers may use both cores)
NodeName=$N1 NodeHostname=$N1 NodeAddr=127.0.0.1 Port=$d1_port CPUs=1 RealMemory=$mem_mb
NodeName=$N2 NodeHostname=$N2 NodeAddr=127.0.0.1 Port=$d2_port CPUs=1 RealMemory=$mem_mb
PartitionName=test Nodes=$N1,$N2 Default=YES MaxTime=UNLIMITED State=UP
EOF
mkdir -p "$T/spool/$N1" "$T/spool/$N2"

slurmctld -D -i >"$T/log/slurmctld.out" 2>&1 &
pids+=($!)
for n in "$N1" "$N2"; do
  slurmd -D -N "$n" >"$T/log/slurmd.$n.out" 2>&1 &
  pids+=($!)
done
both_idle() { [[ $(sinfo -h -N -o '%N %t' 2>/dev/null | grep -c ' idle$') == 2 ]]; }
wait_for 30 "slurmctld and both slurmd to come up (idle)" both_idle ||
  { say "sinfo: $(sinfo -N 2>&1)"; exit 1; }
say "Slurm $(sinfo -V | awk '{print $2}') up in $((SECONDS - start_time)) s: nodes $N1,$N2" \
  "(two slurmd), job ids from $first_job, dir $T"

# ---- helpers
submit() {  # sbatch ARGS... -> job id
  local id
  id=$(cd "$T/work" && sbatch --parsable --time=10 --output="$T/out/%x-%j.out" "$@") ||
    { fail "sbatch $*"; return 1; }
  echo "${id%%;*}"
}
job_field() { scontrol show job -o "$1" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$2=//p"; }
job_ended() {  # ID: its state ($s) is a final one
  s=$(job_field "$1" JobState)
  case $s in
    COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY | BOOT_FAIL | DEADLINE) return 0 ;;
  esac
  return 1
}
wait_job() {  # ID TIMEOUT_S: wait for a final state; echoes "STATE EXITCODE"
  local s
  if wait_for "$2" "job $1 to end" job_ended "$1" >&2; then
    echo "$s $(job_field "$1" ExitCode)"
  else
    echo "TIMEOUT-WAITING($s) -"
  fi
}
count() { if [[ -f $1 ]]; then grep -cE -- "$2" "$1"; else echo 0; fi; }  # FILE PATTERN: matching lines
has_lines() { (($(count "$1" "$2") >= $3)); }  # FILE PATTERN COUNT
wait_output() {  # FILE PATTERN COUNT TIMEOUT_S: until COUNT lines match
  wait_for "$4" "$3 line(s) matching '$2' in $(basename "$1")" has_lines "$1" "$2" "$3"
}
expect() {  # FILE PATTERN COUNT WHAT
  local n
  n=$(count "$1" "$2")
  ((n == $3)) || fail "$4: want $3 line(s) matching '$2' in $(basename "$1"), got $n"
}
expect_state() {  # ID "STATE EXITCODE" WHAT
  local got
  got=$(wait_job "$1" 120)
  [[ $got == "$2" ]] || fail "$3: job $1 ended '$got', want '$2'"
}
port_of() { echo $((20000 + $1 % 10000)); }
sum_worker=$here/workers/sum_worker.py
export GPURUN

if [[ $mode == scripts ]]; then
  # single node: 2 CPU workers, the store sum over both, what workers keep of SLURM_*
  export GPURUN_ARGS="--device cpu --nproc 2 $extra_gpurun_args"
  j=$(submit "$scripts/single-node.sbatch" "$sum_worker") || exit 1
  expect_state "$j" "COMPLETED 0:0" single-node
  o=$T/out/gpurun-single-$j.out
  expect "$o" "^gpurun: Slurm job $j step 0: node 0 of 1, master $master:$(port_of "$j")" 1 single-node
  for r in 0 1; do
    expect "$o" "sum_worker: rank $r of 2 local $r group 0 node $N1 .* sum 3 " 1 "single-node rank $r"
  done
  expect "$o" "slurm_vars .*SLURM_(PROCID|NODEID|LOCALID|NTASKS|STEP_ID)" 0 "single-node: task SLURM_* removed"
  expect "$o" "slurm_vars .*SLURM_JOB_ID" 2 "single-node: SLURM_JOB_ID kept"

  # two nodes (two slurmd): one gpurun per node, 2 workers each; global ranks node-major; the
  # sum of RANK+1 over all 4 workers through node 0's store
  j=$(submit "$scripts/multi-node.sbatch" "$sum_worker") || exit 1
  expect_state "$j" "COMPLETED 0:0" multi-node
  o=$T/out/gpurun-multi-$j.out
  for g in 0 1; do
    expect "$o" "^gpurun: Slurm job $j step 0: node $g of 2, master $master:$(port_of "$j")" 1 "multi-node node $g"
  done
  for r in 0 1 2 3; do
    node=$N1
    ((r >= 2)) && node=$N2
    expect "$o" "sum_worker: rank $r of 4 local $((r % 2)) group $((r / 2)) node $node .* sum 10 " 1 \
      "multi-node rank $r"
  done

  # a worker killed by SIGSEGV: gpurun exits 139 and the job fails with it (not a success)
  # shellcheck disable=SC2016  # $RANK and $$ are the worker's
  j=$(submit "$scripts/single-node.sbatch" /bin/sh -c '[ "$RANK" = 1 ] && kill -SEGV $$; exit 0') || exit 1
  expect_state "$j" "FAILED 139:0" "single-node, rank 1 SIGSEGV"
  o=$T/out/gpurun-single-$j.out
  expect "$o" "^gpurun: +rank +: 1 \(local rank 1\)$" 1 "SIGSEGV: root cause names rank 1"
  expect "$o" "^gpurun: +exit +: signal SIGSEGV \(11\)$" 1 "SIGSEGV: root cause names the signal"

  # preemption: USR2 to the batch shell (what --signal=B:USR2@120 does at the time limit), the
  # workers checkpoint and exit 0, the script requeues, the second run resumes
  # 120 steps of 50 ms: the USR2 (sent ~1 s after both started) must land while they train; 30
  # steps of 0.1 s were over before it on a loaded CI machine (the ASan part), so no rank saved.
  export STEPS=120 STEP_SECONDS=0.05 CHECKPOINT_DIR=$T/work/ckpt
  j=$(submit "$scripts/preempt.sbatch" "$scripts/checkpoint-worker.sh") || exit 1
  o=$T/out/gpurun-preempt-$j.out
  if wait_output "$o" "checkpoint-worker: rank [01] of 2 starting at step 0" 2 60; then
    sleep 1
    scancel --signal=USR2 --batch "$j" || fail "scancel --signal=USR2 --batch $j"
  else
    fail "preempt: the workers did not start"
  fi
  requeued() { [[ $(job_field "$j" Restarts) == 1 && $(job_field "$j" JobState) == PENDING ]]; }
  if wait_for 30 "job $j back in the queue (Restarts=1, PENDING)" requeued; then
    # Slurm 22.05 makes a requeued job eligible only ~2 minutes later (its credential is revoked
    # on the node until then); an admin may shorten that. Not to "now": slurmd compares the new
    # credential's creation time with the revocation time in whole seconds, and a relaunch within
    # the same second is killed as "Job credential revoked" (seen in CI).
    scontrol update JobId="$j" StartTime=now+3 || fail "scontrol update StartTime=now+3"
  else
    fail "preempt: job $j was not requeued (Restarts=$(job_field "$j" Restarts), $(job_field "$j" JobState))"
  fi
  expect_state "$j" "COMPLETED 0:0" "preempt (after requeue)"
  expect "$o" "^preempt: job $j run 1 \(SLURM_RESTART_COUNT=0\)" 1 "preempt run 1"
  expect "$o" "^preempt: SIGUSR2: asking the workers to checkpoint" 1 "preempt: trap"
  expect "$o" "^preempt: checkpoint saved; requeueing job $j" 1 "preempt: requeue"
  expect "$o" "^preempt: job $j run 2 \(SLURM_RESTART_COUNT=1\)" 1 "preempt run 2"
  for r in 0 1; do
    saved=$(sed -n "s/.*checkpoint-worker: rank $r: SIGUSR2: checkpoint at step \([0-9]*\) saved.*/\1/p" "$o")
    if [[ -z $saved || $saved == 0 ]]; then
      fail "preempt: rank $r saved no checkpoint after some steps ('${saved}')"
    else
      expect "$o" "checkpoint-worker: rank $r of 2 resumed from step $saved\$" 1 "preempt: rank $r resumed"
      expect "$o" "checkpoint-worker: rank $r: done, $STEPS steps \($((STEPS - saved)) in this run\)" 1 \
        "preempt: rank $r finished in run 2"
    fi
  done
  unset STEPS STEP_SECONDS CHECKPOINT_DIR
elif [[ $mode == main-job ]]; then
  [[ -x ${FMNIST:-} ]] || { fail "main-job needs the fmnist_train binary"; exit 1; }
  # The README's main job through single-node.sbatch: 2 CPU workers, shrunk to 1 after the
  # first epoch and grown back after the second by rewriting config.toml (as scripts/demo.sh)
  cfg=$T/work/config.toml ev=$T/work/events.jsonl m=$T/work/metrics.jsonl
  set_active() { { echo "active_gpus = $1"; grep -v '^active_gpus' "$repo/config.toml"; } >"$cfg.tmp" && mv "$cfg.tmp" "$cfg"; }
  resizes() { grep -c '"event": "decision".*"kind": "resize"' "$ev" 2>/dev/null || true; }
  set_active "[0, 1]"
  export GPURUN_ARGS="--device cpu --nproc 2 --config $cfg --event-log $ev $extra_gpurun_args"
  j=$(submit "$scripts/single-node.sbatch" "$FMNIST" --model tiny --epochs 3 --limit-train 3000 \
    --metrics "$m") || exit 1
  o=$T/out/gpurun-single-$j.out
  if wait_output "$o" "^gpurun: Slurm job $j" 1 60; then
    set_active "[0]"  # applies at the end of epoch 1
    say "main job $j running: config.toml now says active_gpus = [0]"
    resized_or_ended() { (($(resizes) >= 1)) || [[ $(job_field "$j" JobState) != RUNNING ]]; }
    wait_for 120 "main job $j's first resize" resized_or_ended
    set_active "[0, 1]"
    say "main job: $(resizes) resize(s); config.toml now says active_gpus = [0, 1]"
  else
    fail "main job: gpurun did not start"
  fi
  expect_state "$j" "COMPLETED 0:0" "main job"
  [[ $(resizes) == 2 ]] || fail "main job: want 2 resize decisions in the event log, got $(resizes)"
  gpus=$(sed -n 's/.*"gpus":\(\[[0-9,]*\]\).*/\1/p' "$m" | tr '\n' ' ')
  [[ $gpus == "[0,1] [0] [0,1] " ]] || fail "main job: gpus per epoch '$gpus', want '[0,1] [0] [0,1]'"
  acc=$(tail -n 1 "$m" 2>/dev/null | sed -n 's/.*"val_acc":\([0-9.]*\).*/\1/p')
  awk -v a="${acc:-0}" 'BEGIN { exit !(a >= 0.5) }' ||
    fail "main job: final test accuracy '${acc}' below 0.5 (chance is 0.1)"
  say "main job: gpus per epoch $gpus final test accuracy ${acc:-?}"
else
  echo "usage: run_slurm_test.sh scripts|main-job GPURUN [FMNIST]" >&2
  exit 2
fi

if ((failed)); then
  say "FAILED after $((SECONDS - start_time)) s"
  exit 1
fi
say "passed ($mode) in $((SECONDS - start_time)) s"
