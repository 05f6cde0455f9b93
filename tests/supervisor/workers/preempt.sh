#!/bin/bash
# A worker for docs/cli.md#preemption. MODE_<rank> (else MODE) picks what it emulates:
#   runtime: a worker on the gpurun runtime: writes $GPURUN_PREEMPT_DIR/runtime.$$ (it leads its
#            process group), then at every "boundary" (each 0.1 s) exits 0 when gpurun's
#            $GPURUN_PREEMPT_DIR/stop exists, after writing $OUT_DIR/stopped.<rank>;
#   stuck:   announces itself like runtime but never reaches a boundary, and ignores SIGTERM;
#   plain:   no announcement (a program that does not use the runtime).
# Every signal it gets is appended to $OUT_DIR/sig.<rank>; SIGTERM ends runtime/plain with 143.
mode_var="MODE_$RANK"
mode="${!mode_var:-${MODE:-runtime}}"
rec() { echo "$1" >> "$OUT_DIR/sig.$RANK"; }
trap 'rec USR2' USR2
trap 'rec URG' URG
if [ "$mode" = stuck ]; then
  trap 'rec TERM' TERM
else
  trap 'rec TERM; exit 143' TERM
fi
if [ "$mode" != plain ]; then
  : > "$GPURUN_PREEMPT_DIR/runtime.$$"
fi
echo $$ > "$OUT_DIR/pid.$RANK"
while :; do
  sleep 0.1
  if [ "$mode" = runtime ] && [ -e "$GPURUN_PREEMPT_DIR/stop" ]; then
    echo stopped > "$OUT_DIR/stopped.$RANK"
    exit 0
  fi
done
