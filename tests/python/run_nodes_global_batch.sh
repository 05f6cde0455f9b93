#!/usr/bin/env bash
# ctest python_nodes_global_batch (issue 46's evidence "the loss curve against an unresized run
# with the global batch kept"): tests/python/global_batch.py, `[batch] global = 48` (each rank's
# share of a step's 48 samples in micro-batches of at most 16: 16 + 8 at world 2, 12 at world 4,
# 8 at world 6; Runtime.steps accumulates), on loopback, 2 CPU slots per gpurun node (--device
# cpu, gloo; the launch lines of run_nodes.sh and docs/cli.md#elastic-nodes). Two runs of
# EPOCHS epochs:
#   unresized  node 0 alone (`--nnodes 1:3 --node-rank 0`, no other node): world 2 throughout.
#   elastic    node 0, then node 1 joins (world 4), node 2 joins (world 6), SIGTERM to node 1
#              (it leaves at the next boundary: world 4, [0,1,2000,2001]), kill -9 of node 2
#              (world 2).
# Asserts: the elastic run went through worlds (2) 4 6 4 2 (a node's two warm joiners may enter
# at two boundaries: 3 or 5 between), every gpurun not killed exits 0,
# and each epoch's mean loss (over all its samples, all ranks; float64 sums of float32 losses)
# equals the unresized run's within 1e-5 relative (+1e-9): both runs train the same 48 samples
# per step from the same state in the same order (the elastic sampler's window), the gradient
# is their mean either way, and only the order of float32 sums differs (3 micro-batches
# accumulated on a rank vs. Gloo's all-reduce over ranks): differences of ~1e-7 relative.
# Where: joins and leaves take effect at an epoch's boundary, and node 2 is killed there too:
# the script holds the ranks between an epoch's loss all-reduce and its boundary (OUT/hold,
# global_batch.py) and kills node 2 once rank 0 holds (OUT/held: no rank gets past the
# boundary) and every rank's all-reduce of that epoch returned (OUT/reduced.<slot>), so no
# step and no collective is cut in half. (A kill -9 mid-step re-runs that step on the survivors, which keeps the model's
# trajectory, but this program's per-epoch loss sum would lose the dead rank's share and count
# the re-run step's first micro-batches twice: that epoch's printed loss would differ.)
# GLOBAL_BATCH= (empty) runs both without [batch] global (each rank's batch of 16 kept: 32,
# 64 or 96 samples a step): the curves then agree up to the first join and differ from there
# on, and the test fails.
# Usage: run_nodes_global_batch.sh GPURUN (KEEP_TMP=1 keeps the logs)
TEST=python_nodes_global_batch
source "$(dirname "$0")/common.sh"
source "$HERE/nodes_lib.sh"
EPOCHS=60
SLEEP=0.4 # between epochs, until OUT/fast: room for the joins and the leave
GLOBAL=${GLOBAL_BATCH-48}
export GPURUN_COMM_TIMEOUT_MS=20000
export WAIT_FOR_EVERY=0.2
mkdir -p "$TMP/fixed" "$TMP/out"
touch "$TMP/fixed/fast"
TRAIN=("$PY" "$HERE/global_batch.py" "$TMP/out" "$EPOCHS" "$SLEEP")
# every node's config: slots 0, 1 offered, [batch] global = GLOBAL when not empty
NODE_CONFIG='active_gpus = [0, 1]'
[[ -z $GLOBAL ]] || NODE_CONFIG+=$'\n[batch]\nglobal = '"$GLOBAL"
epochs_done() { wc -l < "$TMP/out/loss" 2> /dev/null || echo 0; }
progress() { echo "$(epochs_done) of $EPOCHS epochs done"; }
# The last epoch done was at world $1 (rank 0's loss line "epoch loss world").
at_world() { [[ $(tail -1 "$TMP/out/loss" 2> /dev/null | cut -d' ' -f3) == "$1" ]]; }
wait_loss_world() { wait_running 60 "an epoch done at world $1" at_world "$1"; }

