#!/bin/sh
# Writes its pid to $OUT_DIR/pid.<rank> and loops until killed.
echo $$ > "$OUT_DIR/pid.$RANK"
while :; do sleep 0.1; done
