#!/usr/bin/env bash
# The energy monitor on one GPU — read-only: no [energy] power_limit_watts, so gpurun only
# reads NVML (counters, power, limits); nothing on the GPU is changed.
#   1. the monitor's cost on step time: vit_step_bench (runtime mode, ViT-B, bf16) under
#      gpurun --config with [energy] monitor = false / true, alternated, 3 rounds each;
#   0. launch -> first all-reduce (bench/first_allreduce, elastic) with --energy off / on,
#      alternated, 5 each: NVML + CUDA discovery runs beside the workers' start;
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
if [[ ! -x $B/launcher/gpurun || ! -x $B/bench/vit_step_bench || ! -x $B/bench/first_allreduce ]]; then
  TORCH_PREFIX=$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)')
  t0=$(date +%s)
  cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_PREFIX_PATH="$TORCH_PREFIX" \
    -DGPURUN_WITH_CUDA=ON -DGPURUN_BUILD_TESTS=OFF > "$OUT/cmake.log" 2>&1 &&
    cmake --build "$B" -j16 --target gpurun fmnist_train vit_step_bench first_allreduce > "$OUT/build.log" 2>&1 ||
    { tail -30 "$OUT/build.log"; exit 1; }
  echo "build: $(( $(date +%s) - t0 )) s"
fi
G=$B/launcher/gpurun

# 0. Launch cost of the monitor: wall time of the whole command, energy off / on alternated.
printf '' > "$OUT/launch.toml"
for rep in 1 2 3 4 5; do
  for e in off on; do
    t0=$(date +%s.%N)
    "$G" --device cuda --nproc 1 --config "$OUT/launch.toml" --master-port 0 --energy "$e" \
      "$B/bench/first_allreduce" > "$OUT/launch_${e}_$rep.log" 2>&1
    echo "$e $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { print b - a }')" >> "$OUT/launch.txt"
  done
done
# Live status columns and the slot -> GPU mapping by UUID on the real driver.
uuid=$(nvidia-smi --query-gpu=uuid --format=csv,noheader -i 0 | tr -d ' ')
printf '[energy]\n' > "$OUT/status.toml"
CUDA_VISIBLE_DEVICES=$uuid XDG_RUNTIME_DIR=$OUT/xdg "$G" --device cuda --nproc 1 \
  --config "$OUT/status.toml" --master-port 0 --event-log "$OUT/status.events.jsonl" \
  "$B/bench/vit_step_bench" --mode runtime --model b --micro 128 --warmup 10 --steps 150 \
  > "$OUT/status_run.log" 2>&1 &
sp=$!
sleep 12
XDG_RUNTIME_DIR=$OUT/xdg "$G" status > "$OUT/status.txt" 2>&1
wait $sp
echo "cvd uuid $uuid -> monitored $(grep -o '"uuid":"[^"]*"' "$OUT/status.events.jsonl" | head -1)" >> "$OUT/status.txt"

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
launch = {"off": [], "on": []}
for line in open(f"{out}/launch.txt"):
    k, v = line.split()
    launch[k].append(float(v))
off, on = ips("false"), ips("true")
print("| measurement | value |")
print("|---|---|")
if launch["off"] and launch["on"]:
    mo, mn = statistics.median(launch["off"]), statistics.median(launch["on"])
    print(f"| launch -> first all-reduce, energy off (median of {len(launch['off'])}) | {mo:.3f} s ({', '.join(f'{x:.2f}' for x in launch['off'])}) |")
    print(f"| launch -> first all-reduce, energy on (median of {len(launch['on'])}) | {mn:.3f} s ({', '.join(f'{x:.2f}' for x in launch['on'])}); on/off {mn / mo:.3f} |")
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
cat "$OUT/status.txt"
