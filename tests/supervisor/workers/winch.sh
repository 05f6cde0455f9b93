#!/bin/sh
# A worker on a terminal that says its window size at the start and after each SIGWINCH
# (gpurun resizes the worker's pseudo-terminal when its own terminal is resized, and signals
# the worker's group); ends once $OUT_DIR/done exists (at most 20 s).
exec 3>&1  # stdout, for stty inside $(...)
trap 'echo "resized $(stty size <&3)"' WINCH
echo "size $(stty size <&3)"
i=0
while [ ! -e "$OUT_DIR/done" ] && [ $i -lt 200 ]; do sleep 0.1; i=$((i + 1)); done
