#!/bin/sh
# Multi-node worker (multinode_test.cpp). Every worker first writes
# $OUT_DIR/started.<attempt>.<rank>. Node 0 (GROUP_RANK 0): sleeps $NODE0_SLEEP s (default 0),
# then exits $NODE0_CODE (default 0). Other nodes: sleep $NODE1_SLEEP s (default 3), write
# $OUT_DIR/finished.<node>.<local_rank> as their last act, then exit $NODE1_CODE (default
# 0) — with NODE1_CODE set, only local rank 0 fails; the others sleep until stopped. With
# FAIL_ONCE set, node 1's local rank 0 exits 7 in attempt 0 only, once every rank started it.
touch "$OUT_DIR/started.$TORCHELASTIC_RESTART_COUNT.$RANK"
if [ "$GROUP_RANK" = 0 ]; then
  if [ -n "$NODE0_SLEEP" ]; then sleep "$NODE0_SLEEP"; fi
  exit "${NODE0_CODE:-0}"
fi
if [ -n "$FAIL_ONCE" ] && [ "$TORCHELASTIC_RESTART_COUNT" = 0 ] && [ "$LOCAL_RANK" = 0 ]; then
  . "$(dirname "$0")/../../common/wait_for.sh"
  all_started() { [ "$(ls "$OUT_DIR" | grep -c '^started\.0\.')" -ge "$WORLD_SIZE" ]; }
  wait_for 5 "every rank's $OUT_DIR/started.0.<rank>" all_started
  exit 7
fi
sleep "${NODE1_SLEEP:-3}"
if [ -n "$NODE1_CODE" ] && [ "$LOCAL_RANK" != 0 ]; then
  exec sleep infinity
fi
touch "$OUT_DIR/finished.$GROUP_RANK.$LOCAL_RANK"
exit "${NODE1_CODE:-0}"
