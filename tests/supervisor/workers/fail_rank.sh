#!/bin/sh
# Rank $FAIL_RANK exits with $FAIL_CODE (or kills itself with $FAIL_SIGNAL) once
# every rank has written $OUT_DIR/pid.<rank>; the others ignore SIGTERM when
# $IGNORE_TERM=1 and otherwise sleep until they are stopped.
echo $$ > "$OUT_DIR/pid.$RANK"
if [ "$RANK" = "$FAIL_RANK" ]; then
  i=0
  while [ "$(ls "$OUT_DIR" | grep -c '^pid\.')" -lt "$WORLD_SIZE" ] && [ $i -lt 100 ]; do
    sleep 0.05; i=$((i + 1))
  done
  echo "rank $RANK is failing on purpose" >&2
  date +%s%N > "$OUT_DIR/failed_at"
  if [ -n "$FAIL_SIGNAL" ]; then kill -"$FAIL_SIGNAL" $$; sleep 5; fi
  exit "$FAIL_CODE"
fi
if [ "$IGNORE_TERM" = 1 ]; then trap '' TERM; fi
while :; do sleep 0.1; done
