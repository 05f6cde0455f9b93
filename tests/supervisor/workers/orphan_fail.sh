#!/bin/sh
# Rank 0 starts a background child (which outlives it, re-parented) and exits 3; the
# other ranks sleep until stopped. Every child dies of the teardown's SIGTERM.
sleep 300 &
echo $! > "$OUT_DIR/child.$RANK"
if [ "$RANK" = 0 ]; then
  sleep 0.3
  exit 3
fi
wait
