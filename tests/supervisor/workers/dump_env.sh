#!/bin/sh
# Writes the worker's environment to $OUT_DIR/env.<RANK>, prints one line per stream.
env > "$OUT_DIR/env.$RANK.tmp" && mv "$OUT_DIR/env.$RANK.tmp" "$OUT_DIR/env.$RANK"
echo "stdout of rank $RANK"
echo "stderr of rank $RANK" >&2
