#!/usr/bin/env bash
# ctest sharing_<case>: lending GPUs of a running job, `gpurun set`, [notify] (issue 27,
# docs/sharing.md), with the real gpurun and fake workers (fake_worker.cpp) on --device cpu.
#   lend_for    lend 2 --for 2s: the next boundary shrinks to [0, 1] (config.toml untouched),
#               `gpurun status` shows the lease; when it ends the job grows back to [0, 1, 2]
#   min_gpus    [policy] min_gpus = 2, lend 1-2: GPU 1 stays (said in status), GPU 2 leaves;
#               reclaim 2: it comes back and GPU 1 (still lent) leaves; reclaim: all back. A
#               leases file broken by hand is said in status and refused by lend
#   set         gpurun set active_gpus=0 shrinks the job with the file's comments kept; a bad
#               value (the hand edit's message), an unknown key, a missing or read-only file are
#               refused and the file is left as it was
#   notify      [notify] command: lease, the resize decisions, lease_end and shutdown reach it
#               in the event log's order, each as its JSON record; the command's failure for one
#               event is said once and the job goes on
#   yield       [policy] yield_to_foreign with the fake NVML (GPURUN_FAKE_NVML): a process of
#               another's on GPU 1 makes the job give it up at the next boundary; gone, GPU 1
#               comes back after reclaim_after_s. gpurun's own worker listed on GPU 2 and a pid
#               not visible here listed on GPU 0 are not taken as another user's
#   bad_files   [energy] profile_cache = "/dev/zero" and a FIFO as <run dir>/leases.json: each
#               said naming the path, the job trains and decides on; lend refuses the FIFO at
#               once; SIGTERM is honoured (docs/errors.md, "Files gpurun reads")
# Usage: sharing.sh GPURUN FAKE_WORKER CASE
set -euo pipefail
GPURUN=$1 WORKER=$2 CASE=$3
TMP=$(mktemp -d)
trap 'kill_run; rm -rf "$TMP"' EXIT
export XDG_RUNTIME_DIR=$TMP/xdg  # our registrations only: `gpurun lend` finds this job alone
mkdir -p "$XDG_RUNTIME_DIR" "$TMP/w"
pid=
foreign=
kill_run() {
  [[ -n $pid && $pid -gt 1 ]] && kill "$pid" 2>/dev/null
  [[ -n $foreign && $foreign -gt 1 ]] && kill "$foreign" 2>/dev/null
  true
}
fail() {
  echo "sharing_$CASE: FAIL: $*" >&2
  echo "-- gpurun stderr" >&2; tail -30 "$TMP/err.log" >&2 || true
  [[ -n ${state:-} ]] && { echo "-- fake NVML state" >&2; cat "$state" >&2; }
  echo "-- events" >&2; grep -v '"worker_state"' "$TMP/events.jsonl" | tail -30 >&2 || true
  [[ -f $TMP/status.out ]] && { echo "-- the last gpurun status" >&2; cat "$TMP/status.out" >&2; }
  exit 1
}
. "$(dirname "$0")/../common/wait_for.sh"
start() {  # start NPROC [FLAGS...]: gpurun with config $TMP/config.toml, epochs of 200 ms
  local n=$1; shift
  "$GPURUN" --device cpu --nproc "$n" "$@" --master-port 0 --run-id share --config "$TMP/config.toml" \
    --event-log "$TMP/events.jsonl" "$WORKER" "$TMP/w" 200 > "$TMP/out.log" 2> "$TMP/err.log" &
  pid=$!
}
# The active set of the N-th resize decision (counting the start as 1), waited for 30 s.
nth_resize() {
  grep '"event": "decision"' "$TMP/events.jsonl" 2>/dev/null |
    grep -E '"kind": "(start|resize)"' | sed -n "${1}p" | sed -E 's/.*"active": (\[[^]]*\]).*/\1/'
}
has_resize() { [[ -n $(nth_resize "$1") ]]; }
resize() { wait_alive "$pid" 30 "resize decision #$1" has_resize "$1"; nth_resize "$1"; }
expect_resize() { local got; got=$(resize "$1"); [[ $got == "$2" ]] || fail "resize $1: active $got, not $2"; }
# Waits (10 s at most) until `gpurun status` shows the job training on $1 ("0, 1"): the
# commands' messages are computed from the status file, written just after the decision.
wait_current() { wait_status "active: current \[$1\]"; }
# Waits (10 s at most) until `gpurun status` shows PATTERN (grep), its output in $TMP/status.out:
# gpurun rewrites the status file at most every 100 ms (StatusWriter), so it may show a decision
# up to that much after the event log does.
status_shows() { "$GPURUN" status > "$TMP/status.out" 2>&1 && grep -q "$1" "$TMP/status.out"; }
wait_status() { wait_for 10 "gpurun status to show '$1'" status_shows "$1"; }
wait_event() { wait_for 30 "an event matching '$1'" grep -qs "$1" "$TMP/events.jsonl"; }  # PATTERN
finish() {  # every worker ends 3 epochs after the latest decision; gpurun must exit 0
  local e
  e=$(grep '"event": "decision"' "$TMP/events.jsonl" | tail -1 | sed -E 's/.*"epoch": ([0-9]+).*/\1/')
  echo $((e + 3)) > "$TMP/w/stop"
  wait "$pid" || fail "gpurun exited $?"
  pid=
}
cfg() { printf '%s\n' "$@" > "$TMP/config.toml"; }

