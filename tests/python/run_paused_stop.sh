#!/usr/bin/env bash
# ctest python_paused_sigint_<mode> (issue 25, found by the fresh-clone check): Ctrl-C (SIGINT)
# on a paused job. Its processes (hold: parked; release: standbys) wait inside the runtime,
# where Python's SIGINT handler never runs: gpurun ends them with SIGTERM, so the job stops at
# once with 130 (128 + SIGINT), not after the grace period (60 s here) with SIGKILL.
# Usage: run_paused_stop.sh GPURUN release|hold
MODE=${2:-release}
TEST=python_paused_sigint_$MODE
source "$(dirname "$0")/common.sh"
mkdir -p "$TMP/out"
printf 'active_gpus = [0, 1]\n[park]\nmode = "%s"\n' "$MODE" > "$TMP/config.toml"
"$GPURUN" --master-port 0 --nproc 2 --device cpu --grace-period 60 --config "$TMP/config.toml" \
  --event-log "$TMP/events.jsonl" "$PY" "$HERE/elastic_train.py" "$TMP/out" 30 0.5 > "$LOG" 2>&1 &
pid=$!
wait_event '"event": "decision", "generation": 0, "prev_generation": 0, "round": 1,'
printf 'active_gpus = []\n[park]\nmode = "%s"\n' "$MODE" > "$TMP/c.new"
mv "$TMP/c.new" "$TMP/config.toml"
if [[ $MODE == hold ]]; then
  wait_event '"to": "PARKED".*"gpu": 1\|"gpu": 1.*"to": "PARKED"'
  wait_event '"to": "PARKED".*"gpu": 0\|"gpu": 0.*"to": "PARKED"'
else
  wait_event '"to": "STANDBY"'
fi
sleep 1
t0=$(date +%s)
kill -INT "$pid"
rc=0
wait "$pid" || rc=$?
took=$(( $(date +%s) - t0 ))
[[ $rc == 130 ]] || fail "gpurun exited $rc, not 130"
((took < 30)) || fail "the paused job took $took s to stop (the grace period is 60 s)"
grep -q "grace period of 60000 ms over" "$LOG" && fail "the waiting processes needed SIGKILL"
grep -q "the job is paused: ending its waiting processes with SIGTERM" "$LOG" ||
  fail "gpurun did not say how it ends the paused job's processes"
echo "$TEST: OK (stopped $took s after SIGINT, exit $rc)"
