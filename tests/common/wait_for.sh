# The one polling helper of the shell tests and their shell workers (POSIX sh; sourced by
# tests/python/common.sh, tests/supervisor/torchrun_cli.sh and workers/*.sh,
# tests/control/sharing.sh, tests/slurm/run_slurm_test.sh):
#   wait_for SECONDS WHAT COMMAND [ARG...]
# runs COMMAND (a program or a shell function of the caller) every 50 ms until it succeeds
# (return 0). After SECONDS (whole seconds, wall clock) without success it reports "timed out
# after SECONDS s waiting for WHAT" through the caller's fail function (which usually exits)
# or, with none, on stderr, and returns 1. A COMMAND that finds the wait hopeless (the program
# it waits on has ended) may call fail itself.
#   port_open PORT (bash only): succeeds once something accepts TCP connections on
# 127.0.0.1:PORT.
wait_for() {
  _wait_for_secs=$1 _wait_for_what=$2
  shift 2
  _wait_for_end=$(($(date +%s%3N) + _wait_for_secs * 1000))
  until "$@"; do
    if [ "$(date +%s%3N)" -ge "$_wait_for_end" ]; then
      if command -v fail > /dev/null; then
        fail "timed out after $_wait_for_secs s waiting for $_wait_for_what"
      else
        echo "timed out after $_wait_for_secs s waiting for $_wait_for_what" >&2
      fi
      return 1
    fi
    sleep 0.05
  done
}
port_open() { (exec 3<> "/dev/tcp/127.0.0.1/$1") 2> /dev/null; }
