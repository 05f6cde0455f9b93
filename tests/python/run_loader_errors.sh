#!/usr/bin/env bash
# ctest python_loader_errors: misuses of the gpurun package's loader under gpurun --config on
# 3 CPU slots (tests/python/loader_misuse.py) fail at once with a message saying what to do,
# instead of training the wrong samples or hanging: the loader iterated outside epochs();
# [batch] global = 2 smaller than the world of 3 (was a hang in the empty ranks' collective).
# And steps() with [batch] global = 12 prints no "[batch] global" warning (it used to).
# Usage: run_loader_errors.sh GPURUN
TEST=python_loader_errors
source "$(dirname "$0")/common.sh"
run() {  # MODE GLOBAL: gpurun --config with [batch] global = GLOBAL, its exit status
  printf 'active_gpus = [0, 1, 2]\n[batch]\nglobal = %s\n' "$2" > "$TMP/config.toml"
  timeout 120 "$GPURUN" --master-port 0 --nproc 3 --device cpu --config "$TMP/config.toml" \
    "$PY" "$HERE/loader_misuse.py" "$1" > "$LOG" 2>&1
}
run outside 12 && fail "iterating the loader outside epochs() succeeded"
grep -q "iterate the gpurun loader inside" "$LOG" || fail "no message for the loader outside epochs()"
rc=0
run small_global 2 || rc=$?
((rc != 0 && rc != 124)) || fail "[batch] global = 2 on 3 ranks: exit $rc (124: it hung)"
grep -q "\[batch\] global = 2 is smaller than the world size 3" "$LOG" ||
  fail "no message for [batch] global smaller than the world"
run steps_ok 12 || fail "steps() with [batch] global = 12 failed"
grep -q "warning" "$LOG" && fail "a warning with steps(): $(grep warning "$LOG")"
[[ $(grep -c "loader_misuse steps_ok: slot . done" "$LOG") == 3 ]] || fail "not every slot finished"
echo "python_loader_errors: OK"
