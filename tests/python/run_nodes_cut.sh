#!/usr/bin/env bash
# ctest python_nodes_netns_cut (issue 46 item 3, "a cut link"; docs/cli.md#elastic-nodes): run by
# run_nodes_netns.sh inside its namespaces (each node its own address 10.77.0.<k+1> on a veth
# joined to a bridge), never alone. Two nodes, 2 CPU slots each, --node-timeout 3; once the job
# trains at world 4, node 1's veth is taken off the bridge (`ip link set v1 nomaster`): its
# packets go nowhere and nothing tells anyone (no reset, no close; node 1's gpurun and workers
# still run). Asserts: node 0 says node 1 was lost for no heartbeat within --node-timeout plus one
# heartbeat interval and a margin (5 s of the cut); its survivors, blocked in an all-reduce with
# node 1's workers, fail it at once (node 0 severs 10.77.0.2: GPURUN_COMM_TIMEOUT_MS is 60 s
# here) and train on at world 2; node 1's gpurun says it was cut off from node 0 and exits
# non-zero; node 0's exits 0; every epoch trains each sample exactly once, checksums equal
# (nodes_check.py); `gpurun status --json` shows node 1 lost with the reason.
# Usage (run_nodes_netns.sh's role 2 calls it): run_nodes_cut.sh GPURUN cut
TEST=python_nodes_netns_cut
source "$(dirname "$0")/common.sh"
source "$HERE/nodes_lib.sh"
[[ -n ${NETNS_HOLDERS:-} ]] || fail "run it through run_nodes_netns.sh (it needs node namespaces)"
mkdir -p "$TMP/out"
NNODES=1:2
EPOCHS=40
TIMEOUT=3  # --node-timeout, seconds
export STEP_SLEEP=0.03
export GPURUN_COMM_TIMEOUT_MS=60000  # only node 0's severing ends the survivors' all-reduce soon
export WAIT_FOR_EVERY=0.2
TRAIN=(--node-timeout "$TIMEOUT" "$PY" "$HERE/decorated_train.py" "$TMP/out" "$EPOCHS")

printf 'active_gpus = [0, 1]\n' > "$TMP/c0.toml"
node0 "$TMP/c0.toml" "$LOG" "$TMP/events.jsonl"
pid=$!
node0_port
start_node 1
wait_decision '"active": \[0,1,1000,1001\]'
wait_world "$(epoch_now)" 4
note "node 1's slots joined"

ip link set v1 nomaster  # node 1's link is cut: its traffic reaches nobody
cut=$(date +%s%N) cut_epoch=$(epoch_now)
note "node 1's link cut"
lost_line="node 1 \(.*\) was lost: its gpurun sent no heartbeat for [0-9.]+ s \(--node-timeout $TIMEOUT s\)"
wait_running 30 "node 0's word that node 1 was lost" grep -Eqs "$lost_line" "$LOG"
ms=$((($(date +%s%N) - cut) / 1000000))
note "node 0 gave node 1 up ${ms} ms after the cut"
((ms <= TIMEOUT * 1000 + 2000)) || fail "node 0 gave node 1 up only ${ms} ms after the cut"
grep -q "shut down their connections to 10.77.0.2" "$LOG" || fail "node 0 did not sever 10.77.0.2"
# gpurun status (node 0's status.json, rewritten within its coalescing interval): node 1 lost,
# and why
status_lost() {
  "$GPURUN" status --json --pid "$pid" > "$TMP/status.json" 2>&1 &&
    grep -q '"node":1,[^}]*"state":"lost"[^}]*"lost":"its gpurun sent no heartbeat' "$TMP/status.json"
}
wait_running 10 "gpurun status showing node 1 lost for no heartbeat" status_lost
wait_decision '"failed": \[1000,1001\]'
wait_world $((cut_epoch + 1)) 2  # a later epoch: world 2 before the join does not count
ms=$((($(date +%s%N) - cut) / 1000000))
note "the survivors train at world 2, ${ms} ms after the cut"
((ms <= TIMEOUT * 1000 + 12000)) || fail "world 2 only ${ms} ms after the cut (a transport timeout?)"

# Node 1: cut off, its workers stopped, its gpurun ends non-zero, saying so.
p=${npid[1]} rc=0
for ((i = 0; i < 75; i++)); do kill -0 "$p" 2> /dev/null || break; sleep 0.2; done
kill -0 "$p" 2> /dev/null && fail "node 1's gpurun still runs 15 s after the cut"
wait "$p" || rc=$?
unset "npid[1]"
((rc != 0)) || fail "node 1's gpurun exited 0 after it was cut off"
grep -Eq "node 1: cut off from node 0: its store at 10\.77\.0\.1:[0-9]+ has not answered for [0-9.]+ s \(--node-timeout $TIMEOUT s\): if node 0 still runs, it has given this node up by now and the job goes on without this node.s slots" \
  "$TMP/node1.log" || fail "node 1 did not say it was cut off"
note "node 1's gpurun exited $rc, cut off"

touch "$TMP/out/fast"
wait_nodes_end
check_nodes "$TMP/out" "$EPOCHS" "2? 4 2" <<'PY'
import sys
import nodes_check as nc
out, epochs, want = sys.argv[1], int(sys.argv[2]), sys.argv[3].split()
worlds = nc.exactly_once(nc.read(out, "steps"), nc.read(out, "epochs"), epochs)
print("worlds in order:", worlds)
assert nc.follows(worlds, want), f"worlds {worlds}, want {want}"
PY
echo "$TEST: OK (after ${SECONDS} s)"
