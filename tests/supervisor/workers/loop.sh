#!/bin/sh
# Writes its pid to $OUT_DIR/pid.<rank> and runs until killed (the same pid).
echo $$ > "$OUT_DIR/pid.$RANK"
exec sleep infinity
