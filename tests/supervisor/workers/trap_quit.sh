#!/bin/sh
# Writes its pid to $OUT_DIR/pid.<rank>; on SIGQUIT writes "QUIT" to $OUT_DIR/sig.<rank>
# and exits 0.
trap 'echo QUIT > "$OUT_DIR/sig.$RANK"; exit 0' QUIT
echo $$ > "$OUT_DIR/pid.$RANK"
while :; do sleep 0.1; done
