#!/usr/bin/env bash
# ctest python_step_boundary_<mode>: [boundary] every = 4 steps (10 steps an epoch on 3 ranks)
# with the decorator form (tests/python/decorated_train.py) on 3 CPU slots: [0,1,2] -> [0]
# -> [0,2], each taking effect at a step boundary inside an epoch. Asserts: each sample trained
# exactly once in every epoch (the ranks' steps together), some epoch trained by two world
# sizes (a resize inside it), the last world 2, gpurun exits 0.
# Usage: run_step_boundary.sh GPURUN release|hold
MODE=${2:-release}
TEST=python_step_boundary_$MODE
source "$(dirname "$0")/common.sh"
mkdir -p "$TMP/out"
# Hold mode reads the batches with 2 DataLoader workers per rank (loader_kwargs): each segment
# up to the next step boundary has its own DataLoader, ended before the boundary.
export WORKERS=$([[ $MODE == hold ]] && echo 2 || echo 0)
conf() { printf 'active_gpus = %s\n[park]\nmode = "%s"\n[boundary]\nevery = 4\n' "$1" "$MODE" > "$TMP/c.new"
         mv "$TMP/c.new" "$TMP/config.toml"; }
steps() { cat "$TMP"/out/steps.* 2>/dev/null | wc -l; }
# Waits until $1 steps are logged and rank 0 has just taken the first or second step of an
# epoch: the next boundary (step 4) is then inside the epoch, not at its end.
epoch_start() {  # N
  # rank 0's last step (awk, not python: a python3 start is ~40 ms of CPU every 0.05 s)
  (( $(steps) >= $1 )) && cat "$TMP"/out/steps.* | awk -F'[:,]' '
/^\{"epoch": [0-9]+, "step": [0-9]+, "rank": 0,/ { seen = 1; last = $4 + 0 } END { exit !(seen && last <= 1) }'
}
wait_epoch_start() { wait_running 45 "an epoch start after $1 steps" epoch_start "$1"; }
conf "[0, 1, 2]"
STEP_SLEEP=0.15 "$GPURUN" --master-port 0 --nproc 3 --device cpu --config "$TMP/config.toml" --event-log "$TMP/events.jsonl" \
  "$PY" "$HERE/decorated_train.py" "$TMP/out" 8 > "$LOG" 2>&1 &
pid=$!
wait_epoch_start 20; conf "[0]"
wait_event '"active": \[0\],'
wait_epoch_start 60; conf "[0, 2]"
wait_event '"active": \[0,2\]'
: > "$TMP/out/fast"  # the last resize is seen: the remaining steps without their sleep
wait "$pid" || fail "gpurun exited $?"
"$PY" - "$TMP/out" "$TMP/events.jsonl" <<'PY' || fail "the checks above"
import collections, glob, json, sys
steps = [json.loads(l) for f in glob.glob(sys.argv[1] + "/steps.*") for l in open(f)]
resizes = [json.loads(l) for l in open(sys.argv[2]) if '"event": "decision"' in l]
resizes = [d for d in resizes if d["kind"] == "resize"]
mid = [d for d in resizes if d["step"] > 0]
assert len(mid) >= 2, f"resizes at (epoch, step): {[(d['epoch'], d['step']) for d in resizes]}"
mixed = 0
for e in range(8):
    seen = sorted(i for s in steps if s["epoch"] == e for i in s["seen"])
    assert seen == list(range(240)), f"epoch {e}: {len(seen)} samples, {len(set(seen))} distinct"
    worlds = sorted({s["world"] for s in steps if s["epoch"] == e})
    mixed += len(worlds) > 1
    print(f"epoch {e}: 240 samples once, worlds {worlds}")
assert mixed >= 1, "no epoch was resized inside"
last = [s for s in steps if s["epoch"] == 7]
assert {s["world"] for s in last} == {2}, "the last epoch did not run on 2 ranks"
print("resizes at (epoch, step):", [(d["epoch"], d["step"]) for d in resizes])
PY
echo "python_step_boundary_$MODE: OK"
