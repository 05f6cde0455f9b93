#!/bin/sh
# A worker with a tqdm-style progress line. Says whether stdout/stderr are terminals (and, on
# a terminal, its size and the output flags gpurun turned off), then redraws "step i/3" with
# "\r". Before the first state it waits (up to 10 s) for $OUT_DIR/ready, which the test creates
# once the stderr line is on gpurun's console (stdout and stderr are two streams: without it the
# stderr line may land inside the bar); after the first state it waits for $OUT_DIR/go, which the
# test creates once it has seen that state. Ends with bytes and no newline.
if [ -t 1 ]; then echo "stdout tty"; else echo "stdout pipe"; fi
if [ -t 2 ]; then echo "stderr tty" >&2; else echo "stderr pipe" >&2; fi
exec 3>&1  # stdout, for stty inside $(...)
if [ -t 1 ]; then
  echo "size $(stty size <&3)"
  echo "flags $(stty -a <&3 | tr ' ;' '\n\n' | grep -x -e -opost -e -echo | tr '\n' ' ')"
fi
. "$(dirname "$0")/../../common/wait_for.sh"
wait_for 10 "$OUT_DIR/ready" test -e "$OUT_DIR/ready"
printf '\rstep 1/3'
wait_for 10 "$OUT_DIR/go" test -e "$OUT_DIR/go"
printf '\rstep 2/3'
sleep 0.1
printf '\rstep 3/3\n'
printf 'last bytes'
