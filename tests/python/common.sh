# Sourced by tests/python/run_*.sh after setting TEST (the ctest name) and with the script's
# arguments: sets GPURUN ($1), HERE (this folder), PY (a python3 with torch), TMP (a scratch
# folder removed at exit) and LOG ($TMP/gpurun.log); defines
#   fail MSG             prints "$TEST: FAIL: MSG" and the last 40 lines of $LOG, exits 1
#   wait_event PATTERN   waits (90 s at most) for a line of $TMP/events.jsonl matching it
#   wait_line PATTERN    waits (180 s at most) for a line of $LOG matching the extended regex
#                        while gpurun ($pid) runs
set -euo pipefail
GPURUN=$1
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PY=$("$HERE/find_torch_python.sh")
TMP=$(mktemp -d)
trap '[[ -n ${KEEP_TMP:-} ]] || rm -rf "$TMP"' EXIT  # KEEP_TMP=1: kept for a post-mortem
LOG=$TMP/gpurun.log
fail() {
  echo "$TEST: FAIL: $*" >&2
  [[ -f $LOG ]] && tr '\r' '\n' < "$LOG" | tail -40 >&2
  if [[ -f $TMP/events.jsonl ]]; then
    echo "-- the last 12 events ($TMP/events.jsonl):" >&2
    tail -12 "$TMP/events.jsonl" >&2
  fi
  # gpurun, when the script started it ($pid, its own child): its workers go with it
  [[ -n ${pid:-} && ${pid:-0} -gt 1 ]] && kill "$pid" 2>/dev/null
  exit 1
}
wait_event() {
  for _ in $(seq 1 900); do
    grep -q "$1" "$TMP/events.jsonl" 2>/dev/null && return 0
    sleep 0.1
  done
  fail "no event matching $1 in 90 s"
}
wait_line() {
  for _ in $(seq 1 1800); do
    grep -Eq "$1" "$LOG" 2>/dev/null && return 0
    kill -0 "$pid" 2>/dev/null || fail "gpurun ended before '$1'"
    sleep 0.1
  done
  fail "no line '$1' in 180 s"
}
