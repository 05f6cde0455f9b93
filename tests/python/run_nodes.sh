#!/usr/bin/env bash
# ctest python_nodes_<case>: one elastic job (--config) over several gpurun processes ("nodes")
# on loopback (issue 46; docs/cli.md#elastic-nodes), each node 2 CPU slots (--device cpu, gloo)
# running tests/python/decorated_train.py (Debian's torch 1.13). Node 0 starts at once
# (`--nnodes 1:3 --node-rank 0 --master-port 0`, the port read from its "node 0's store listens
# on port N" line); node k > 0 is `--nnodes 1:3 --node-rank k --master-addr 127.0.0.1
# --master-port N` with its own config, and its local slot i is job slot k*1000+i.
# Cases:
#   join                 node 1 joins once node 0 trains epoch 2: its slots 1000, 1001 enter
#                        at a boundary (decision active [0,1,1000,1001], world 4, status.json
#                        "nodes" lists node 1 live), training goes on to the end; both exit 0.
#   leave                2 nodes (world 4), then SIGTERM to node 1's gpurun: its slots leave
#                        at the next boundary (leavers [1000,1001], world 2), node 0 releases
#                        node 1 while it still trains and node 1 exits 0 (within 15 s of the
#                        SIGTERM), node 0 goes on and exits 0.
#   kill                 2 nodes (world 4), then kill -9 of node 1's gpurun: its workers die
#                        with it (parent-death signal), node 0's survivors go on without them
#                        (decision failed [1000,1001], world 2; the step where the collective
#                        failed runs again over 2 ranks), node 0 exits 0.
#   two_to_three_to_two  2 nodes -> node 2 joins (world 6) -> node 1 leaves by SIGTERM (world
#                        4: [0,1,2000,2001]) -> node 2 killed (-9) -> node 0 ends alone
#                        (world 2); node 1 exits 0, node 0 exits 0.
# Every case asserts: each epoch trains each of the 240 samples exactly once over all ranks
# (steps a rank completed before its death included), every rank of an epoch starts it from
# the same state checksum (a joiner's state came from a peer), the worlds follow the case's
# sequence, every gpurun that was not killed exits 0. (kill: a rank killed after its step's
# all-reduce but before it wrote the step's line would show as samples missing from that epoch;
# the window is well under 1 ms of each ~30 ms step, not seen in 10+ runs.)
# Usage: run_nodes.sh GPURUN join|leave|kill|two_to_three_to_two (KEEP_TMP=1 keeps the logs)
CASE=${2:?usage: run_nodes.sh GPURUN join|leave|kill|two_to_three_to_two}
TEST=python_nodes_$CASE
source "$(dirname "$0")/common.sh"
mkdir -p "$TMP/out"
EPOCHS=60                # at ~0.5 s an epoch before OUT/fast: room for every step of a case
export STEP_SLEEP=0.03   # per optimizer step (15 steps an epoch at world 2) until OUT/fast
export GPURUN_COMM_TIMEOUT_MS=20000
export WAIT_FOR_EVERY=0.2  # the waits below read every step log: not every 50 ms on 2 cores
declare -A npid          # node k's gpurun (k > 0), started by this script
pid=                     # node 0's gpurun (common.sh's wait_running watches it)

stop_all() {  # the gpuruns this script started and that still run (their workers go with them)
  local p
  for p in ${pid:-} "${npid[@]}"; do
    [[ -n $p && $p -gt 1 ]] && kill -9 "$p" 2> /dev/null
  done
  return 0
}
trap 'stop_all; [[ -n ${KEEP_TMP:-} ]] || rm -rf "$TMP"' EXIT
[[ -z ${KEEP_TMP:-} ]] || echo "$TEST: its files stay in $TMP (KEEP_TMP)"
fail() {
  echo "$TEST: FAIL: $*" >&2
  local f
  for f in "$LOG" "$TMP"/node*.log; do
    [[ -f $f ]] || continue
    echo "-- the last 30 lines of $(basename "$f"):" >&2
    tr '\r' '\n' < "$f" | tail -30 >&2
  done
  if [[ -f $TMP/events.jsonl ]]; then
    echo "-- node 0's decisions ($TMP/events.jsonl):" >&2
    grep '"event": "decision"' "$TMP/events.jsonl" | tail -8 >&2
  fi
  stop_all
  exit 1
}

