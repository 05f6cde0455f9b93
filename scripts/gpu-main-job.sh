#!/usr/bin/env bash
# The main job on one GPU: fmnist_train (ViT preset) under gpurun --device cuda with a pause
# to [] after the first epoch and a resume to [0] a few seconds later (release mode).
# Usage (GPU machine, after a CUDA build): scripts/gpu-main-job.sh BUILD_DIR OUT_DIR [fmnist_train args]
# Prints nvidia-smi readings while training and while paused, and the per-epoch metrics.
set -uo pipefail
B=${1:?build dir}; OUT=${2:?out dir}; shift 2; mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
source "$(dirname "$0")/lib-events.sh"
cfg "[0]" release "$OUT/config.toml"
GPURUN_TRACE_DIR=$OUT/trace "$B/launcher/gpurun" --device cuda --nproc 1 --config "$OUT/config.toml" \
  --event-log "$OUT/events.jsonl" --master-port 0 "$B/examples/fashion_mnist/fmnist_train" \
  --metrics "$OUT/metrics.jsonl" "$@" > "$OUT/gpurun.log" 2>&1 &
gp=$!
wait_count "$OUT/events.jsonl" start 1 120 || { kill $gp; exit 1; }
sleep 20; echo "training: $(smi)" >> "$OUT/smi.txt"   # inside epoch 1 (ViT-B: ~30 s on an H200)
cfg "[]" release "$OUT/config.toml"        # pause at the end of epoch 1
wait_count "$OUT/events.jsonl" resize 1 900 || { kill $gp; exit 1; }
sleep 3; echo "paused: $(smi)" >> "$OUT/smi.txt"
cfg "[0]" release "$OUT/config.toml"
wait_count "$OUT/events.jsonl" resize 2 120 || { kill $gp; exit 1; }
sleep 20; echo "resumed: $(smi)" >> "$OUT/smi.txt"
wait $gp; echo "rc=$?" >> "$OUT/smi.txt"
cat "$OUT/smi.txt"; grep -E "fmnist_train|epoch|generation" "$OUT/gpurun.log" | tail -12; cat "$OUT/metrics.jsonl"
python3 - "$OUT" <<'PY'
import json, sys, glob
tr = [json.loads(l) for f in glob.glob(sys.argv[1] + "/trace/*.jsonl") for l in open(f)]
for t in tr:
    if t["event"] == "generation":
        print("generation", t["generation"], t["role"], "world", t["world"], "bytes", t["bytes"], "checksum", t["checksum"], "ms", t["ms"])
PY
