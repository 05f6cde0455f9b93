#!/usr/bin/env bash
# GPU machine: builds gpurun with CUDA, then the step iterator's boundary cost
# (bench/python_steps_gpu.sh) and the Python ViT-H pause + resume cycle against torchrun's
# kill-and-restart in the same run (bench/python_gpu.sh, release + standby). Logs under OUT.
#   scripts/gpu-python-steps.sh OUT [BUILD_DIR]
set -uo pipefail
OUT=${1:?out dir}; B=${2:-build-gpu}
cd "$(dirname "$0")/.." || exit 2
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
t0=$SECONDS
cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGPURUN_WITH_CUDA=ON -DGPURUN_BUILD_TESTS=OFF \
  -DCMAKE_PREFIX_PATH="$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)')" \
  > "$OUT/configure.log" 2>&1 || { tail -30 "$OUT/configure.log"; exit 1; }
cmake --build "$B" --target gpurun gpurun_worker -j16 > "$OUT/build.log" 2>&1 ||
  { tail -30 "$OUT/build.log"; exit 1; }
echo "build: $((SECONDS - t0)) s"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
ITERS=${ITERS:-300} REPS=${REPS:-2} bench/python_steps_gpu.sh "$B" "$OUT/steps" cuda > "$OUT/steps.log" 2>&1
tail -12 "$OUT/steps.log"
echo "steps: $((SECONDS - t0)) s"
[[ ${CYCLE:-1} == 1 ]] || exit 0
FLOOR=0 REPS=0 MODES=standby PAUSE_REPS=${PAUSE_REPS:-2} RESTART_REPS=${RESTART_REPS:-2} \
  ARGS_h="--batch 128 --limit-train 2560 --limit-val 256" \
  bench/python_gpu.sh "$B" "$OUT/py" cuda h > "$OUT/cycle.log" 2>&1
tail -25 "$OUT/cycle.log"
echo "all: $((SECONDS - t0)) s"
