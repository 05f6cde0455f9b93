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
#                        "nodes" lists node 1 live; node 1's own gpurun status shows slot 1000
#                        ACTIVE at rank 2, its worker lines read [rank3 gpu1001]: ), training
#                        goes on to the end; both exit 0.
#   leave                2 nodes (world 4), then SIGINT (Ctrl-C) to node 1's gpurun: its slots
#                        leave at the next boundary (leavers [1000,1001], world 2; no
#                        KeyboardInterrupt), node 0 releases node 1 while it still trains and
#                        node 1 exits 130 (within 15 s of the SIGINT), node 0 goes on and exits 0.
#   kill                 2 nodes (world 4), then kill -9 of node 1's gpurun: its workers die
#                        with it (parent-death signal), node 0's survivors go on without them
#                        (decision failed [1000,1001], world 2; the step where the collective
#                        failed runs again over 2 ranks), node 0 exits 0.
#   kill_loop            kill, with decorated_train.py's loop form (FORM=loop: `for epoch in
#                        rt.epochs(n)`, a plain backward and optimizer step), node 1 killed
#                        while the others wait in a step's all-reduce for slot 0 (held there:
#                        HOLD_AT_WORLD=4): the survivors' all-reduce fails inside the program's
#                        own backward(); the runtime marks the step failed (no update; the
#                        program skips its step line, writes a failed line) and recovers at the
#                        loader's next step (docs/python.md#failures). Asserts a survivor saw
#                        that failed step.
#   two_to_three_to_two  2 nodes -> node 2 joins (world 6) -> node 1 leaves by SIGTERM (world
#                        4: [0,1,2000,2001]) -> node 2 killed (-9) -> node 0 ends alone
#                        (world 2); node 1 exits 0, node 0 exits 0.
# Every case asserts: each epoch trains each of the 240 samples exactly once over all ranks
# (steps a rank completed before its death included), every rank of an epoch starts it from
# the same state checksum (a joiner's state came from a peer), the worlds follow the case's
# sequence, every gpurun that was not killed exits 0. (kill: a rank killed after its step's
# all-reduce but before it wrote the step's line would show as samples missing from that epoch;
# the window is well under 1 ms of each ~30 ms step, not seen in 10+ runs.)
# Usage: run_nodes.sh GPURUN join|leave|kill|kill_loop|two_to_three_to_two (KEEP_TMP=1 keeps
# the logs)
CASE=${2:?usage: run_nodes.sh GPURUN join|leave|kill|kill_loop|two_to_three_to_two}
TEST=python_nodes_$CASE
source "$(dirname "$0")/common.sh"
source "$HERE/nodes_lib.sh"
mkdir -p "$TMP/out"
EPOCHS=60                # at ~0.5 s an epoch before OUT/fast: room for every step of a case
export STEP_SLEEP=0.03   # per optimizer step (15 steps an epoch at world 2) until OUT/fast
export GPURUN_COMM_TIMEOUT_MS=20000
export WAIT_FOR_EVERY=0.2  # the waits below read every step log: not every 50 ms on 2 cores
TRAIN=("$PY" "$HERE/decorated_train.py" "$TMP/out" "$EPOCHS")
[[ $CASE != kill_loop ]] || export FORM=loop HOLD_AT_WORLD=4  # gpurun passes them on
[[ $CASE != two_to_three_to_two ]] || export HOLD_AT_WORLD=6,4

printf 'active_gpus = [0, 1]\n' > "$TMP/c0.toml"
node0 "$TMP/c0.toml" "$LOG" "$TMP/events.jsonl"
pid=$!
node0_port