printf '%s\n' "$NODE_CONFIG" > "$TMP/fixed.toml"
node0 "$TMP/fixed.toml" "$TMP/fixed.log" /dev/null "$PY" "$HERE/global_batch.py" "$TMP/fixed" "$EPOCHS" "$SLEEP"
also_stop=($!) # the unresized run's gpurun
printf '%s\n' "$NODE_CONFIG" > "$TMP/c0.toml"
node0 "$TMP/c0.toml" "$LOG" "$TMP/events.jsonl"
pid=$!
node0_port

start_node 1
wait_decision '"active": \[0,1,1000,1001\]'
wait_loss_world 4
note "node 1 joined"
start_node 2
wait_decision '"active": \[0,1,1000,1001,2000,2001\]'
wait_loss_world 6
note "node 2 joined"
kill -TERM "${npid[1]}"
wait_decision '"active": \[0,1,2000,2001\]'
wait_loss_world 4
wait_node_exit 1 30
note "node 1 left"
# kill -9 of node 2 between an epoch's loss all-reduce and its boundary
touch "$TMP/out/hold"
wait_running 60 "rank 0 holding between epochs ($TMP/out/held)" test -s "$TMP/out/held"
# every rank of [0,1,2000,2001] is past its all-reduce of the epoch rank 0 holds after
reduced() { local s; for s in 0 1 2000 2001; do [[ $(cat "$TMP/out/reduced.$s" 2> /dev/null) == "$1" ]] || return 1; done; }
wait_running 30 "every rank's loss all-reduce of epoch $(cat "$TMP/out/held")" reduced "$(cat "$TMP/out/held")"
kill_node 2
note "node 2 killed after epoch $(cat "$TMP/out/held")"
rm "$TMP/out/hold"
wait_decision '"failed": \[2000,2001\]'
touch "$TMP/out/fast"
wait_nodes_end
rc=0
wait "${also_stop[0]}" || rc=$?
also_stop=()
((rc == 0)) || fail "the unresized run's gpurun exited $rc"

echo "epoch, loss, world: unresized | elastic"
paste "$TMP/fixed/loss" "$TMP/out/loss"
check_nodes "$TMP/fixed/loss" "$TMP/out/loss" "$EPOCHS" "$(cat "$TMP/out/held")" <<'PY'
import sys
f = [l.split() for l in open(sys.argv[1])]
e = [l.split() for l in open(sys.argv[2])]
epochs, held = int(sys.argv[3]), int(sys.argv[4])
assert len(f) == len(e) == epochs, (len(f), len(e))
assert [int(x[0]) for x in e] == list(range(epochs)), "the elastic run's epochs are not 0..n-1"
worlds = []
for x in e:
    if not worlds or worlds[-1] != int(x[2]):
        worlds.append(int(x[2]))
print("elastic worlds in order:", worlds)
# (2) 4 6 4 2; a node's two warm joiners may enter at two boundaries: 3 or 5 between
want = [2, 4, 6, 4, 2] if worlds[0] == 2 else [4, 6, 4, 2]
plain = [w for i, w in enumerate(worlds)
         if not (w in (3, 5) and 0 < i < len(worlds) - 1 and worlds[i - 1] < w < worlds[i + 1])]
assert plain == want, f"worlds {worlds}, want (2) 4 6 4 2"
assert int(e[held][2]) == 4 and int(e[held + 1][2]) == 2, f"node 2 was killed after epoch {held}"
worst = 0.0
for a, b in zip(f, e):
    fa, fb = float(a[1]), float(b[1])
    rel = abs(fa - fb) / abs(fa)
    worst = max(worst, rel)
    assert abs(fa - fb) <= 1e-5 * abs(fa) + 1e-9, \
        f"epoch {a[0]}: unresized {fa}, elastic {fb} (world {b[2]}): {rel:.2e} relative"
print(f"largest difference: {worst:.2e} relative")
PY
echo "$TEST: OK"
