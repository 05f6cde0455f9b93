#!/usr/bin/env bash
# The worker runtime on one GPU (NCCL) under gpurun: pause to [] and resume to [0] in release
# and hold mode, with nvidia-smi readings while training and while paused, and the state
# checksum before the pause vs after the resume. Usage (GPU machine, after a CUDA build):
#   scripts/gpu-elastic.sh BUILD_DIR OUT_DIR
# Prints a table last; logs, traces and event logs under OUT_DIR.
set -uo pipefail
B=${1:?build dir}; OUT=${2:?out dir}; mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
G=$B/launcher/gpurun; T=$B/tests/worker_runtime/elastic_trainer
MODEL="--width 4096 --depth 8 --samples 4096 --micro 256 --epoch-ms 200"

source "$(dirname "$0")/lib-events.sh"

scenario() {  # MODE
  local mode=$1 d=$OUT/$1; rm -rf "$d"; mkdir -p "$d/out"
  cfg "[0]" "$mode" "$d/config.toml"
  GPURUN_TRACE_DIR=$d/trace $G --device cuda --nproc 1 --config "$d/config.toml" \
    --event-log "$d/events.jsonl" --master-port 0 "$T" "$d/out" $MODEL > "$d/gpurun.log" 2>&1 &
  local gp=$!
  wait_count "$d/events.jsonl" continue 3 180 || { kill $gp; return 1; }
  echo "training: $(smi)" > "$d/smi.txt"
  cfg "[]" "$mode" "$d/config.toml"
  local t0=$EPOCHREALTIME
  wait_count "$d/events.jsonl" resize 1 60 || { kill $gp; return 1; }
  sleep 3
  echo "paused: $(smi)" >> "$d/smi.txt"
  cfg "[0]" "$mode" "$d/config.toml"
  wait_count "$d/events.jsonl" resize 2 60 || { kill $gp; return 1; }
  local c0; c0=$(count "$d/events.jsonl" continue)
  wait_count "$d/events.jsonl" continue $((c0 + 3)) 120 || { kill $gp; return 1; }
  echo "resumed: $(smi)" >> "$d/smi.txt"
  local last; last=$(python3 -c "import json,sys;print(max(json.loads(l).get('epoch',0) for l in open('$d/events.jsonl') if '\"decision\"' in l))")
  echo $((last + 2)) > "$d/out/stop"
  wait $gp; echo "rc=$?" >> "$d/smi.txt"
  python3 - "$d" <<'PY'
import json, sys, glob
d = sys.argv[1]
tr = [json.loads(l) for f in glob.glob(d + "/trace/*.jsonl") for l in open(f)]
gens = [t for t in tr if t["event"] == "generation"]
pause = [t for t in tr if t["event"] == "snapshot_written"]  # the pause's first phase
resume = [t for t in gens if t["world"] > 0 and t["generation"] > 0]
parked = [t for t in tr if t["event"] == "parked"]
loss = [l.split() for f in glob.glob(d + "/out/loss.*") for l in open(f)]
loss.sort(key=lambda x: int(x[0]))
print("checksum before pause:", pause[0]["checksum"] if pause else None)
print("checksum after resume:", resume[0]["checksum"] if resume else None)
print("snapshot bytes:", pause[0].get("tensor_bytes") if pause else None, "pause ms:", pause[0]["ms"] if pause else None,
      "resume ms:", resume[0]["ms"] if resume else None)
print("parked events:", parked)
print("loss by epoch:", [(int(e), round(float(v), 4), int(w), int(g)) for e, v, w, g in loss])
PY
}
for m in release hold; do
  echo "== $m"; scenario $m > "$OUT/$m.log" 2>&1; echo "rc=$?"; cat "$OUT/$m/smi.txt" "$OUT/$m.log"
done