case $CASE in
  lend_for)
    cfg '# three slots' '[boundary]' 'deadline_s = 30'
    cp "$TMP/config.toml" "$TMP/config.before"
    start 3
    expect_resize 1 "[0,1,2]"
    "$GPURUN" lend 2 --for 2s --note "alice's eval" > "$TMP/lend.out" 2>&1 || fail "lend: $(cat "$TMP/lend.out")"
    grep -q 'lent GPUs \[2\] until' "$TMP/lend.out" || fail "lend said: $(cat "$TMP/lend.out")"
    expect_resize 2 "[0,1]"
    wait_status "leases: GPUs \[2\] until .* (alice's eval)"
    grep -q 'declared (config.toml) \[0, 1, 2\]' "$TMP/status.out" || fail "status: $(cat "$TMP/status.out")"
    wait_event '"event": "lease_end".*"why": "expired"'
    expect_resize 3 "[0,1,2]"
    cmp -s "$TMP/config.toml" "$TMP/config.before" || fail "config.toml was changed"
    finish
    ;;
  min_gpus)
    cfg '[policy]' 'min_gpus = 2'
    start 3
    expect_resize 1 "[0,1,2]"
    wait_current "0, 1, 2"
    "$GPURUN" lend 1-2 > "$TMP/lend.out" 2>&1 || fail "lend: $(cat "$TMP/lend.out")"
    grep -q 'lent GPUs \[1, 2\] until gpurun reclaim: the job stops using \[2\] at its next boundary; GPU 1 stays in the job for now (\[policy\] min_gpus = 2)' "$TMP/lend.out" ||
      fail "lend said: $(cat "$TMP/lend.out")"
    expect_resize 2 "[0,1]"
    wait_status 'kept: GPU 1: lent until reclaimed, kept: \[policy\] min_gpus = 2'
    wait_current "0, 1"
    "$GPURUN" reclaim 2 > "$TMP/reclaim.out" 2>&1 || fail "reclaim: $(cat "$TMP/reclaim.out")"
    grep -q 'reclaimed GPUs \[2\]: the job takes back \[2\] at its next boundary; GPU 1 leaves the job in their place (lent until reclaimed)' "$TMP/reclaim.out" ||
      fail "reclaim said: $(cat "$TMP/reclaim.out")"
    wait_event '"event": "lease_end", "gpus": \[2\]'  # only what came back: no new lease
    grep -q '"event": "lease", "gpus": \[1\]' "$TMP/events.jsonl" && fail "a partial reclaim made a new lease"
    # GPU 2 back, GPU 1 still lent: two GPUs are left without it, so it leaves now.
    expect_resize 3 "[0,2]"
    wait_current "0, 2"
    # Lend GPU 2 too: the floor keeps GPU 2, which the job trains on, not GPU 1, which the
    # borrower has now (before: GPU 1 came back and GPU 2 left).
    "$GPURUN" lend 2 > "$TMP/lend2.out" 2>&1 || fail "lend 2: $(cat "$TMP/lend2.out")"
    grep -q 'GPU 2 stays in the job for now (\[policy\] min_gpus = 2)' "$TMP/lend2.out" ||
      fail "lend 2 said: $(cat "$TMP/lend2.out")"
    "$GPURUN" reclaim > "$TMP/reclaim.out" 2>&1 || fail "reclaim: $(cat "$TMP/reclaim.out")"
    expect_resize 4 "[0,1,2]"
    "$GPURUN" lend 7 > "$TMP/bad.out" 2>&1 && fail "lend of GPU 7 was taken"
    grep -q "GPU 7 is not one of this job's GPUs; allowed: 0, 1, 2" "$TMP/bad.out" ||
      fail "lend 7 said: $(cat "$TMP/bad.out")"
    rc=0; "$GPURUN" reclaim 7 > "$TMP/bad.out" 2>&1 || rc=$?
    [[ $rc == 2 ]] && grep -q "GPU 7 is not one of this job's GPUs; allowed: 0, 1, 2" "$TMP/bad.out" ||
      fail "reclaim 7: $rc $(cat "$TMP/bad.out")"
    # A leases file broken by hand: said in status, refused by the commands, nothing changes.
    rundir=$(sed -n 's/.*run dir \([^ ]*\).*/\1/p' "$TMP/status.out" | head -1)
    [[ -d $rundir ]] || fail "no run dir in status: $(cat "$TMP/status.out")"
    echo 'not json' > "$rundir/leases.json"
    wait_for 5 "gpurun status to say the leases file is broken" status_shows \
      "leases file error: $rundir/leases.json: not a leases file"
    rc=0; "$GPURUN" lend 2 > "$TMP/bad2.out" 2>&1 || rc=$?
    [[ $rc == 1 ]] && grep -q 'not a leases file' "$TMP/bad2.out" || fail "lend on a broken file: $rc $(cat "$TMP/bad2.out")"
    finish
    ;;
  set)
    cfg '# keep me' 'active_gpus = [0, 1]' '[park]' 'mode = "release"  # or hold'
    start 2
    expect_resize 1 "[0,1]"
    cp "$TMP/config.toml" "$TMP/config.before"
    "$GPURUN" set park.mode=bogus > "$TMP/bad.out" 2>&1 && fail "a bad park.mode was written"
    grep -q 'park.mode: unknown park mode "bogus"; allowed: "release", "hold"' "$TMP/bad.out" ||
      fail "set park.mode=bogus said: $(cat "$TMP/bad.out")"
    cmp -s "$TMP/config.toml" "$TMP/config.before" || fail "a refused set changed the file"
    # Refused, the file untouched: an unknown key, a file that is not there, a read-only file.
    rc=0; "$GPURUN" set park.mdoe=hold > "$TMP/bad.out" 2>&1 || rc=$?
    [[ $rc == 2 ]] && grep -q "would warn: .*unknown key 'park.mdoe'" "$TMP/bad.out" ||
      fail "set park.mdoe: $rc $(cat "$TMP/bad.out")"
    rc=0; "$GPURUN" set --config "$TMP/nothere.toml" park.mode=hold > "$TMP/bad.out" 2>&1 || rc=$?
    [[ $rc == 1 && ! -e $TMP/nothere.toml ]] && grep -q 'does not exist' "$TMP/bad.out" ||
      fail "set on a missing file: $rc $(cat "$TMP/bad.out")"
    cp "$TMP/config.toml" "$TMP/ro.toml"; chmod 0444 "$TMP/ro.toml"
    rc=0; "$GPURUN" set --config "$TMP/ro.toml" park.mode=hold > "$TMP/bad.out" 2>&1 || rc=$?
    [[ $rc == 1 ]] && grep -q 'is read-only' "$TMP/bad.out" && cmp -s "$TMP/ro.toml" "$TMP/config.before" ||
      fail "set on a read-only file: $rc $(cat "$TMP/bad.out")"
    cmp -s "$TMP/config.toml" "$TMP/config.before" || fail "a refused set changed the file"
    "$GPURUN" set active_gpus=0 > "$TMP/set.out" 2>&1 || fail "set: $(cat "$TMP/set.out")"
    grep -q "active_gpus=0 (takes effect at the job's next boundary)" "$TMP/set.out" ||
      fail "set said: $(cat "$TMP/set.out")"
    expect_resize 2 "[0]"
    # [energy] is read when a job starts: the message says the next run, not the next boundary.
    cp "$TMP/config.toml" "$TMP/other.toml"
    "$GPURUN" set --config "$TMP/other.toml" energy.window_s=5 > "$TMP/set2.out" 2>&1 ||
      fail "set energy.window_s: $(cat "$TMP/set2.out")"
    grep -q "takes effect at the job's next run" "$TMP/set2.out" || fail "set said: $(cat "$TMP/set2.out")"
    grep -q '^# keep me$' "$TMP/config.toml" && grep -q 'active_gpus = \[0\]' "$TMP/config.toml" &&
      grep -q 'mode = "release"  # or hold' "$TMP/config.toml" || fail "file after set: $(cat "$TMP/config.toml")"
    finish
    ;;
  notify)
    # The command appends each record and fails for the lease event (said once; goes on).
    cfg '[notify]' "command = \"cat >> '$TMP/notified.jsonl'; [ \\\"\$GPURUN_NOTIFY_EVENT\\\" != lease ]\""
    start 2
    expect_resize 1 "[0,1]"
    "$GPURUN" lend 1 --for 1s > /dev/null 2>&1 || fail "lend"
    wait_event '"event": "lease_end"'
    expect_resize 3 "[0,1]"
    finish
    grep -q "notify: the command for 'lease' exited with 1; the job goes on" "$TMP/err.log" ||
      fail "the failure was not said"
    # What the command got: every notable event, in the log's order, equal to the log's records.
    /usr/bin/python3 - "$TMP/events.jsonl" "$TMP/notified.jsonl" <<'PY' || fail "the checks above"
