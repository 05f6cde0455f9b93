# The one polling helper of the shell tests and their shell workers (POSIX sh; sourced by
# tests/python/common.sh, tests/supervisor/torchrun_cli.sh and workers/*.sh,
# tests/control/sharing.sh, tests/slurm/run_slurm_test.sh):
#   wait_for SECONDS WHAT COMMAND [ARG...]
# runs COMMAND (a program or a shell function of the caller) every $WAIT_FOR_EVERY s (default
# 0.05; a caller whose COMMAND is costly, e.g. scontrol, sets more) until it succeeds
# (return 0). After SECONDS (whole seconds, wall clock) without success it reports "timed out
# after SECONDS s waiting for WHAT" through the caller's fail function (which usually exits)
# or, with none, on stderr, and returns 1. A COMMAND that finds the wait hopeless (the program
# it waits on has ended) may call fail itself.
#   wait_alive PID SECONDS WHAT COMMAND [ARG...]
# the same while PID (the gpurun the test started) runs: once it has ended, fail "gpurun (pid
# PID) ended before WHAT" at once.
#   port_open PORT (bash only): succeeds once something accepts TCP connections on
# 127.0.0.1:PORT.
wait_for() {
  _wait_for_secs=$1 _wait_for_what=$2
  shift 2
  _wait_for_clock
  _wait_for_end=$((_wait_for_ms + _wait_for_secs * 1000))
  until "$@"; do
    _wait_for_clock
    if [ "$_wait_for_ms" -ge "$_wait_for_end" ]; then
      if command -v fail > /dev/null; then
        fail "timed out after $_wait_for_secs s waiting for $_wait_for_what"
      else
        echo "timed out after $_wait_for_secs s waiting for $_wait_for_what" >&2
      fi
      return 1
    fi
    sleep "${WAIT_FOR_EVERY:-0.05}"
  done
}
_wait_for_clock() {  # _wait_for_ms: the wall clock in ms (bash: no process started)
  if [ -n "${EPOCHREALTIME:-}" ]; then
    _wait_for_us=${EPOCHREALTIME#*.}
    _wait_for_ms=$((${EPOCHREALTIME%.*} * 1000 + 1$_wait_for_us / 1000 - 1000))
  else
    _wait_for_ms=$(date +%s%3N)
  fi
}
port_open() { (exec 3<> "/dev/tcp/127.0.0.1/$1") 2> /dev/null; }
wait_alive() {
  _wait_alive_pid=$1 _wait_alive_what=$3
  _wait_alive_secs=$2
  shift 3
  wait_for "$_wait_alive_secs" "$_wait_alive_what" _wait_alive_check "$@"
}
_wait_alive_check() {
  "$@" && return 0
  kill -0 "$_wait_alive_pid" 2> /dev/null ||
    fail "gpurun (pid $_wait_alive_pid) ended before $_wait_alive_what"
  return 1
}