# The slots of node K enter: a decision with them active, and a step at the world they make.
wait_joined() {  # wait_joined ACTIVE WORLD (ACTIVE as the event log writes it: [0,1,1000,1001])
  wait_decision "\"active\": \\$1"
  wait_world "$(epoch_now)" "$2"
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
    # node 1's own status (gpurun status on its host): its part, node 0's store, its ranks
    "$GPURUN" status --pid "${npid[1]}" > "$TMP/status1.txt" || fail "gpurun status on node 1 failed"
    grep -q "^node 1 of an elastic job over several nodes: live; node 0's gpurun (store at 127.0.0.1:$PORT)" \
      "$TMP/status1.txt" && grep -qE "^1000 +- +ACTIVE +[0-9]+ +2 " "$TMP/status1.txt" \
      || fail "node 1's gpurun status: $(cat "$TMP/status1.txt")"
    wait_epoch $(($(epoch_now) + 1))
    touch "$TMP/out/fast"
    WORLDS="2 4"
    ;;
  leave)
    start_node 1
    wait_joined "[0,1,1000,1001]" 4
    wait_epoch $(($(epoch_now) + 1))
    kill -INT "${npid[1]}"  # Ctrl-C: leaves as SIGTERM does (two_to_three_to_two: SIGTERM)
    note "SIGINT to node 1"
    wait_decision '"leavers": \[1000,1001\]'
    grep -q "node 1 (.*) is leaving the job (SIGINT)" "$LOG" || fail "node 0 did not say node 1 leaves"
    WANT_RC=130 wait_node_exit 1 15 training
    note "node 1 left"
    wait_world "$(epoch_now)" 2
    touch "$TMP/out/fast"
    WORLDS="2? 4 2"
    ;;
  kill | kill_loop)
    start_node 1
    wait_joined "[0,1,1000,1001]" 4
    if [[ $CASE == kill ]]; then
      wait_epoch $(($(epoch_now) + 1))
    else
      wait_running 60 "slot 0 held before a step at world 4" test -e "$TMP/out/held"
    fi
    kill_node 1
    touch "$TMP/out/go"
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
    # Killed while its ranks wait in a step's all-reduce for slot 0 (held): the step fails
    # everywhere and runs again. (A kill between a completed all-reduce and the killed rank's
    # step line would lose that step's line, not its training: the checker could not tell.)
    wait_running 60 "slot 0 held before a step at world 4" test -e "$TMP/out/held"
    kill_node 2
    touch "$TMP/out/go"
    wait_decision '"failed": \[2000,2001\]'
    wait_world "$(epoch_now)" 2
    touch "$TMP/out/fast"
    WORLDS="2? 4 6 4 2"
    ;;
  *) fail "unknown case '$CASE' (join, leave, kill, kill_loop, two_to_three_to_two)" ;;
esac

note "the last event happened; the remaining epochs go fast"
wait_nodes_end
# node 1's workers' lines are named as node 0 names their slots: job slot id and rank
[[ $CASE != join ]] || grep -q "^\[rank3 gpu1001\]: decorated_train slot 1001: done, world 4" "$TMP/node1.log" \
  || fail "node 1's worker lines lack node 0's names ([rank3 gpu1001]: )"

check_nodes "$TMP/out" "$EPOCHS" "$WORLDS" <<'PY'
import sys
import nodes_check as nc
out, epochs, want = sys.argv[1], int(sys.argv[2]), sys.argv[3].split()
worlds = nc.exactly_once(nc.read(out, "steps"), nc.read(out, "epochs"), epochs)
print("worlds in order:", worlds)
# WANT: the worlds the job goes through, in order (nodes_check.follows)
assert nc.follows(worlds, want), f"worlds {worlds}, want {want}"
slots = nc.slots(out)
print("job slots that trained:", sorted(slots))
assert slots <= {0, 1, 1000, 1001, 2000, 2001}, slots
assert {1000, 1001} <= slots, f"node 1's slots 1000, 1001 never trained: {sorted(slots)}"
PY
if [[ $CASE == kill_loop ]]; then  # the failure hit a step's all-reduce, not a boundary
  n=$(cat "$TMP"/out/failed.0.* "$TMP"/out/failed.1.* 2> /dev/null | wc -l)
  ((n >= 1)) || fail "neither survivor saw its step fail (rt.step_failed)"
  note "the survivors saw $n failed step(s), each trained again"
fi
echo "$TEST: OK"
