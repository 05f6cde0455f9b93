#!/bin/sh
# Records TORCHELASTIC_RESTART_COUNT per rank; rank 0 fails every attempt once
# all ranks of the attempt have recorded theirs.
c="$TORCHELASTIC_RESTART_COUNT"
# Written whole, then renamed: rank 0 counts the files, and a rank killed between creating
# the file and writing it would otherwise leave it empty.
echo "$c" > "$OUT_DIR/.count.$RANK.$c.tmp" && mv "$OUT_DIR/.count.$RANK.$c.tmp" "$OUT_DIR/count.$RANK.$c"
if [ "$RANK" = 0 ]; then
  i=0
  while [ "$(ls "$OUT_DIR" | grep -c "^count\..*\.$c\$")" -lt "$WORLD_SIZE" ] && [ $i -lt 100 ]; do
    sleep 0.05; i=$((i + 1))
  done
  exit 3
fi
while :; do sleep 0.1; done
