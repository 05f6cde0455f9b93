#!/usr/bin/env bash
# ctest python_nodes_node0_dies, python_nodes_node0_term (issue 46 item 3;
# docs/cli.md#elastic-nodes, "Node 0 gone"): node 0's end ends the other nodes within bounded
# time, with one line that says so. Node 0 and node 1 (2 CPU slots each,
# tests/python/decorated_train.py) train at world 4; then node 0's gpurun (this script's child,
# its pid checked) gets
#   kill (node0_dies)  SIGKILL. Node 1's gpurun must exit within 20 s (a hang check, not a
#                      timing: it takes well under 1 s) with status 1, its console must carry the
#                      line "node 1: node 0's gpurun (127.0.0.1:PORT) is gone (…): the job cannot
#                      go on without it (…); the training state is [only] in the memory of the
#                      job's ranks (…, pid P, Q, …)[; if the job is paused, also in …]; to go on, start a new job (node 0 first) from
#                      the program's own checkpoint …; this node's gpurun exits 1; stopping this
#                      node's workers (…)" once, and no line of gpurun's after it nor one that
#                      says the job goes on or ended otherwise.
#   term (node0_term)  SIGTERM: every rank stops at its next boundary; node 0 exits 143, node 1
#                      within 20 s with 143 and "node 1: node 0 ended the job (node 0's gpurun
#                      received SIGTERM): exit status 143", never "is gone".
# Either way node 1's two worker processes (their pids read before) must be gone. Shares
# tests/python/nodes_lib.sh with run_nodes.sh.
# Usage: run_nodes_node0_dies.sh GPURUN [kill|term] (KEEP_TMP=1 keeps the logs)
CASE=${2:-kill}
TEST=python_nodes_node0_$([[ $CASE == kill ]] && echo dies || echo "$CASE")
source "$(dirname "$0")/common.sh"
source "$HERE/nodes_lib.sh"
mkdir -p "$TMP/out"
EPOCHS=60
export STEP_SLEEP=0.03
export GPURUN_COMM_TIMEOUT_MS=20000  # a hang in a collective would outlast the 20 s bound
export WAIT_FOR_EVERY=0.2
TRAIN=("$PY" "$HERE/decorated_train.py" "$TMP/out" "$EPOCHS")

printf 'active_gpus = [0, 1]\n' > "$TMP/c0.toml"
node0 "$TMP/c0.toml" "$LOG" "$TMP/events.jsonl"
pid=$!
node0_port
start_node 1
wait_decision '"active": \[0,1,1000,1001\]'
wait_world "$(epoch_now)" 4
note "node 1's slots train (world 4)"

# Node 1's workers: the children of its gpurun, each a process of one of its slots.
p1=${npid[1]}
kids=$(cat /proc/"$p1"/task/*/children 2> /dev/null)
(($(wc -w <<< "$kids") == 2)) || fail "node 1's gpurun (pid $p1) has not 2 worker processes: '$kids'"
# Node 0's gpurun: this script's child, still the gpurun it started.
[[ $pid -gt 1 ]] && grep -qa -- "--node-rank" /proc/"$pid"/cmdline \
  || fail "pid $pid is not node 0's gpurun"
rc0=0
if [[ $CASE == term ]]; then
  kill -TERM "$pid"
  wait "$pid" 2> /dev/null || rc0=$?
  note "node 0's gpurun exited $rc0 after SIGTERM"
  ((rc0 == 143)) || fail "node 0's gpurun exited $rc0 after SIGTERM, not 143"
else
  kill -9 "$pid"
  wait "$pid" 2> /dev/null || true
  note "node 0's gpurun killed (-9)"
fi
pid=
start=$EPOCHREALTIME

for ((i = 0; i < 100; i++)); do kill -0 "$p1" 2> /dev/null || break; sleep 0.2; done
kill -0 "$p1" 2> /dev/null && fail "node 1's gpurun (pid $p1) still runs 20 s after node 0's end"
rc=0
wait "$p1" || rc=$?
unset "npid[1]"
ms=$(((${EPOCHREALTIME/./} - ${start/./}) / 1000))
note "node 1's gpurun exited $rc, ${ms} ms after node 0's end"
for w in $kids; do
  kill -0 "$w" 2> /dev/null && fail "node 1's worker pid $w outlived its gpurun"
done
console=$TMP/node1.log
if [[ $CASE == term ]]; then
  ((rc == 143)) || fail "node 1's gpurun exited $rc, not 143 (node 0 stopped by SIGTERM)"
  grep -q "^gpurun: node 1: node 0 ended the job (node 0's gpurun received SIGTERM): exit status 143" \
    "$console" || fail "node 1 does not say node 0 ended the job after its SIGTERM"
  ! grep -q "is gone" "$console" || fail "node 1 says node 0 is gone after node 0's orderly stop"
  echo "$TEST: OK"
  exit 0
fi
((rc == 1)) || fail "node 1's gpurun exited $rc, not 1 (node 0 gone)"
gone="node 1: node 0's gpurun \(127\.0\.0\.1:$PORT\) is gone \(.*\): the job cannot go on without it \(node 0 holds the job's store and makes every decision\); the training state is (only )?in the memory of the job's ranks \(node 0's ended with it; this node's, pid [0-9]+, [0-9]+, are stopped now: [^;]*\)(; if the job is paused, also in this node's pause snapshot [^;]*)?; to go on, start a new job \(node 0 first\) from the program's own checkpoint, if it writes one; this node's gpurun exits 1; stopping this node's workers \(SIGTERM, SIGKILL after [0-9]+ ms\)"
n=$(tr '\r' '\n' < "$console" | grep -cE "$gone" || true)
((n == 1)) || fail "node 1's console has $n lines saying node 0 is gone (want 1): $(tr '\r' '\n' < "$console")"
# gpurun's own lines after it (workers' lines, "[gpu0]: …", may still drain): none.
after=$(tr '\r' '\n' < "$console" | sed -nE "/$gone/,\$p" | tail -n +2 | grep '^gpurun: ' || true)
[[ -z $after ]] || fail "node 1's gpurun said more after node 0 gone: $after"
# No line of the node, its own or its workers', says the job goes on or ended otherwise.
contra=$(tr '\r' '\n' < "$console" | grep -vE "$gone" \
  | grep -E "go(es)? on without|released this node|ended the job|exits 0" || true)
[[ -z $contra ]] || fail "node 1's console contradicts node 0 gone: $contra"
echo "$TEST: OK"
