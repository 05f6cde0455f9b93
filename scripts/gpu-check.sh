#!/usr/bin/env bash
# One call on the GPU machine (Ubuntu 24.04, torch 2.11, Boost 1.83 headers only):
# build gpurun, run the unit tests, record torch's TCPStore bytes, run real torch
# workers (gloo and nccl) under gpurun, and benchmark our store against torch's.
# Writes logs to $OUT (or ./gpu-out) and prints a short table last.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}; FINAL=$OUT; OUT=$FINAL/logs; mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
declare -A R

step() { local name=$1; shift; local t0=$EPOCHREALTIME; "$@" >"$OUT/$name.log" 2>&1; local rc=$?;
  R[$name]="rc=$rc $(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN{printf "%.1fs", b-a}')"
  echo "== $name: ${R[$name]}"; tail -n 25 "$OUT/$name.log"; return $rc; }

TORCH_PREFIX=$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)')
step build bash -c "cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_PREFIX_PATH=$TORCH_PREFIX -DGPURUN_WITH_CUDA=ON && cmake --build build-gpu -j16 -- -k 0"
step unit_tests ctest --test-dir build-gpu --output-on-failure -j8 --timeout 300
[[ ${GPU_RECORD:-0} == 1 ]] && step record timeout 150 python3 scripts/conformance/record_relay.py "$FINAL/tcpstore_torch211.txt"
G=build-gpu/launcher/gpurun
step gloo_x4 timeout 120 $G --nproc 4 --device cpu --master-port 0 python3 scripts/conformance/allreduce.py gloo
step nccl_x1 timeout 120 $G --nproc 1 --master-port 0 python3 scripts/conformance/allreduce.py nccl
step torchrun_env timeout 60 python3 -m torch.distributed.run --nproc-per-node 2 --master-port 29555 scripts/conformance/dump_env.py "$OUT/torchrun_env"
step gpurun_env timeout 60 $G --nproc 2 --device cpu --master-port 29556 python3 scripts/conformance/dump_env.py "$OUT/gpurun_env"
step env_diff python3 scripts/conformance/compare_env.py "$OUT/torchrun_env" "$OUT/gpurun_env"
# gpurun status against a live CUDA run: the memory column comes from nvidia-smi.
status_live() {
  $G --nproc 1 --master-port 0 --run-id gpucheck python3 -c "import torch,time; x=torch.ones(1<<28, device='cuda'); print('allocated', x.numel()*4>>20, 'MiB', flush=True); time.sleep(12)" &
  local pid=$!; sleep 8
  $G status --run-id gpucheck; $G status --run-id gpucheck --json; nvidia-smi --query-compute-apps=pid,used_memory --format=csv
  wait $pid
}
step status_live status_live
# The worker runtime on CUDA + NCCL: pause/resume in release and hold mode.
step elastic scripts/gpu-elastic.sh build-gpu "$OUT/elastic"
# The main job: ViT-B on Fashion-MNIST (224 px), paused to [] after epoch 1 and resumed.
step main_job timeout 900 scripts/gpu-main-job.sh build-gpu "$OUT/main" --model b --epochs 3 \
  --micro 256 --lr 3e-4 --warmup-steps 200
if [[ -x build-gpu/bench/store_bench ]]; then
  step bench_gpurun timeout 200 build-gpu/bench/store_bench --threads 16 --ops 20000 --rendezvous 2000,10000
  python3 bench/anchors/torch_store_server.py 29577 > "$OUT/torch_server.log" 2>&1 & TS=$!
  sleep 3
  step bench_torch timeout 200 build-gpu/bench/store_bench --host 127.0.0.1 --port 29577 --threads 16 --ops 20000 --rendezvous 2000,10000
  kill $TS
fi
echo; echo "| step | result |"; echo "|---|---|"
for k in build unit_tests record gloo_x4 nccl_x1 torchrun_env gpurun_env env_diff status_live elastic main_job bench_gpurun bench_torch; do echo "| $k | ${R[$k]:-skipped} |"; done
tar -C "$FINAL" -czf "$FINAL/logs.tar.gz" logs && rm -rf "$OUT"