import json, sys
log = [l.rstrip("\n") for l in open(sys.argv[1])]
got = [l.rstrip("\n") for l in open(sys.argv[2])]
def wanted(l):
    e = json.loads(l)
    n = e["event"]
    if n in ("lease", "lease_end", "early_stop", "shutdown"): return True
    if n == "decision": return e["kind"] in ("resize", "exit")
    if n == "worker_exited": return "signal" in e or e.get("code", 0) != 0
    return False
want = [l for l in log if wanted(l)]
assert got == want, f"notified {[json.loads(l)['event'] for l in got]}, log {[json.loads(l)['event'] for l in want]}"
names = [json.loads(l)["event"] for l in got]
assert names[0] == "lease" and names[-1] == "shutdown" and "lease_end" in names, names
print("notified:", names)
PY
    ;;
  yield)
    [[ -n ${GPURUN_FAKE_NVML:-} ]] || fail "GPURUN_FAKE_NVML is not set"
    state=$TMP/nvml_state.txt
    for i in 0 1 2; do
      echo "gpu $i uuid=GPU-a000000$i-0000-1234-3333-00000000000$i full_w=500" >> "$state"
    done
    export GPURUN_NVML_LIBRARY=$GPURUN_FAKE_NVML GPURUN_CUDA_LIBRARY=$GPURUN_FAKE_NVML
    export GPURUN_FAKE_NVML_STATE=$state
    cfg '[policy]' 'yield_to_foreign = true' 'reclaim_after_s = 1'
    start 3 --energy on
    expect_resize 1 "[0,1,2]"
    env2() { compgen -G "$TMP/w/env.2.*" > /dev/null; }
    wait_for 10 "slot 2's worker to write $TMP/w/env.2.<pid>" env2
    own=$(compgen -G "$TMP/w/env.2.*" | head -1) || fail "slot 2's worker wrote no env file"
    own=${own##*.}  # slot 2's worker: gpurun's child
    sleep 60 & foreign=$!  # another user's program, as far as gpurun can tell: not its child
    # The fake rewrites the file under flock(2) on every read: change it under the same lock.
    flock "$state" -c "printf 'process 1 $foreign 2048\nprocess 2 $own 900\nprocess 0 4194000 10\n' >> '$state'"
    wait_event '"event": "yield", "gpu": 1'
    expect_resize 2 "[0,2]"
    wait_status 'out: GPU 1: yielded to pid'
    grep -q 'declared (config.toml) \[0, 1, 2\]' "$TMP/status.out" || fail "status: $(cat "$TMP/status.out")"
    grep -q '"event": "yield", "gpu": [02]' "$TMP/events.jsonl" && fail "a GPU of ours or of an unseen pid was yielded"
    kill "$foreign"; wait "$foreign" 2>/dev/null || true; foreign=
    flock "$state" -c "grep -v '^process 1 ' '$state' > '$state.new'; cat '$state.new' > '$state'"
    wait_event '"event": "yield_end", "gpu": 1'
    expect_resize 3 "[0,1,2]"
    grep -q "yield: GPU 1 is used by pid [0-9]* ([^)]*), 2048 MiB: the job gives it up" "$TMP/err.log" ||
      fail "the yield was not said"
    # Yielded again, then the policy turned off by a reload: the GPU comes back, with a
    # yield_end (before: none, so a [notify] command never heard of it).
    sleep 60 & foreign=$!
    flock "$state" -c "printf 'process 1 $foreign 2048
' >> '$state'"
    expect_resize 4 "[0,2]"
    wait_status 'out: GPU 1: yielded to pid'
    "$GPURUN" set policy.yield_to_foreign=false > /dev/null 2>&1 || fail "set yield_to_foreign"
    wait_event '"event": "yield_end", "gpu": 1, .*"why": "policy off"'
    expect_resize 5 "[0,1,2]"
    kill "$foreign"; wait "$foreign" 2>/dev/null || true; foreign=
    finish
    ;;
  bad_files)
    # Files that are not regular files (issue 44): [energy] profile_cache naming /dev/zero is
    # said and the job trains (it never did, growing ~0.5 GB/s); <run dir>/leases.json made a
    # FIFO nobody writes is said once and decisions go on (they froze for good); `gpurun lend`
    # refuses it at once naming it (it hung); SIGTERM ends the job.
    [[ -n ${GPURUN_FAKE_NVML:-} ]] || fail "GPURUN_FAKE_NVML is not set"
    state=$TMP/nvml_state.txt
    for i in 0 1; do
      echo "gpu $i uuid=GPU-a000000$i-0000-1234-3333-00000000000$i full_w=500" >> "$state"
    done
    export GPURUN_NVML_LIBRARY=$GPURUN_FAKE_NVML GPURUN_CUDA_LIBRARY=$GPURUN_FAKE_NVML
    export GPURUN_FAKE_NVML_STATE=$state
    cfg '[energy]' 'power_limit_watts = "auto"' 'profile_cache = "/dev/zero"'
    start 2 --energy on
    expect_resize 1 "[0,1]"
    wait_for 10 "a line on the profile cache /dev/zero" grep -q 'profile cache /dev/zero' "$TMP/err.log"
    grep -q 'the profile cache /dev/zero (\[energy\] profile_cache) cannot be read: it is a character device, not a regular file' "$TMP/err.log" ||
      fail "the /dev/zero cache was not said"
    wait_current "0, 1"
    rundir=$(sed -n 's/.*run dir \([^ ]*\).*/\1/p' "$TMP/status.out" | head -1)
    [[ -d $rundir ]] || fail "no run dir in status: $(cat "$TMP/status.out")"
    mkfifo "$rundir/leases.json"
    wait_for 10 "a line on the FIFO leases.json" grep -q 'leases.json: it is a FIFO' "$TMP/err.log"
    grep -q "warning: cannot read the leases file $rundir/leases.json: it is a FIFO, not a regular file" "$TMP/err.log" ||
      fail "the FIFO was not said"
    rc=0; timeout 10 "$GPURUN" lend 1 > "$TMP/bad.out" 2>&1 || rc=$?
    [[ $rc == 1 ]] && grep -q "leases.json: it is a FIFO, not a regular file" "$TMP/bad.out" ||
      fail "lend on a FIFO: $rc $(cat "$TMP/bad.out")"
    "$GPURUN" set active_gpus=0 > "$TMP/set.out" 2>&1 || fail "set: $(cat "$TMP/set.out")"
    expect_resize 2 "[0]"  # decisions go on
    kill -TERM "$pid"
    ended() { ! kill -0 "$pid" 2> /dev/null; }
    wait_for 10 "SIGTERM to end gpurun (pid $pid)" ended
    rc=0; wait "$pid" || rc=$?
    pid=
    [[ $rc == 143 ]] || fail "gpurun exited $rc after SIGTERM, not 143"
    [[ $(grep -c 'leases.json: it is a FIFO' "$TMP/err.log") == 1 ]] || fail "the FIFO was said more than once"
    ;;
  *) fail "unknown case" ;;
esac
echo "sharing_$CASE: OK"
