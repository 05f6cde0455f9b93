# shellcheck shell=bash disable=SC2034  # sourced; the variables are the caller's
# Sourced by tests/slurm/run_*.sh (after `set -uo pipefail` and setting `here`, this folder):
# a real Slurm on this machine (Debian's slurm-wlm + munge, installed by scripts/setup.sh) in a
# temp dir $T: munged with its own key and socket, slurmctld and two slurmd (-N names $N1 and
# $N2, own ports) in the foreground as the caller's children, state, spool, logs; removed at
# exit unless the test failed (fail) or GPURUN_SLURM_TEST_KEEP=1. Exit 77 (ctest's skip) when
# the Slurm or munge binaries are missing. GPURUN_SLURM_TEST_NAMES=unresolvable runs the
# fallback for machines with fewer than two resolvable names. Sets: T, N1, N2 (N1 is Slurm's
# node 0), master (what gpurun gives workers as MASTER_ADDR), extra_gpurun_args (flags every
# gpurun of the test needs), first_job, start_time; defines say, fail, wait_for, submit,
# job_field, job_ended, wait_job, count, has_lines, wait_output, expect, expect_state, port_of.
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
    # Let cancelled jobs end first (KillWait=10): a step still running when slurmctld is gone
    # keeps its slurmstepd retrying, and slurmd waits for it (seen: a 10-minute hang).
    for _ in $(seq 75); do
      [[ -z $(squeue -h -o %i 2>/dev/null) ]] && break
      sleep 0.2
    done
    scontrol shutdown >/dev/null 2>&1  # slurmctld and every slurmd it knows
    alive() {
      local p
      for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && return 0; done
      return 1
    }
    for _ in $(seq 50); do alive || break; sleep 0.2; done
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && kill "$p" 2>/dev/null; done
    for _ in $(seq 10); do alive || break; sleep 0.2; done
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && kill -9 "$p" 2>/dev/null; done
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
