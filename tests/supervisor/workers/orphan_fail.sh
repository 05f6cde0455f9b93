#!/bin/sh
# Rank 0 starts a background child (which outlives it, re-parented) and exits 3; the
# other ranks sleep until stopped. Every child dies of the teardown's SIGTERM.
sleep 300 &
echo $! > "$OUT_DIR/child.$RANK"
if [ "$RANK" = 0 ]; then  # once every rank has its child
  . "$(dirname "$0")/../../common/wait_for.sh"
  all_children() { [ "$(ls "$OUT_DIR" | grep -c '^child\.')" -ge "$WORLD_SIZE" ]; }
  wait_for 5 "every rank's $OUT_DIR/child.<rank>" all_children
  exit 3
fi
wait
