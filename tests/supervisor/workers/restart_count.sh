#!/bin/sh
# Records TORCHELASTIC_RESTART_COUNT per rank; rank 0 fails every attempt once
# all ranks of the attempt have recorded theirs.
c="$TORCHELASTIC_RESTART_COUNT"
# Written whole, then renamed: rank 0 counts the files, and a rank killed between creating
# the file and writing it would otherwise leave it empty.
echo "$c" > "$OUT_DIR/.count.$RANK.$c.tmp" && mv "$OUT_DIR/.count.$RANK.$c.tmp" "$OUT_DIR/count.$RANK.$c"
if [ "$RANK" = 0 ]; then
  . "$(dirname "$0")/../../common/wait_for.sh"
  all_counts() { [ "$(ls "$OUT_DIR" | grep -c "^count\..*\.$c\$")" -ge "$WORLD_SIZE" ]; }
  wait_for 5 "every rank's $OUT_DIR/count.<rank>.$c" all_counts
  exit 3
fi
exec sleep infinity
