#!/usr/bin/env bash
# The step iterator's boundary cost (docs/python.md#the-step-iterator): bench/step_boundary.py
# (a GPT-shaped model, nanoGPT's Shakespeare-char preset with 4 micro-steps) under
# gpurun --config on one slot, a boundary every EVERY (25) iterations against none (every >
# iterations), run A B A B (REPS pairs, default 2) in the same session; the cost is the ratio
# of the mean iteration times minus 1 (target: at most 1 %), and the iterations that included
# a boundary against the median. Prints a markdown table last (also OUT/table.md).
#
#   bench/python_steps_gpu.sh BUILD_DIR OUT_DIR [DEVICE]      DEVICE: cuda (default) or cpu
# Environment: ITERS (default 300), EVERY (25), REPS (2), PY (a python3 with torch), and the
# model's LAYERS, EMBD, HEADS, BLOCK, MICRO, ACCUM (bench/step_boundary.py).
set -uo pipefail
B=${1:?build dir}; OUT=${2:?out dir}; DEV=${3:-cuda}
G=$(cd "$B" && pwd)/launcher/gpurun
[[ -x $G ]] || { echo "python_steps_gpu.sh: no gpurun at $B/launcher/gpurun" >&2; exit 2; }
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
cd "$(dirname "$0")/.." || exit 2
export NCCL_NVLS_ENABLE=0
PY=${PY:-python3}; ITERS=${ITERS:-300}; EVERY=${EVERY:-25}; REPS=${REPS:-2}
printf 'active_gpus = [0]\n' > "$OUT/config.toml"
for ((r = 0; r < REPS; r++)); do
  for every in "$EVERY" $((ITERS + 1)); do
    tag=$([[ $every == "$EVERY" ]] && echo every || echo none)
    "$G" --nproc 1 --device "$DEV" --master-port 0 --config "$OUT/config.toml" \
      "$PY" bench/step_boundary.py "$OUT/$tag.$r.json" "$every" "$ITERS" > "$OUT/$tag.$r.log" 2>&1 ||
      { echo "python_steps_gpu.sh: run $tag.$r failed:"; tail -20 "$OUT/$tag.$r.log"; exit 1; }
  done
done
"$PY" - "$OUT" "$REPS" "$EVERY" <<'PY' | tee "$OUT/table.md"
import json, statistics, sys
out, reps, every = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
runs = {t: [json.load(open(f"{out}/{t}.{r}.json")) for r in range(reps)] for t in ("every", "none")}
a = runs["every"][0]
print(f"{a['gpu']}, model {a['model']}, {a['iters']} iterations (first 20 left out)\n")
print(f"| pair | every {every}: ms/iteration | no boundary: ms/iteration | A/B cost | boundary iterations / the others (ms) | per boundary: ms, share of {every} iterations |")
print("|---|---|---|---|---|---|")
costs, within = [], []
for r in range(reps):
    e, n = runs["every"][r], runs["none"][r]
    cost = e["mean_s"] / n["mean_s"] - 1
    costs.append(cost)
    # within the run (no run-to-run noise): iterations that included a boundary against the
    # others; the excess is what one boundary costs, spread over `every` iterations
    k = e["boundary_iterations"]
    rest = (e["mean_s"] * len(e["times_s"]) - e["boundary_iteration_mean_s"] * k) / (len(e["times_s"]) - k)
    excess = e["boundary_iteration_mean_s"] - rest
    share = excess / (every * rest)
    within.append(share)
    print(f"| {r} | {e['mean_s']*1e3:.2f} | {n['mean_s']*1e3:.2f} | {cost*100:+.2f} % | "
          f"{e['boundary_iteration_mean_s']*1e3:.2f} / {rest*1e3:.2f} | {excess*1e3:+.2f}, {share*100:+.3f} % |")
print(f"\nmedian over the pairs: A/B {statistics.median(costs)*100:+.2f} %, within the run "
      f"{statistics.median(within)*100:+.3f} % (target <= 1 %)")
PY
