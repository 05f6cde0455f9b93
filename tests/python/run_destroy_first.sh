#!/usr/bin/env bash
# ctest python_destroy_first (issue 44 item 5): see destroy_first.py. gpurun names rank 1's
# ValueError (from its @record error file) as the root cause, not rank 0's connection error.
# With "gap" (ctest python_destroy_first_gap), rank 1 raises 1 s after it destroyed its group,
# when rank 0 has failed already: gpurun holds the teardown for it and names its ValueError.
# Usage: run_destroy_first.sh GPURUN [gap]
TEST=python_destroy_first${2:+_$2}
source "$(dirname "$0")/common.sh"
gap=0
[[ ${2:-} == gap ]] && gap=1
rc=0
DESTROY_GAP_S=$gap timeout 120 "$GPURUN" --master-port 0 --nproc 2 --device cpu --grace-period 5 \
  "$PY" "$HERE/destroy_first.py" > "$LOG" 2>&1 || rc=$?
[[ $rc != 0 && $rc != 124 ]] || fail "gpurun exited $rc, not the failure's status"
grep -Eq "Connection (closed|reset) by peer" "$LOG" \
  || fail "rank 0 did not fail of the closed connection"
if [[ $gap != 0 ]]; then
  held="rank 0 \(pid [0-9]+\) lost its connection to a peer \(.*Connection (closed|reset) by"
  held+=" peer.*\) and ended with exit code 1: waiting up to 5 s for the rank that failed"
  grep -Eq "$held before stopping the others" "$LOG" \
    || fail "gpurun did not hold the teardown after rank 0's connection error"
fi
summary=$(sed -n '/root cause (first failure in time):/,/======/p' "$LOG")
grep -q "rank       : 1 (local rank 1)" <<<"$summary" || fail "the root cause is not rank 1"
grep -q "message    : ValueError: rank 1 found a bad learning rate (10.0)" <<<"$summary" \
  || fail "the root cause does not quote rank 1's ValueError"
also="also failed: rank 0 \(pid [0-9]+\) ended with exit code 1 \(.*Connection (closed|reset)"
grep -Eq "$also by peer" <<<"$summary" || fail "rank 0's connection error is not named as a consequence"
echo "$TEST: OK (exit $rc)"
