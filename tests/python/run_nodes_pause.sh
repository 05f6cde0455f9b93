#!/usr/bin/env bash
# ctest python_nodes_pause_<case>: pause and resume of one elastic job over several gpurun
# processes ("nodes") on loopback (issue 46 item 4; docs/cli.md#elastic-nodes, "Pause and resume
# across nodes"), each node 2 CPU slots running tests/python/decorated_train.py. Node 0 offers
# nothing at first (active_gpus = []); node 1 joins and trains alone (world 2: slots 1000, 1001);
# its config is edited to [] and the job pauses: the pause snapshot is written on node 1. Then the
# job resumes on nodes {0, 2}: node 0's config offers [0] and node 2 joins offering [0, 1] (world
# 3: [0, 2000, 2001]), their joiners loading a copy of node 1's snapshot, moved over TCP between
# the gpurun processes (not through the store).
# Cases:
#   copy   node 1 stays (paused, offering nothing): node 0 and node 2 each copy the snapshot
#          from node 1.
#   leave  node 1 is sent SIGTERM while the job is paused: it holds the only pause snapshot, so
#          node 0 copies it first and releases node 1 after (node 1 exits 0); node 2 then copies
#          it from node 0.
# Asserts: the resume's decision takes its state from the pause snapshot and reaches world 3;
# every epoch trains each of the 240 samples exactly once over all ranks; every rank of an epoch
# starts it from the same state checksum, and the first epoch after the resume does not start
# from the initial state; the copies are said on node 0's console; every gpurun exits 0.
# Usage: run_nodes_pause.sh GPURUN copy|leave
CASE=${2:?usage: run_nodes_pause.sh GPURUN copy|leave}
TEST=python_nodes_pause_$CASE
source "$(dirname "$0")/common.sh"
mkdir -p "$TMP/out"
EPOCHS=14
export STEP_SLEEP=0.03   # per optimizer step until OUT/fast
export GPURUN_COMM_TIMEOUT_MS=20000
export WAIT_FOR_EVERY=0.2
declare -A npid          # node k's gpurun (k > 0)
pid=                     # node 0's gpurun

stop_all() {
  local p
  for p in ${pid:-} "${npid[@]}"; do
    [[ -n $p && $p -gt 1 ]] && kill -9 "$p" 2> /dev/null
  done
  return 0
}
trap 'stop_all; [[ -n ${KEEP_TMP:-} ]] || rm -rf "$TMP"' EXIT
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