# The highest epoch any rank has taken a step in (-1: none yet). awk, not python (every 0.2 s).
epoch_now() { cat "$TMP"/out/steps.* 2> /dev/null | awk -F'[:,]' '
BEGIN { n = -1 } /^\{"epoch": [0-9]+,/ { if ($2 + 0 > n) n = $2 + 0 } END { print n }'; }
in_epoch() { (($(epoch_now) >= $1)); }
wait_epoch() { wait_running 60 "a step of epoch $1" in_epoch "$1"; }
# A step of epoch >= $1 at world $2 (a world the job reached after epoch $1 began).
world_since() { cat "$TMP"/out/steps.* 2> /dev/null | awk -F'[:,]' -v e="$1" -v w="\"world\": $2," '
/^\{"epoch": [0-9]+,/ && $2 + 0 >= e && index($0, w) { found = 1 } END { exit !found }'; }
wait_world() { wait_running 60 "world $2 from epoch $1 on" world_since "$1" "$2"; }
note() { echo "$TEST: $* (after ${SECONDS} s, epoch $(epoch_now) of $EPOCHS)"; }
decided() { grep -qs "\"event\": \"decision\".*$1" "$TMP/events.jsonl"; }
wait_decision() { wait_running 60 "a decision with $1" decided "$1"; }

printf 'active_gpus = [0, 1]\n' > "$TMP/c0.toml"
"$GPURUN" --master-port 0 --nnodes 1:3 --node-rank 0 --device cpu --nproc 2 --config "$TMP/c0.toml" \
  --event-log "$TMP/events.jsonl" "$PY" "$HERE/decorated_train.py" "$TMP/out" "$EPOCHS" > "$LOG" 2>&1 &
pid=$!
wait_line "node 0's store listens on port [0-9]+"
PORT=$(sed -nE "s/.*node 0's store listens on port ([0-9]+).*/\1/p" "$LOG" | head -1)

start_node() {  # start_node K: node K's gpurun (2 slots, both offered) into npid[K]
  printf 'active_gpus = [0, 1]\n' > "$TMP/c$1.toml"
  "$GPURUN" --nnodes 1:3 --node-rank "$1" --master-addr 127.0.0.1 --master-port "$PORT" \
    --device cpu --nproc 2 --config "$TMP/c$1.toml" --event-log "$TMP/events$1.jsonl" \
    "$PY" "$HERE/decorated_train.py" "$TMP/out" "$EPOCHS" > "$TMP/node$1.log" 2>&1 &
  npid[$1]=$!
}
# The slots of node K enter: a decision with them active, and a step at the world they make.
wait_joined() {  # wait_joined ACTIVE WORLD (ACTIVE as the event log writes it: [0,1,1000,1001])
  wait_decision "\"active\": \\$1"
  wait_world "$(epoch_now)" "$2"
}
# wait_node_exit K SECONDS [training]: node K's gpurun ends within SECONDS with status 0; with
# "training", while node 0's job still trains (a leaving node does not wait for the job's end).
wait_node_exit() {
  local p=${npid[$1]} rc=0 i
  for ((i = 0; i < $2 * 5; i++)); do kill -0 "$p" 2> /dev/null || break; sleep 0.2; done
  kill -0 "$p" 2> /dev/null && fail "node $1's gpurun (pid $p) still runs after $2 s"
  wait "$p" || rc=$?
  unset "npid[$1]"
  ((rc == 0)) || fail "node $1's gpurun exited $rc"
  if [[ ${3:-} == training ]]; then
    kill -0 "$pid" 2> /dev/null || fail "node $1's gpurun exited only once node 0's job ended"
    grep -q "node $1: node 0 released this node" "$TMP/node$1.log" \
      || fail "node $1's gpurun exited without node 0's release"
  fi
}
# node K's gpurun killed with SIGKILL: its workers (its children) must be gone within 10 s
kill_node() {
  local p=${npid[$1]} kids w i
  kids=$(cat /proc/"$p"/task/*/children 2> /dev/null)
  [[ -n $kids ]] || fail "node $1's gpurun (pid $p) has no worker process"
  kill -9 "$p"
  wait "$p" 2> /dev/null || true
  unset "npid[$1]"
  for w in $kids; do
    for ((i = 0; i < 50; i++)); do kill -0 "$w" 2> /dev/null || break; sleep 0.2; done
    kill -0 "$w" 2> /dev/null && fail "node $1's worker pid $w outlived its gpurun's SIGKILL by 10 s"
  done
  return 0
}

WORLDS=
case $CASE in
  join)
    wait_epoch 2
    start_node 1
    wait_joined "[0,1,1000,1001]" 4
    note "node 1's slots joined"
    grep -q "node 1: joined node 0's elastic job" "$TMP/node1.log" || fail "node 1 did not say it joined"
    # status.json (gpurun status --json) lists node 1, live, with its job slot ids
    "$GPURUN" status --json --pid "$pid" > "$TMP/status.json" || fail "gpurun status --json failed"
    grep -q '"nodes":\[{"node":1,[^]]*"state":"live","slots":\[1000,1001\]' "$TMP/status.json" \
      || fail "status.json does not list node 1 live with slots [1000,1001]: $(cat "$TMP/status.json")"
    wait_epoch $(($(epoch_now) + 1))
    touch "$TMP/out/fast"
    WORLDS="2 4"
    ;;
  leave)
    start_node 1
    wait_joined "[0,1,1000,1001]" 4
    wait_epoch $(($(epoch_now) + 1))
    kill -TERM "${npid[1]}"
    note "SIGTERM to node 1"
    wait_decision '"leavers": \[1000,1001\]'
    grep -q "node 1 (.*) is leaving the job (SIGTERM)" "$LOG" || fail "node 0 did not say node 1 leaves"
    wait_node_exit 1 15 training
    note "node 1 left"
    wait_world "$(epoch_now)" 2
    touch "$TMP/out/fast"
    WORLDS="2? 4 2"
    ;;
  kill)
    start_node 1
    wait_joined "[0,1,1000,1001]" 4
    wait_epoch $(($(epoch_now) + 1))
    kill_node 1
    note "node 1 killed"
    wait_decision '"failed": \[1000,1001\]'
    grep -q "node 1 (.*) was lost" "$LOG" || fail "node 0 did not say node 1 was lost"
    wait_world "$(epoch_now)" 2
    touch "$TMP/out/fast"
    WORLDS="2? 4 2"
    ;;
  two_to_three_to_two)
    start_node 1
    wait_joined "[0,1,1000,1001]" 4
    note "node 1's slots joined"
    start_node 2
    wait_joined "[0,1,1000,1001,2000,2001]" 6
    note "node 2's slots joined"
    kill -TERM "${npid[1]}"
    wait_decision '"active": \[0,1,2000,2001\]'
    wait_node_exit 1 15 training
    wait_world "$(epoch_now)" 4
    note "node 1 left"
    kill_node 2
    wait_decision '"failed": \[2000,2001\]'
    wait_world "$(epoch_now)" 2
    touch "$TMP/out/fast"
    WORLDS="2? 4 6 4 2"
    ;;
  *) fail "unknown case '$CASE' (join, leave, kill, two_to_three_to_two)" ;;
esac

note "the last event happened; the remaining epochs go fast"
rc=0
wait "$pid" || rc=$?
pid=
((rc == 0)) || fail "node 0's gpurun exited $rc"
for k in "${!npid[@]}"; do wait_node_exit "$k" 30; done

"$PY" - "$TMP/out" "$EPOCHS" "$WORLDS" <<'PY' || fail "the checks above"
import collections, glob, json, sys
out, epochs, want = sys.argv[1], int(sys.argv[2]), sys.argv[3].split()
steps = [json.loads(l) for f in glob.glob(out + "/steps.*") for l in open(f)]
starts = [json.loads(l) for f in glob.glob(out + "/epochs.*") for l in open(f)]
worlds = []  # the worlds in the order the job went through them (collapsed)
for e in range(epochs):
    mine = [s for s in steps if s["epoch"] == e]
    seen = sorted(i for s in mine for i in s["seen"])
    assert seen == list(range(240)), f"epoch {e}: {len(seen)} samples, {len(set(seen))} distinct"
    sums = {s["checksum"] for s in starts if s["epoch"] == e}
    assert len(sums) == 1, f"epoch {e}: ranks start from different states {sums}"
    for s in sorted(mine, key=lambda s: s["step"]):
        if not worlds or worlds[-1] != s["world"]:
            worlds.append(s["world"])
print("worlds in order:", worlds)
# WANT: the worlds the job goes through, in order; a leading "2?" may be absent (node 1 ready
# before node 0's first boundary). Between two of them the world may pass through values in
# between (a node's warm joiners not ready at the same boundary enter one after the other).
targets = [int(w.rstrip("?")) for w in want]
if want[0].endswith("?") and worlds[0] != targets[0]:
    targets = targets[1:]
ok, j = worlds[0] == targets[0], 0
for w in worlds[1:]:
    if not ok or j + 1 >= len(targets):
        ok = False
        break
    lo, hi = sorted((targets[j], targets[j + 1]))
    if w == targets[j + 1]:
        j += 1
    elif not lo < w < hi:
        ok = False
assert ok and j == len(targets) - 1, f"worlds {worlds}, want {want}"
slots = {int(f.rsplit("/", 1)[1].split(".")[1]) for f in glob.glob(out + "/steps.*")}
print("job slots that trained:", sorted(slots))
assert slots <= {0, 1, 1000, 1001, 2000, 2001}, slots
assert {1000, 1001} <= slots, f"node 1's slots 1000, 1001 never trained: {sorted(slots)}"
PY
echo "$TEST: OK"
