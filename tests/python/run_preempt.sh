#!/usr/bin/env bash
# ctest python_preempt: a Python job under gpurun --config is preempted and profiled through
# gpurun's worker engine, as a C++ one is (docs/cli.md#preemption). 2 CPU slots train
# (tests/python/elastic_train.py); SIGUSR2 to gpurun (the preemption warning) makes
# checkpoint_requested true on every rank at the same boundary, for that one epoch; SIGTERM
# (to gpurun and, as slurmstepd does, to every worker) then makes every rank leave its loop at
# the next boundary with stop_requested true (they
# write a "stop" line with rt.stop_reason "stop" and gpurun's detail, SIGTERM; the processes
# exit 0) and gpurun exits 143. The step-progress file the
# power-limit profiler reads advanced (the package publishes its steps through the library).
# Usage: run_preempt.sh GPURUN
TEST=python_preempt
source "$(dirname "$0")/common.sh"
mkdir -p "$TMP/out"
printf 'active_gpus = [0, 1]\n' > "$TMP/config.toml"
# As under Slurm (SLURM_JOB_ID set): the stop's SIGTERM below also reaches every worker
# directly, as slurmstepd sends it to every process of the step; the workers must still stop
# at gpurun's boundary, not die of it (the package installs the library's SIGTERM handler).
SLURM_JOB_ID=4242 "$GPURUN" --master-port 0 --nproc 2 --device cpu --config "$TMP/config.toml" \
  --event-log "$TMP/events.jsonl" --log-dir "$TMP/run" --run-id pypreempt \
  "$PY" "$HERE/elastic_train.py" "$TMP/out" 400 0.5 > "$LOG" 2>&1 &
pid=$!
wait_event '"event": "decision", "generation": 0, "prev_generation": 0, "round": 1,'
[[ $pid -gt 1 ]] && kill -USR2 "$pid"
checkpoint_seen() { grep -qs '"checkpoint": true' "$TMP"/out/log.*; }
wait_for 90 "a rank to see checkpoint_requested ($TMP/out/log.*)" checkpoint_seen
# The progress file (docs/energy.md#progress-file: 64 bytes a slot, u64 steps first): both
# slots publish their optimizer steps, and they advance.
progress=$(find "$TMP/run" -maxdepth 2 -name progress | head -1)
[[ -n $progress ]] || fail "no progress file under the run dir"
steps() { echo $(od -An -t u8 -N 8 "$progress") $(od -An -t u8 -j 64 -N 8 "$progress"); }  # u64 LE
read -r a0 a1 < <(steps)
(( a0 > 0 && a1 > 0 )) || fail "no progress published: $a0 $a1"
advanced() { read -r b0 b1 < <(steps); (( b0 > a0 && b1 > a1 )); }
wait_for 2 "both slots' progress to advance past $a0 $a1" advanced
echo "$TEST: progress steps $a0 $a1 -> $b0 $b1"
workers=$("$PY" -c 'import json,sys; print(" ".join(sorted({str(json.loads(l)["pid"]) for l in open(sys.argv[1]) if "\"worker_started\"" in l})))' "$TMP/events.jsonl")
[[ -n $workers ]] || fail "no worker_started events"
for w in $workers; do [[ $w -gt 1 ]] && kill -TERM "$w"; done  # slurmstepd's, not gpurun's
[[ $pid -gt 1 ]] && kill -TERM "$pid"
set +e
wait "$pid"
code=$?
set -e
[[ $code -eq 143 ]] || fail "gpurun exited $code, not 143 (stopped)"
"$PY" - "$TMP/out" <<'PY' || fail "the checks above"
import glob, json, sys
lines = [json.loads(l) for f in glob.glob(sys.argv[1] + "/log.*") for l in open(f)]
epochs = [l for l in lines if "seen" in l]
marked = sorted({l["epoch"] for l in epochs if l["checkpoint"]})
assert len(marked) == 1, f"checkpoint_requested in epochs {marked}: expected exactly one"
assert sorted(l["rank"] for l in epochs if l["epoch"] == marked[0] and l["checkpoint"]) == [0, 1], \
    "not every rank saw the checkpoint request at the same boundary"
stops = [l for l in lines if l.get("stop")]
assert len(stops) == 2 and len({s["epoch"] for s in stops}) == 1, f"stops: {stops}"
# rt.stop_reason: "stop", with gpurun's detail (its SIGTERM), the same on both ranks.
for s in stops:
    assert (s["reason"], s["signal"], s["cause"]) == ("stop", "SIGTERM", "signal"), s
    assert s["text"].startswith("gpurun received SIGTERM"), s
print(f"checkpoint at the boundary before epoch {marked[0]} on both ranks; "
      f"both stopped at epoch {stops[0]['epoch']}")
PY
echo "$TEST: OK"
