#!/usr/bin/env bash
# Installs every Debian 12 package gpurun needs and builds it into build/.
# Usage: scripts/setup.sh            (as root, or with sudo available)
#        GPURUN_SKIP_APT=1 scripts/setup.sh   (packages already installed)
#        GPURUN_BUILD_BENCH=OFF scripts/setup.sh   (without bench/'s programs: no test uses them)
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(
  build-essential cmake ninja-build pkg-config python3
  libboost1.81-dev      # Asio, Process v2 (header-only)
  libfmt-dev doctest-dev libtomlplusplus-dev
  libtorch-dev          # LibTorch 1.13 (CPU): worker runtime, examples
  libgloo-dev           # Gloo: CPU collectives of the worker runtime
  libopenblas0-pthread  # an optimised BLAS for LibTorch (Debian links the reference one)
  zlib1g-dev            # reads the gzip-compressed IDX files directly
  dataset-fashion-mnist # /usr/share/datasets/fashion-mnist: the main job's data
  procps psmisc         # ps/pkill used by the integration tests
  gnuplot-nox           # draws `gpurun report`'s PNG (docs/energy.md#plots)
  clang-format          # scripts/format.sh --check, run first by scripts/test.sh (.clang-format)
  clang libclang-rt-dev # scripts/test.sh's sanitizer build (clang++ and its ASan/UBSan runtimes)
  slurm-wlm munge       # a real one-machine Slurm for tests/slurm (slurmctld, slurmd, sbatch)
  python3-torch         # torch 1.13 for Python (same LibTorch): tests/python under gpurun
  python3-torchvision python3-tqdm  # examples/python/fmnist_vit.py (ViT, progress bar)
  python3-venv          # tests/python/run_wheel.sh: scripts/wheel.sh's wheel in a fresh venv (pip)
  prometheus            # tests/metrics: a real Prometheus scrapes a job's /metrics
)

if [[ "${GPURUN_SKIP_APT:-0}" != 1 ]]; then
  SUDO=""
  [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  missing=()
  for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if ((${#missing[@]})); then
    echo "setup: installing ${missing[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
  fi
fi

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DGPURUN_BUILD_BENCH="${GPURUN_BUILD_BENCH:-ON}"
cmake --build build -j"$(nproc)"
echo "setup: built build/launcher/gpurun"
