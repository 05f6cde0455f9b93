#!/usr/bin/env bash
# ctest python_destroy_first (issue 44 item 5): see destroy_first.py. gpurun names rank 1's
# ValueError (from its @record error file) as the root cause, not rank 0's connection error.
# Usage: run_destroy_first.sh GPURUN
TEST=python_destroy_first
source "$(dirname "$0")/common.sh"
rc=0
timeout 120 "$GPURUN" --master-port 0 --nproc 2 --device cpu --grace-period 5 \
  "$PY" "$HERE/destroy_first.py" > "$LOG" 2>&1 || rc=$?
[[ $rc != 0 && $rc != 124 ]] || fail "gpurun exited $rc, not the failure's status"
grep -q "Connection closed by peer" "$LOG" || fail "rank 0 did not fail of the closed connection"
summary=$(sed -n '/root cause (first failure in time):/,/======/p' "$LOG")
grep -q "rank       : 1 (local rank 1)" <<<"$summary" || fail "the root cause is not rank 1"
grep -q "message    : ValueError: rank 1 found a bad learning rate (10.0)" <<<"$summary" \
  || fail "the root cause does not quote rank 1's ValueError"
grep -q "also failed: rank 0 (pid [0-9]*) ended with exit code 1 (.*Connection closed by peer" \
  <<<"$summary" || fail "rank 0's connection error is not named as a consequence"
echo "$TEST: OK (exit $rc)"
