#!/usr/bin/env bash
# Builds gpurun's platform wheel for Python users (docs/python.md#wheel):
# dist/gpurun-<version>-py3-none-linux_<machine>.whl with the launcher `gpurun` (no LibTorch),
# libgpurun_worker.so, libgpurun_simulated_nvml.so and the Python package
# (worker_runtime/python/gpurun). `pip install` of it puts `gpurun` on the environment's PATH;
# `import gpurun` finds the worker library in the package. No network, no setuptools: the wheel
# is written by scripts/wheel_pack.py with Python's standard library.
# Usage: scripts/wheel.sh [-o DIR] [--build-dir DIR] [--no-build]
#   -o DIR           where the wheel goes (default dist/)
#   --build-dir DIR  a build folder configured by scripts/setup.sh (default build/)
#   --no-build       pack what DIR holds (tests/python/run_wheel.sh: the binaries already built)
# Without --no-build it first builds the `gpurun` target there (which builds both libraries);
# a fresh machine runs scripts/setup.sh first.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=$ROOT/dist
BUILD=$ROOT/build
BUILD_FIRST=1
while (($#)); do
  case $1 in
    -o) OUT=$2; shift 2 ;;
    --build-dir) BUILD=$2; shift 2 ;;
    --no-build) BUILD_FIRST=0; shift ;;
    -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "wheel.sh: unknown argument '$1' (see scripts/wheel.sh --help)" >&2; exit 2 ;;
  esac
done
if ((BUILD_FIRST)); then
  [[ -f $BUILD/CMakeCache.txt ]] ||
    { echo "wheel.sh: $BUILD is not a configured build folder: run scripts/setup.sh first" >&2; exit 1; }
  cmake --build "$BUILD" --target gpurun -j"$(nproc)"
fi
# Debian's python3: the version of a pyenv/conda python3 earlier in PATH does not matter here
# (the wheel is py3-none), but its ctypes must load the worker library to check its ABI.
PY=/usr/bin/python3
[[ -x $PY ]] || PY=python3
exec "$PY" "$ROOT/scripts/wheel_pack.py" --gpurun "$BUILD/launcher/gpurun" \
  --worker-lib "$BUILD/launcher/libgpurun_worker.so" \
  --simulated-nvml "$BUILD/launcher/libgpurun_simulated_nvml.so" \
  --package "$ROOT/worker_runtime/python/gpurun" --out "$OUT"
