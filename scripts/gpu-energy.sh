#!/usr/bin/env bash
# The energy monitor on one GPU — read-only: no [energy] power_limit_watts, so gpurun only
# reads NVML (counters, power, limits); nothing on the GPU is changed.
#   1. the monitor's cost on step time: vit_step_bench (runtime mode, ViT-B, bf16) under
#      gpurun --config with [energy] monitor = false / true, alternated, 3 rounds each;
#   2. the main job (fmnist_train ViT-B, 2 epochs) with the monitor on: per-epoch energy from
#      the NVML counter (gpurun's `energy` events) against (a) the monitor's own integrated
#      power samples and (b) an independent 20 ms power sampler (nvidia-ml-py) run beside it.
# Usage (GPU machine, repo root): scripts/gpu-energy.sh OUT_DIR [DATA_DIR]
# Prints a short table last; logs, events and summaries under OUT_DIR.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?out dir}; DATA=${2:-/usr/share/datasets/fashion-mnist}; mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
B=${GPURUN_BUILD:-build-gpu}
if [[ ! -x $B/launcher/gpurun || ! -x $B/bench/vit_step_bench ]]; then
  TORCH_PREFIX=$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)')
  t0=$(date +%s)
  cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_PREFIX_PATH="$TORCH_PREFIX" \
    -DGPURUN_WITH_CUDA=ON -DGPURUN_BUILD_TESTS=OFF > "$OUT/cmake.log" 2>&1 &&
    cmake --build "$B" -j16 --target gpurun fmnist_train vit_step_bench > "$OUT/build.log" 2>&1 ||
    { tail -30 "$OUT/build.log"; exit 1; }
  echo "build: $(( $(date +%s) - t0 )) s"
fi
G=$B/launcher/gpurun

# 1. Monitor on/off, alternated (A B A B A B) so drift hits both alike.
for round in 1 2 3; do
  for mon in false true; do
    printf '[energy]\nmonitor = %s\n' "$mon" > "$OUT/mon_$mon.toml"
    "$G" --device cuda --nproc 1 --config "$OUT/mon_$mon.toml" --master-port 0 \
      --event-log "$OUT/vit_${mon}_$round.events.jsonl" \
      "$B/bench/vit_step_bench" --mode runtime --model b --micro 128 --warmup 10 --steps 120 \
      --json "$OUT/vit_${mon}_$round.json" > "$OUT/vit_${mon}_$round.log" 2>&1 ||
      echo "vit_step_bench monitor=$mon round $round failed: $(tail -3 "$OUT/vit_${mon}_$round.log")"
  done
done

# 2. The main job with the monitor, and an independent power sampler beside it.
python3 - "$OUT/power_20ms.csv" <<'PY' &
import sys, time, signal
import pynvml
pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(0)
stop = False
def on_term(*_):
    global stop; stop = True
signal.signal(signal.SIGTERM, on_term)
with open(sys.argv[1], "w") as f:
    while not stop:
        f.write(f"{time.time():.6f},{pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0:.3f}\n")
        time.sleep(0.02)
PY
sampler=$!
printf '[energy]\neta_knob = 0.5\n' > "$OUT/main.toml"
"$G" --device cuda --nproc 1 --config "$OUT/main.toml" --master-port 0 \
  --event-log "$OUT/main.events.jsonl" --energy-summary "$OUT/main.summary.json" \
  "$B/examples/fashion_mnist/fmnist_train" --model b --epochs 2 --micro 256 --lr 3e-4 \
  --warmup-steps 200 --bf16 --data "$DATA" > "$OUT/main.log" 2>&1
echo "main job rc=$?"
kill -TERM "$sampler" 2>/dev/null; wait "$sampler" 2>/dev/null

python3 - "$OUT" <<'PY'
import json, sys, glob, statistics
out = sys.argv[1]
def ips(mon):
    v = []
    for f in sorted(glob.glob(f"{out}/vit_{mon}_*.json")):
        v.append(json.load(open(f))["images_per_s"])
    return v
off, on = ips("false"), ips("true")
print("| measurement | value |")
print("|---|---|")
if off and on:
    print(f"| ViT-B images/s, monitor off (3 runs) | {', '.join(f'{x:.1f}' for x in off)} |")
    print(f"| ViT-B images/s, monitor on (3 runs) | {', '.join(f'{x:.1f}' for x in on)} |")
    r = statistics.mean(on) / statistics.mean(off)
    print(f"| monitor on / off | {r:.4f} (step-time cost {100 * (1 / r - 1):+.2f} %; goal <= 0.5 %) |")
samples = []
for line in open(f"{out}/power_20ms.csv"):
    t, w = line.split(",")
    samples.append((float(t), float(w)))
def integral(t0, t1):
    e = 0.0
    for (ta, wa), (tb, wb) in zip(samples, samples[1:]):
        a, b = max(ta, t0), min(tb, t1)
        if b > a:
            e += (wa + wb) / 2 * (b - a)
    return e
ev = [json.loads(l) for l in open(f"{out}/main.events.jsonl")]
for e in ev:
    if e["event"] == "energy" and e["seconds"] > 1:
        g = e["gpus"][0] if e["gpus"] else None
        if not g:
            continue
        ind = integral(e["t0"], e["t1"])
        print(f"| {e['kind']} window epoch {e['epoch']}: {e['seconds']:.1f} s | counter {g['energy_j']:.0f} J, "
              f"monitor's power samples {g['power_integral_j']:.0f} J ({100 * (g['power_integral_j'] / g['energy_j'] - 1):+.2f} %), "
              f"20 ms sampler {ind:.0f} J ({100 * (ind / g['energy_j'] - 1):+.2f} %), avg {g['avg_power_w']:.0f} W, cost {e['cost']:.0f} J |")
for e in ev:
    if e["event"] == "energy_epoch":
        print(f"| energy_epoch {e['epoch']} | {e['seconds']:.1f} s, {e['energy_j']:.0f} J, cost {e['cost']:.0f} J, total {e['cost_total']:.0f} J |")
s = json.load(open(f"{out}/main.summary.json"))["summary"]
print(f"| run summary | {s['seconds']:.1f} s, {s['energy_j']:.0f} J, cost {s['cost']:.0f} J, exit {s['exit_code']} |")
mon = [e for e in ev if e["event"] == "energy_monitor"]
if mon:
    g = mon[0]["gpus"][0]
    print(f"| GPU | {g['name']} {g['uuid']}, limits {g['min_limit_w']}-{g['max_limit_w']} W, current {g['power_limit_w']} W (read only) |")
PY
