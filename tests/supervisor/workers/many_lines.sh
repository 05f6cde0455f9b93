#!/bin/sh
# Writes N numbered lines to stdout ("out 0001" ...) and to stderr ("err 0001" ...).
n=${1:-2000}
i=1
while [ $i -le $n ]; do
  printf 'out %04d\n' $i
  printf 'err %04d\n' $i >&2
  i=$((i + 1))
done
