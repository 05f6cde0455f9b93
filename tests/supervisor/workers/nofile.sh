#!/bin/sh
# Writes the RLIMIT_NOFILE soft limit the worker got to $OUT_DIR/nofile.<rank>.
ulimit -Sn > "$OUT_DIR/nofile.$RANK"
