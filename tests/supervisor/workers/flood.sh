#!/bin/sh
# Writes $FLOOD_LINES lines of 100 bytes to stdout (default 40000: 4 MB, more than any pipe
# holds), then creates $OUT_DIR/printed.$RANK, sleeps $FLOOD_SLEEP s (default 0), creates
# $OUT_DIR/finished.$RANK and exits 0 (console_stall_test.cpp).
yes "$(printf 'flood %093d' 0)" | head -n "${FLOOD_LINES:-40000}"
touch "$OUT_DIR/printed.$RANK"
sleep "${FLOOD_SLEEP:-0}"
touch "$OUT_DIR/finished.$RANK"
exit "${FLOOD_CODE:-0}"
