#!/usr/bin/env bash
# The main job: a Vision Transformer learns Fashion-MNIST under gpurun with 2 CPU workers,
# and the demo resizes it live by rewriting a copy of config.toml: after the first epoch the
# job shrinks to one worker, after the second it grows back to two. Run after scripts/setup.sh.
#
#   scripts/demo.sh [fmnist_train options]     e.g. --model cnn --epochs 6
#
# Environment: GPURUN_BUILD_DIR (default build), DEMO_MIN_ACCURACY (e.g. 0.80: exit 1 when
# the final test accuracy is lower, or when the two resizes did not happen; used by CI),
# DEMO_KEEP=1 keeps the work directory (config, event log, metrics).
# DEMO_ENERGY=PNG: the same run with the energy monitor on two simulated GPUs (--simulate-gpus,
# 300 W and 250 W: docs/energy.md#simulated-gpus), then `gpurun report` draws PNG.
# DEMO_SCALE=PNG: as DEMO_ENERGY, with `[energy] scale = "auto"` instead of the two scripted
# resizes: gpurun measures 2 and 1 workers and keeps the count of least cost per epoch
# (docs/energy.md#gpu-count-scale); the event log and PNG say what it chose and why.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${GPURUN_BUILD_DIR:-build}
for f in "$B/launcher/gpurun" "$B/examples/fashion_mnist/fmnist_train"; do
  [[ -x $f ]] || { echo "demo: $f is missing: run scripts/setup.sh first" >&2; exit 2; }
done
work=$(mktemp -d "${TMPDIR:-/tmp}/gpurun-demo-XXXXXX")
[[ ${DEMO_KEEP:-0} == 1 ]] || trap 'rm -rf "$work"' EXIT
cfg=$work/config.toml
set_active() {  # the repo's commented config.toml with active_gpus set (first line)
  { echo "active_gpus = $1"; grep -v '^active_gpus' config.toml; } > "$cfg.tmp" && mv "$cfg.tmp" "$cfg"
}
resizes() { grep -c '"event": "decision".*"kind": "resize"' "$work/events.jsonl" 2>/dev/null || true; }
wait_resizes() {  # N: wait until N resize decisions are in the event log (or gpurun ended)
  while (( $(resizes) < $1 )); do kill -0 "$pid" 2>/dev/null || return 1; sleep 0.2; done
}

energy_args=()
[[ -n ${DEMO_SCALE:-} ]] && DEMO_ENERGY=$DEMO_SCALE
if [[ -n ${DEMO_ENERGY:-} ]]; then
  # Two simulated GPUs (docs/energy.md#simulated-gpus) drawing 300 and 250 W uncapped.
  printf '%s\n' \
    'gpu 0 uuid=GPU-a0000000-1111-2222-3333-000000000000 name="Simulated H200" min_w=200 max_w=700 default_w=700 limit_w=700 full_w=300' \
    'gpu 1 uuid=GPU-a1010101-1111-2222-3333-000000000001 name="Simulated H200" min_w=200 max_w=700 default_w=700 limit_w=700 full_w=250' \
    > "$work/nvml.txt"
  energy_args=(--simulate-gpus "$work/nvml.txt" --energy-summary "$work/energy.json")
fi

set_active "[0, 1]"
epochs=3
if [[ -n ${DEMO_SCALE:-} ]]; then
  printf '[energy]\nscale = "auto"\n' >> "$cfg"  # config.toml's own [energy] is all comments
  epochs=6
fi
echo "demo: gpurun --nproc 2 --device cpu --config $cfg fmnist_train --model tiny --epochs $epochs $*"
"$B/launcher/gpurun" --nproc 2 --device cpu --config "$cfg" --event-log "$work/events.jsonl" \
  --master-port 0 --run-id "demo-$$" "${energy_args[@]}" "$B/examples/fashion_mnist/fmnist_train" --model tiny --epochs "$epochs" \
  --metrics "$work/metrics.jsonl" "$@" &
pid=$!
# Written while epoch 1 runs: applies at its end (the first boundary).
sleep 2
if [[ -n ${DEMO_SCALE:-} ]]; then
  : # gpurun resizes the job itself
elif kill -0 "$pid" 2>/dev/null; then
  set_active "[0]"; echo "demo: config.toml now says active_gpus = [0] (shrink after this epoch)"
fi
if [[ -z ${DEMO_SCALE:-} ]] && wait_resizes 1; then
  set_active "[0, 1]"; echo "demo: config.toml now says active_gpus = [0, 1] (grow after this epoch)"
  wait_resizes 2 || true
fi
rc=0; wait "$pid" || rc=$?
n=$(resizes)
acc=$( (tail -n 1 "$work/metrics.jsonl" 2>/dev/null || true) | sed -n 's/.*"val_acc":\([0-9.]*\).*/\1/p')
echo "demo: gpurun exit status $rc, $n live resizes, final test accuracy ${acc:-?}"
echo "demo: per epoch (gpus, test accuracy):"
awk -F'[:,]' '{ match($0, /"gpus":\[[0-9,]*\]/); g = substr($0, RSTART + 7, RLENGTH - 7);
  match($0, /"val_acc":[0-9.]*/); a = substr($0, RSTART + 10, RLENGTH - 10);
  printf "  epoch %d  gpus %s  test acc %s\n", $2 + 1, g, a }' "$work/metrics.jsonl" 2>/dev/null || true
if [[ -n ${DEMO_SCALE:-} ]]; then
  echo "demo: scale_choice: $(grep '"event": "scale_choice"' "$work/events.jsonl" | sed -n 's/.*"reason": "\([^"]*\)".*/\1/p')"
  "$B/launcher/gpurun" report "$work/events.jsonl" -o "$DEMO_ENERGY" \
    --title "main job, scale = auto, on two simulated GPUs (--simulate-gpus)"
elif [[ -n ${DEMO_ENERGY:-} ]]; then
  "$B/launcher/gpurun" report "$work/events.jsonl" -o "$DEMO_ENERGY" --title "main job on two simulated GPUs (--simulate-gpus)"
fi
if [[ -n ${DEMO_MIN_ACCURACY:-} ]]; then
  ok=$(awk -v a="${acc:-0}" -v m="$DEMO_MIN_ACCURACY" 'BEGIN{print (a >= m) ? 1 : 0}')
  (( rc == 0 && n >= 2 && ok == 1 )) || { echo "demo: FAILED (want exit 0, 2 resizes, accuracy >= $DEMO_MIN_ACCURACY)"; exit 1; }
fi
exit "$rc"
