# Sourced by tests/python/run_*.sh after setting TEST (the ctest name) and with the script's
# arguments: sets GPURUN ($1), HERE (this folder), PY (a python3 with torch), TMP (a scratch
# folder removed at exit) and LOG ($TMP/gpurun.log); defines
#   fail MSG             prints "$TEST: FAIL: MSG" and the last 40 lines of $LOG, exits 1
#   wait_for SECONDS WHAT COMMAND...      (tests/common/wait_for.sh) polls COMMAND until it succeeds
#   wait_running SECONDS WHAT COMMAND...  the same while gpurun ($pid) runs (wait_alive)
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
. "$HERE/../common/wait_for.sh"
wait_running() { wait_alive "$pid" "$@"; }
wait_event() { wait_for 90 "an event matching $1 in $TMP/events.jsonl" grep -qs "$1" "$TMP/events.jsonl"; }
wait_line() { wait_running 180 "a line '$1' in $LOG" grep -Eqs "$1" "$LOG"; }
