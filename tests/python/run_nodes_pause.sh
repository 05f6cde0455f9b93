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
#   lost   node 1's gpurun is killed (-9) while the job is paused: it held the only pause
#          snapshot and node ids are not reused, so the training state is lost: node 0 ends the
#          job at once, exit status 1, saying so (no resume is asked for).
# Asserts: the resume's decision takes its state from the pause snapshot and reaches world 3;
# every epoch trains each of the 240 samples exactly once over all ranks; every rank of an epoch
# starts it from the same state checksum, and the first epoch after the resume does not start
# from the initial state; the copies are said on node 0's console; every gpurun exits 0.
# Usage: run_nodes_pause.sh GPURUN copy|leave|lost
CASE=${2:?usage: run_nodes_pause.sh GPURUN copy|leave|lost}
TEST=python_nodes_pause_$CASE
source "$(dirname "$0")/common.sh"
source "$HERE/nodes_lib.sh"
mkdir -p "$TMP/out"
EPOCHS=14
export STEP_SLEEP=0.03   # per optimizer step until OUT/fast
export GPURUN_COMM_TIMEOUT_MS=20000
export WAIT_FOR_EVERY=0.2
NNODES=3
TRAIN=("$PY" "$HERE/decorated_train.py" "$TMP/out" "$EPOCHS")

conf 0 "[]"
node0 "$TMP/c0.toml" "$LOG" "$TMP/events.jsonl"
pid=$!
node0_port

start_node 1
wait_decision '"active": \[1000,1001\]'
wait_world 0 2
wait_epoch $(($(epoch_now) + 1))
conf 1 "[]"  # the pause: node 1's slots write the snapshot on node 1
wait_decision '"active": \[\]'
wait_event '"gpu": 1000, "from": "OFFLOADING", "to": "PARKED"' # its snapshot is written
PAUSED_AT=$(epoch_now)
if [[ $CASE == lost ]]; then
  kill -9 "${npid[1]}"
  wait "${npid[1]}" 2> /dev/null || true
  unset "npid[1]"
  for ((i = 0; i < 100; i++)); do kill -0 "$pid" 2> /dev/null || break; sleep 0.2; done
  kill -0 "$pid" 2> /dev/null && fail "node 0 still runs 20 s after the loss of the only snapshot"
  rc=0
  wait "$pid" || rc=$?
  pid=
  ((rc == 1)) || fail "node 0's gpurun exited $rc (expected 1: the training state is lost)"
  grep -Eq "the training state is lost: the job is paused and its only pause snapshot \(.*serial 1, written by node 1 gpu [01] in generation [0-9]+\) is on node 1 \(.*\), which was lost: .*node ids are not reused" "$LOG" \
    || fail "node 0 did not say that the state is lost with node 1"
  note "node 0 ended the job (exit 1) at the loss of node 1"
  echo "$TEST: OK"
  exit 0
fi
if [[ $CASE == leave ]]; then
  kill -TERM "${npid[1]}"
  wait_line "copying the pause snapshot from node 1 \(127\.0\.0\.1:[0-9]+\) to node 0 before node 1 leaves"
  wait_line "node 0 has the pause snapshot: [0-9]+ bytes"
  wait_node_exit 1 15 training # node 0 (paused) still runs; it released node 1
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

wait_nodes_end

check_nodes "$TMP/out" "$EPOCHS" "$PAUSED_AT" "$TMP/events.jsonl" <<'PY'
import json, sys
import nodes_check as nc
out, epochs, paused = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
ev = [json.loads(l) for l in open(sys.argv[4])]
resume = [e for e in ev if e["event"] == "decision" and e["kind"] == "resize"
          and e["active"] == [0, 2000, 2001]]
assert resume and resume[0]["state_source"] == -1, f"the resume onto [0, 2000, 2001]: {resume[:1]}"
starts = nc.read(out, "epochs")
nc.exactly_once(nc.read(out, "steps"), starts, epochs)
first = {s["checksum"] for s in starts if s["epoch"] == 0}
after = sorted({s["epoch"] for s in starts if s["epoch"] > paused})
assert after, "no epoch started after the pause"
resumed = {s["checksum"] for s in starts if s["epoch"] == after[0]}
assert resumed != first, f"epoch {after[0]} (after the resume) starts from the initial state"
slots = nc.slots(out)
print("job slots that trained:", sorted(slots))
assert {1000, 1001, 0, 2000, 2001} <= slots, sorted(slots)
PY
echo "$TEST: OK"
