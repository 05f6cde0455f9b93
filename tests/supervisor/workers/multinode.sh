#!/bin/sh
# Exit-barrier worker (multinode_test.cpp). Node 0 (GROUP_RANK 0): exits $NODE0_CODE
# (default 0) at once. Other nodes: sleep $NODE1_SLEEP s (default 3), write
# $OUT_DIR/finished.<node>.<local_rank> as their last act, then exit $NODE1_CODE (default
# 0) — with NODE1_CODE set, only local rank 0 fails; the others sleep until stopped.
if [ "$GROUP_RANK" = 0 ]; then exit "${NODE0_CODE:-0}"; fi
sleep "${NODE1_SLEEP:-3}"
if [ -n "$NODE1_CODE" ] && [ "$LOCAL_RANK" != 0 ]; then
  while :; do sleep 0.1; done
fi
touch "$OUT_DIR/finished.$GROUP_RANK.$LOCAL_RANK"
exit "${NODE1_CODE:-0}"
