# The one polling helper of the shell tests (sourced by tests/python/common.sh,
# tests/supervisor/torchrun_cli.sh, tests/control/sharing.sh, tests/slurm/run_slurm_test.sh):
#   wait_for SECONDS WHAT COMMAND [ARG...]
# runs COMMAND (a program or a shell function of the caller) every 50 ms until it succeeds
# (return 0). After SECONDS (wall clock) without success it reports "timed out after SECONDS s
# waiting for WHAT" through the caller's fail function (which usually exits) or on stderr,
# and returns 1. A COMMAND that finds the wait hopeless (the program it waits on has ended) may
# call fail itself.
# port_open PORT: succeeds once something accepts TCP connections on 127.0.0.1:PORT.
wait_for() {
  local secs=$1 what=$2
  shift 2
  local end=$((${EPOCHREALTIME/./} + secs * 1000000))
  until "$@"; do
    if ((${EPOCHREALTIME/./} >= end)); then
      if declare -F fail > /dev/null; then
        fail "timed out after $secs s waiting for $what"
      else
        echo "timed out after $secs s waiting for $what" >&2
      fi
      return 1
    fi
    sleep 0.05
  done
}
port_open() { (exec 3<> "/dev/tcp/127.0.0.1/$1") 2> /dev/null; }
