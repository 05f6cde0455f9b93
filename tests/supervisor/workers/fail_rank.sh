#!/bin/sh
# Rank $FAIL_RANK exits with $FAIL_CODE (or kills itself with $FAIL_SIGNAL) once
# every rank has written $OUT_DIR/pid.<rank>; the others ignore SIGTERM when
# $IGNORE_TERM=1 and otherwise run until they are stopped.
echo $$ > "$OUT_DIR/pid.$RANK"
if [ "$RANK" = "$FAIL_RANK" ]; then
  . "$(dirname "$0")/../../common/wait_for.sh"
  all_pids() { [ "$(ls "$OUT_DIR" | grep -c '^pid\.')" -ge "$WORLD_SIZE" ]; }
  wait_for 5 "every rank's $OUT_DIR/pid.<rank>" all_pids
  echo "rank $RANK is failing on purpose" >&2
  date +%s%N > "$OUT_DIR/failed_at"
  if [ -n "$FAIL_SIGNAL" ]; then kill -"$FAIL_SIGNAL" $$; fi  # delivered before kill returns
  exit "$FAIL_CODE"
fi
if [ "$IGNORE_TERM" = 1 ]; then trap '' TERM; fi  # inherited by exec
exec sleep infinity