epoch_now() { cat "$TMP"/out/steps.* 2> /dev/null | awk -F'[:,]' '
BEGIN { n = -1 } /^\{"epoch": [0-9]+,/ { if ($2 + 0 > n) n = $2 + 0 } END { print n }'; }
in_epoch() { (($(epoch_now) >= $1)); }
wait_epoch() { wait_running 60 "a step of epoch $1" in_epoch "$1"; }
world_since() { cat "$TMP"/out/steps.* 2> /dev/null | awk -F'[:,]' -v e="$1" -v w="\"world\": $2," '
/^\{"epoch": [0-9]+,/ && $2 + 0 >= e && index($0, w) { found = 1 } END { exit !found }'; }
wait_world() { wait_running 60 "world $2 from epoch $1 on" world_since "$1" "$2"; }
decided() { grep -qs "\"event\": \"decision\".*$1" "$TMP/events.jsonl"; }
wait_decision() { wait_running 60 "a decision with $1" decided "$1"; }
conf() { printf 'active_gpus = %s\n' "$2" > "$TMP/c$1.toml.new"; mv "$TMP/c$1.toml.new" "$TMP/c$1.toml"; }

conf 0 "[]"
"$GPURUN" --master-port 0 --nnodes 3 --node-rank 0 --device cpu --nproc 2 --config "$TMP/c0.toml" \
  --event-log "$TMP/events.jsonl" "$PY" "$HERE/decorated_train.py" "$TMP/out" "$EPOCHS" > "$LOG" 2>&1 &
pid=$!
wait_line "node 0's store listens on port [0-9]+"
PORT=$(sed -nE "s/.*node 0's store listens on port ([0-9]+).*/\1/p" "$LOG" | head -1)

start_node() {  # start_node K: node K's gpurun (2 slots, both offered)
  conf "$1" "[0, 1]"
  "$GPURUN" --nnodes 3 --node-rank "$1" --master-addr 127.0.0.1 --master-port "$PORT" \
    --device cpu --nproc 2 --config "$TMP/c$1.toml" --event-log "$TMP/events$1.jsonl" \
    "$PY" "$HERE/decorated_train.py" "$TMP/out" "$EPOCHS" > "$TMP/node$1.log" 2>&1 &
  npid[$1]=$!
}
wait_node_exit() {  # wait_node_exit K SECONDS: node K's gpurun ends within SECONDS, status 0
  local p=${npid[$1]} rc=0 i
  for ((i = 0; i < $2 * 5; i++)); do kill -0 "$p" 2> /dev/null || break; sleep 0.2; done
  kill -0 "$p" 2> /dev/null && fail "node $1's gpurun (pid $p) still runs after $2 s"
  wait "$p" || rc=$?
  unset "npid[$1]"
  ((rc == 0)) || fail "node $1's gpurun exited $rc"
}

start_node 1
wait_decision '"active": \[1000,1001\]'
wait_world 0 2
wait_epoch $(($(epoch_now) + 1))
conf 1 "[]"  # the pause: node 1's slots write the snapshot on node 1
wait_decision '"active": \[\]'
wait_event '"gpu": 1000, "from": "OFFLOADING", "to": "PARKED"' # its snapshot is written
PAUSED_AT=$(epoch_now)
if [[ $CASE == leave ]]; then
  kill -TERM "${npid[1]}"
  wait_line "copying the pause snapshot from node 1 \(127\.0\.0\.1:[0-9]+\) to node 0 before node 1 leaves"
  wait_line "node 0 has the pause snapshot: [0-9]+ bytes"
  wait_node_exit 1 15
  grep -q "node 1: node 0 released this node" "$TMP/node1.log" \
    || fail "node 1's gpurun exited without node 0's release"
fi
conf 0 "[0]"  # the resume on nodes {0, 2}
start_node 2
wait_decision '"active": \[0,2000,2001\]'
wait_world "$PAUSED_AT" 3
wait_epoch $(($(epoch_now) + 1))
touch "$TMP/out/fast"
if [[ $CASE == copy ]]; then
  grep -Eq "copying the pause snapshot from node 1 \(127\.0\.0\.1:[0-9]+\) to node 0 for the resume" "$LOG" \
    || fail "node 0 did not copy node 1's snapshot"
  grep -Eq "copying the pause snapshot from node 1 \(127\.0\.0\.1:[0-9]+\) to node 2 for the resume" "$LOG" \
    || fail "node 2 did not copy node 1's snapshot"
else
  grep -Eq "copying the pause snapshot from node 0 \(127\.0\.0\.1:[0-9]+\) to node 2 for the resume" "$LOG" \
    || fail "node 2 did not copy the snapshot from node 0"
fi
grep -Eq "node 2 has the pause snapshot: [0-9]+ bytes" "$LOG" || fail "node 2 never had the snapshot"
grep -q "node 2: the pause snapshot is here" "$TMP/node2.log" || fail "node 2 did not say its copy"

rc=0
wait "$pid" || rc=$?
pid=
((rc == 0)) || fail "node 0's gpurun exited $rc"
for k in "${!npid[@]}"; do wait_node_exit "$k" 30; done

"$PY" - "$TMP/out" "$EPOCHS" "$PAUSED_AT" "$TMP/events.jsonl" <<'PY' || fail "the checks above"
import glob, json, sys
out, epochs, paused = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
ev = [json.loads(l) for l in open(sys.argv[4])]
resume = [e for e in ev if e["event"] == "decision" and e["kind"] == "resize"
          and e["active"] == [0, 2000, 2001]]
assert resume and resume[0]["state_source"] == -1, f"the resume onto [0, 2000, 2001]: {resume[:1]}"
steps = [json.loads(l) for f in glob.glob(out + "/steps.*") for l in open(f)]
starts = [json.loads(l) for f in glob.glob(out + "/epochs.*") for l in open(f)]
for e in range(epochs):
    seen = sorted(i for s in steps if s["epoch"] == e for i in s["seen"])
    assert seen == list(range(240)), f"epoch {e}: {len(seen)} samples, {len(set(seen))} distinct"
    sums = {s["checksum"] for s in starts if s["epoch"] == e}
    assert len(sums) == 1, f"epoch {e}: ranks start from different states {sums}"
first = {s["checksum"] for s in starts if s["epoch"] == 0}
after = sorted({s["epoch"] for s in starts if s["epoch"] > paused})
assert after, "no epoch started after the pause"
resumed = {s["checksum"] for s in starts if s["epoch"] == after[0]}
assert resumed != first, f"epoch {after[0]} (after the resume) starts from the initial state"
slots = {int(f.rsplit("/", 1)[1].split(".")[1]) for f in glob.glob(out + "/steps.*")}
print("job slots that trained:", sorted(slots))
assert {1000, 1001, 0, 2000, 2001} <= slots, sorted(slots)
PY
echo "$TEST: OK"
