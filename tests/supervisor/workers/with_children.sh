#!/bin/sh
# A worker with a child and a grandchild; every pid goes to $OUT_DIR/pids.<rank>.
echo $$ >> "$OUT_DIR/pids.$RANK"
sleep 300 &
echo $! >> "$OUT_DIR/pids.$RANK"
sh -c 'sleep 300 & echo $! >> "$1"; wait' sh "$OUT_DIR/pids.$RANK" &
echo $! >> "$OUT_DIR/pids.$RANK"
touch "$OUT_DIR/ready.$RANK"
wait
