#!/usr/bin/env bash
# Issue-16 evidence on one GPU: bench/resize_latency.sh for ViT-H and ViT-B (the slow way
# "before", then release and hold mode, in the same run) and bench/park_floor.py (an idle
# torch CUDA context vs a trained-then-freed one). Reads the GPU only, never sets anything.
#   scripts/gpu-resize-bench.sh BUILD_DIR OUT_DIR [models, default "h b"]
set -uo pipefail
B=${1:?build dir}; OUT=${2:?out dir}; MODELS=${3:-h b}; mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
here=$(cd "$(dirname "$0")/.." && pwd)
python3 "$here/bench/park_floor.py" > "$OUT/park_floor.json" 2> "$OUT/park_floor.err"
for m in $MODELS; do
  case $m in
    h) args=(--bf16 --micro 64 --limit-train 6400) ;;
    b) args=(--bf16 --micro 128 --limit-train 12800) ;;
    *) args=() ;;
  esac
  "$here/bench/resize_latency.sh" "$B" "$OUT/$m" cuda "$m" "${args[@]}" > "$OUT/$m.log" 2>&1
  echo "== ViT-$m: rc=$?"; sed -n '/^resize latency/,$p' "$OUT/$m.log"
done
echo "park floor: $(cat "$OUT/park_floor.json")"
