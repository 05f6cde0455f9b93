#!/usr/bin/env bash
# ctest python_energy: energy from the program's side (docs/python.md#energy) under
# gpurun --simulate-gpus 2 --device cpu --nproc 2 --config: tests/python/energy_train.py
# prints, from rt.energy(), each finished epoch's joules, and each epoch an energy window's.
# Asserts: every epoch's joules (in total and per GPU) equal the event log's energy_epoch
# record to the digit, on both ranks; each window's joules equal its energy_window event and
# are its seconds × the simulated GPUs' draw (600 W each); the cost threshold stops the job
# early (gpurun exits 3) and rt.stop_reason is "early_stop" with the predicted cost over the
# threshold and gpurun's sentence, the same on both ranks. Without a monitor (--device cpu
# alone) rt.energy() is None and rt.energy_unavailable gives gpurun's reason.
# Usage: run_energy.sh GPURUN
TEST=python_energy
source "$(dirname "$0")/common.sh"
mkdir -p "$TMP/out"
export PYTHONPATH=$HERE/../../worker_runtime/python
# Two simulated 700 W GPUs drawing 600 W: an epoch of ~0.6 s costs ~0.6 × (0.5 × 1200 + 0.5 ×
# 1400) ≈ 800 J (Zeus, η = 0.5) beside a start-up of a few seconds; 9000 J stops it after a few
# epochs of the 40.
printf '[energy]\ncost_threshold = 9000\n' > "$TMP/config.toml"
set +e
"$GPURUN" --simulate-gpus 2 --device cpu --nproc 2 --master-port 0 --config "$TMP/config.toml" \
  --event-log "$TMP/events.jsonl" "$PY" "$HERE/energy_train.py" "$TMP/out" 40 0.6 > "$LOG" 2>&1
rc=$?
set -e
[[ $rc == 3 ]] || fail "gpurun exited $rc, not 3 (an early stop)"
"$PY" - "$TMP/out" "$TMP/events.jsonl" <<'PY' || fail "the checks above"
import glob, json, sys
recs = [json.loads(l) for f in sorted(glob.glob(sys.argv[1] + "/*.jsonl")) for l in open(f)]
events = [json.loads(l) for l in open(sys.argv[2])]
epochs = {e["epoch"]: e for e in events if e["event"] == "energy_epoch"}
stops = [e for e in events if e["event"] == "early_stop"]
assert len(stops) == 1, f"{len(stops)} early_stop events"
seen = [r for r in recs if r["kind"] == "epoch"]
assert len(seen) >= 2 * 2, f"only {len(seen)} epoch records: {seen}"
for r in seen:
    ev = epochs[r["epoch"]]
    assert r["energy_j"] == ev["energy_j"], (r, ev)
    assert r["gpu_energy_j"] == ev["gpu_energy_j"], (r, ev)
    assert r["now_epoch"] == r["epoch"] + 1, r
for slot in (0, 1):
    mine = [r["epoch"] for r in seen if r["slot"] == slot]
    assert mine == list(range(len(mine))), f"slot {slot} printed epochs {mine}"
windows = [e for e in events if e["event"] == "energy_window"]
wins = [r for r in recs if r["kind"] == "window"]
assert len(wins) == len(windows) and len(wins) >= 4, (len(wins), len(windows))
for w in wins:
    ev = [e for e in windows if e["slot"] == w["slot"] and abs(e["seconds"] - w["time"]) < 1e-9]
    assert len(ev) == 1, (w, windows)
    assert {int(k): v for k, v in w["gpu_energy"].items()} == {g["slot"]: g["energy_j"] for g in ev[0]["gpus"]}
    assert abs(w["total_energy"] - ev[0]["energy_j"]) < 1e-6, (w, ev)
    assert 0.25 < w["time"] < 2, w
    for j in w["gpu_energy"].values():  # 600 W on each simulated GPU
        assert abs(j - 600 * w["time"]) < 600 * 0.25, w
stop = [r for r in recs if r["kind"] == "stop"]
assert len(stop) == 2, stop
for s in stop:
    assert s["reason"] == "early_stop" and s["is_str"], s
    assert s["predicted_cost_j"] > s["threshold_j"] == 9000, s
    assert "would pass the threshold" in s["text"], s
assert stop[0]["text"] == stop[1]["text"] == stops[0]["reason"], (stop, stops)
assert stop[0]["predicted_cost_j"] == stop[1]["predicted_cost_j"], stop
print(f"{len(seen)} epoch records equal energy_epoch, {len(wins)} windows equal energy_window, "
      f"early stop on both ranks: {stop[0]['text'][:80]}...")
PY

# No monitor (--device cpu, no --simulate-gpus): rt.energy() is None and says why.
"$GPURUN" --device cpu --nproc 1 --master-port 0 --config "$TMP/config.toml" "$PY" -c '
import json, gpurun
rt = gpurun.Runtime()
print(json.dumps({"none": rt.energy() is None, "why": rt.energy_unavailable}))' > "$LOG" 2>&1 ||
  fail "the run without a monitor failed"
grep -q '{"none": true, "why": "gpurun.s GPU energy monitor is off for this job' "$LOG" ||
  fail "rt.energy() without a monitor did not return None with gpurun's reason"
echo "python_energy: OK"
