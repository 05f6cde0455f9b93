#!/usr/bin/env bash
# ctest python_wheel (issue 47: the Python user's path, docs/python.md#wheel): scripts/wheel.sh
# packs the binaries already built next to GPURUN (--no-build) into a wheel; pip installs it
# offline (--no-index) into a fresh venv over Debian's torch (--system-site-packages); with
# neither PYTHONPATH nor GPURUN_WORKER_LIBRARY set:
# * `gpurun` on PATH is the venv's, `gpurun --version` answers, its binary needs no LibTorch;
# * `import gpurun` is the venv's package and loads the worker library it holds;
# * examples/python/step_loop.py trains on 2 CPU slots (on 2 simulated GPUs: the wheel's
#   libgpurun_simulated_nvml.so) under the installed gpurun --config, shrunk to [0] by an edit;
# * `pip uninstall -y gpurun` leaves the venv's files as they were before the install.
# And scripts/wheel_pack.py refuses a stale build: a package of another version or ABI.
# Usage: run_wheel.sh GPURUN
TEST=python_wheel
source "$(dirname "$0")/common.sh"
BUILD=$(cd "$(dirname "$GPURUN")/.." && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
VENV=$TMP/venv
started=$SECONDS
"$ROOT/scripts/wheel.sh" --no-build --build-dir "$BUILD" -o "$TMP/dist" >> "$LOG" 2>&1 ||
  fail "scripts/wheel.sh failed"
WHEEL=$(ls "$TMP"/dist/gpurun-*-py3-none-linux_*.whl) || fail "no wheel in $TMP/dist"
# A stale build is refused: a package of another version, or one that speaks another ABI.
refused() {  # WHAT SED_SCRIPT FILE EXPECTED: wheel_pack.py on a changed copy of the package
  rm -rf "$TMP/pkg"; cp -r "$ROOT/worker_runtime/python" "$TMP/pkg"; sed -i "$2" "$TMP/pkg/gpurun/$3"
  if "$PY" "$ROOT/scripts/wheel_pack.py" --gpurun "$GPURUN" --worker-lib "$BUILD/launcher/libgpurun_worker.so" \
    --simulated-nvml "$BUILD/launcher/libgpurun_simulated_nvml.so" --package "$TMP/pkg/gpurun" \
    --out "$TMP/stale" > "$TMP/refused.txt" 2>&1; then fail "a wheel of a package with $1 was packed"; fi
  grep -q "$4" "$TMP/refused.txt" || fail "$1: wheel_pack.py said '$(cat "$TMP/refused.txt")'"
  [[ ! -e $TMP/stale ]] || fail "$1: wheel_pack.py wrote $(ls "$TMP/stale")"
}
refused "another version" 's/^__version__ = .*/__version__ = "9.9"/' __init__.py \
  "the versions differ: .*__init__.py: 9.9"
refused "another ABI" 's/^ABI = [0-9]*/ABI = 999/' _native.py "speaks 999: rebuild"
# The interpreter the worker tests use (Debian's, with python3-torch), in a fresh venv.
"$PY" -m venv --system-site-packages "$VENV" >> "$LOG" 2>&1 ||
  fail "$PY -m venv failed (Debian: python3-venv, which scripts/setup.sh installs)"
venv_files() { (cd "$VENV" && find . ! -name . | LC_ALL=C sort); }
venv_files > "$TMP/before.txt"
unset PYTHONPATH GPURUN_WORKER_LIBRARY
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
"$VENV/bin/pip" install --no-index --no-cache-dir "$WHEEL" >> "$LOG" 2>&1 || fail "pip install $WHEEL"
echo "$TEST: built and installed $(basename "$WHEEL") in $((SECONDS - started)) s"

export PATH=$VENV/bin:$PATH
[[ $(command -v gpurun) == "$VENV/bin/gpurun" ]] || fail "gpurun on PATH is '$(command -v gpurun)'"
[[ $(gpurun --version) == "gpurun $("$GPURUN" --version | cut -d' ' -f2)" ]] ||
  fail "the installed gpurun --version says '$(gpurun --version)'"
SITE=$("$VENV/bin/python3" -c 'import sysconfig; print(sysconfig.get_paths()["platlib"])')
ldd "$SITE/gpurun/_bin/gpurun" > "$TMP/ldd.txt" || fail "ldd of the installed gpurun"
if grep -Eiq 'torch|not found' "$TMP/ldd.txt"; then
  cat "$TMP/ldd.txt" >&2; fail "the installed gpurun links LibTorch or misses a library"
fi
# import gpurun (run from $TMP: no source tree on the path) is the venv's and loads its library.
got=$(cd "$TMP" && python3 -c 'import gpurun, gpurun._native as n; print(gpurun.__file__, n.load()._name)') ||
  fail "import gpurun / loading its worker library without GPURUN_WORKER_LIBRARY"
[[ $got == "$SITE/gpurun/__init__.py $SITE/gpurun/_bin/libgpurun_worker.so" ]] ||
  fail "import gpurun found '$got'"

# The example, elastic, under the installed gpurun: 2 slots, then [0] by an edit of the file.
conf() { printf 'active_gpus = %s\n' "$1" > "$TMP/config.toml.new"; mv "$TMP/config.toml.new" "$TMP/config.toml"; }
last_it() { local v; v=$(tail -3 "$TMP/run.jsonl" 2>/dev/null | grep -o '"it": [0-9]*' | tail -1 | cut -d' ' -f2 || true)
            echo "${v:--1}"; }
logged() { (( $(last_it) >= $1 )); }
conf "[0, 1]"
(cd "$TMP" && exec gpurun --master-port 0 --nproc 2 --device cpu --simulate-gpus 2 \
  --config "$TMP/config.toml" --event-log "$TMP/events.jsonl" python3 "$ROOT/examples/python/step_loop.py" \
  --max-iters 30 --every 5 --eval-interval 100 --log "$TMP/run.jsonl" --sleep 0.1 --sleep-until "$TMP/fast") \
  >> "$LOG" 2>&1 &
pid=$!
wait_running 90 "iteration 6 logged" logged 6
conf "[0]"
wait_event '"active": \[0\],'
: > "$TMP/fast"
wait "$pid" || fail "the installed gpurun exited $?"
grep -q 'energy: 2 simulated GPU(s)' "$LOG" || fail "no simulated GPUs (libgpurun_simulated_nvml.so of the wheel)"
worlds=$(grep -o '"world": [0-9]*' "$TMP/run.jsonl" | cut -d' ' -f2 | uniq | tr '\n' ' ')
[[ $worlds == "2 1 " ]] || fail "world sizes over the run: '$worlds' (want 2 then 1)"
[[ $(grep -c '"it": ' "$TMP/run.jsonl") == 30 ]] || fail "$(grep -c '"it": ' "$TMP/run.jsonl") iterations logged, not 30"
echo "$TEST: step_loop.py ran 30 iterations on worlds $worlds under $VENV/bin/gpurun"

"$VENV/bin/pip" uninstall -y gpurun >> "$LOG" 2>&1 || fail "pip uninstall -y gpurun"
venv_files > "$TMP/after.txt"
diff "$TMP/before.txt" "$TMP/after.txt" >&2 || fail "pip uninstall left the venv's files changed (the diff above)"
[[ ! -e $VENV/bin/gpurun ]] || fail "pip uninstall left $VENV/bin/gpurun"
echo "$TEST: OK ($((SECONDS - started)) s)"
