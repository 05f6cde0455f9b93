#!/usr/bin/env bash
# ctest python_gpud_lineup: the gpud form (elastic_scheduler) with a collective after each call
# (tests/python/gpud_lineup.py: rank 0 writes, then a barrier) on 2 CPU slots, started on [1]:
# a grow to [0, 1] brings slot 0 in mid-job (a new process whose loop starts at 0), then a
# shrink to [0] leaves it alone. Asserts: no hang (the joiner's calls go in step with the
# members', so the barriers pair up), the job trains epochs 0 .. EPOCHS-1 once each (the joiner,
# left alone, skips the calls of epochs trained before it came), gpurun exits 0.
TEST=python_gpud_lineup
source "$(dirname "$0")/common.sh"
EPOCHS=24
mkdir -p "$TMP/out"
conf() { printf 'active_gpus = %s\n' "$1" > "$TMP/c.new"; mv "$TMP/c.new" "$TMP/config.toml"; }
calls() { cat "$TMP"/out/calls.* 2>/dev/null | grep -vc ' None ' || true; }
at_least() { (($(calls) >= $1)); }
wait_calls() { wait_running 90 "$1 trained calls" at_least "$1"; }
conf "[1]"
timeout 150 "$GPURUN" --master-port 0 --nproc 2 --device cpu --config "$TMP/config.toml" \
  --event-log "$TMP/events.jsonl" "$PY" "$HERE/gpud_lineup.py" "$TMP/out" "$EPOCHS" > "$LOG" 2>&1 &
pid=$!
wait_calls 3; conf "[0, 1]"
wait_event '"active": \[0,1\],'
wait_calls 12; conf "[0]"
wait_event '"active": \[0\],'
wait "$pid" || fail "gpurun exited $? (a hang ends at the 150 s timeout)"
"$PY" - "$TMP/out" "$EPOCHS" <<'PY' || fail "the checks above"
import glob, sys
epochs = int(sys.argv[2])
rows = [l.split() for f in glob.glob(sys.argv[1] + "/calls.*") for l in open(f)]
trained = sorted(int(t) for _, t, _ in rows if t != "None")
assert trained == list(range(epochs)), f"job epochs trained (rank 0's view): {trained}"
worlds = {int(w) for _, t, w in rows if t != "None"}
assert worlds == {1, 2}, worlds
print(f"epochs 0..{epochs - 1} trained once, worlds {sorted(worlds)}, "
      f"{sum(t == 'None' for _, t, _ in rows)} catch-up calls")
PY
echo "$TEST: OK"
