#!/bin/sh
# A worker on a terminal that says its window size at the start and after each SIGWINCH
# (gpurun resizes the worker's pseudo-terminal when its own terminal is resized, and signals
# the worker's group); ends once $OUT_DIR/done exists (at most 20 s).
exec 3>&1  # stdout, for stty inside $(...)
trap 'echo "resized $(stty size <&3)"' WINCH
echo "size $(stty size <&3)"
. "$(dirname "$0")/../../common/wait_for.sh"
wait_for 20 "$OUT_DIR/done" test -e "$OUT_DIR/done"
