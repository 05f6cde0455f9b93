#!/usr/bin/env bash
# ctest python_busy_rank0: busy is not stalled (issue 43 item 4). tests/python/busy_rank0.py on
# 2 CPU slots under gpurun --config with [boundary] deadline_s = 1; rank 0 sleeps 3.5 s at the
# end of each of its 3 epochs (rank-0-only "validation", 3.5x the deadline) while rank 1 waits
# at the boundary. Asserts: nobody is killed, the console names the late rank (gpu, rank, pid,
# how long, k of n) and says it waits, `gpurun status` names it while it is late, gpurun exits
# 0 with no deadline note in its final line, and every epoch is trained by both ranks (each
# sample once).
# Usage: run_busy_rank0.sh GPURUN
TEST=python_busy_rank0
source "$(dirname "$0")/common.sh"
mkdir -p "$TMP/out" "$TMP/xdg"
printf '[boundary]\ndeadline_s = 1\n' > "$TMP/config.toml"
export XDG_RUNTIME_DIR=$TMP/xdg  # the run registers here: `gpurun status` finds it
"$GPURUN" --master-port 0 --nproc 2 --device cpu --config "$TMP/config.toml" \
  --event-log "$TMP/events.jsonl" "$PY" "$HERE/busy_rank0.py" "$TMP/out" 3 3.5 > "$LOG" 2>&1 &
pid=$!
late='gpurun: gpu 0 (rank 0, pid [0-9]*) has not reached boundary round [0-9]* of generation [0-9]* after [0-9.]* s (\[boundary\] deadline_s = 1; 1 of 2 ranks reported'
wait_running 60 "a console line naming the late rank 0" grep -q "$late" "$LOG"
"$GPURUN" status > "$TMP/status.txt" 2>&1 || fail "gpurun status failed: $(cat "$TMP/status.txt")"
grep -q 'late at boundary round [0-9]* of generation [0-9]*: gpu 0 (rank 0, pid [0-9]*) for [0-9.]* s' \
  "$TMP/status.txt" || fail "gpurun status does not name the late rank: $(cat "$TMP/status.txt")"
wait "$pid" || fail "gpurun exited $?"
grep -q "it is running the program's own code (not stopped); waiting for it, as DDP would" "$LOG" ||
  fail "the late line does not say that it waits"
grep -qi 'killing\|stalled' "$LOG" && fail "a rank was killed or declared stalled"
grep -q '"to": "FAILED"' "$TMP/events.jsonl" && fail "a worker FAILED (events.jsonl)"
tail -1 "$LOG" | grep -q 'note:' && fail "the final line has a deadline note: $(tail -1 "$LOG")"
"$PY" - "$TMP/out" <<'PY' || fail "the checks above"
import glob, json, sys
lines = [json.loads(l) for f in glob.glob(sys.argv[1] + "/log.*") for l in open(f)]
for e in range(3):
    ls = [l for l in lines if l["epoch"] == e]
    assert sorted(l["rank"] for l in ls) == [0, 1] and {l["world"] for l in ls} == {2}, (e, ls)
    assert sorted(i for l in ls for i in l["seen"]) == list(range(64)), f"epoch {e}"
assert {l["generation"] for l in lines} == {lines[0]["generation"]}, "a resize happened"
print("3 epochs, each trained by both ranks, each sample once, one generation")
PY
echo "$TEST: late lines: $(grep -c "$late" "$LOG")"
echo "$TEST: OK"
