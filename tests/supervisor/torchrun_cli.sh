#!/usr/bin/env bash
# ctest torchrun_cli_<case>: torchrun command lines, unchanged, with gpurun in torchrun's place
# (issue 26): 2 CPU workers each, exit 0, and the workers' environment as torchrun gives it.
#   c10d_single         --standalone-free c10d on one node: --rdzv-backend c10d --rdzv-endpoint
#   c10d_two_nodes      two gpuruns on loopback, the same command, no --node-rank: ranks 0-3, one
#                       store, node ranks in join order
#   nnodes_range        --nnodes 1:2 with one node: it starts alone after the last call
#   mixed_ranks         c10d with 3 nodes: one given --node-rank 1 joins first, the next one
#                       without takes rank 2 (join order skips the rank already taken)
#   node_left           c10d with 3 nodes: node 1 stops (SIGINT) during the start rendezvous;
#                       the next gpurun takes its rank 1, the job starts with 3 nodes
#   stale_job           a joiner with its own --rdzv-id meets another job's store on the port:
#                       refused at once (exit 1, both ids named), not joined
#   late_node           --nnodes 1:2: a node that joins after node 0 closed the rendezvous
#                       with 1 node is refused (exit 1, the reason named); node 0 goes on
#   module              -m pkg.mod (python3 -m) with PET_NPROC_PER_NODE=2 in place of the flag,
#                       the interpreter from torchrun's PYTHON_EXEC
#   same_instant        c10d, three gpuruns on one host started at once: one hosts, ranks 0-5
#   no_python           --no-python on a script ending in .py (run as a program)
#   local_ranks_filter  --local-ranks-filter 1: only local rank 1 on the console
#   redirects_tee       -r 1 -t 2 --log-dir: stdout only in files, stderr in files and console
#   health_check        TORCHELASTIC_HEALTH_CHECK_PORT: 200 and alive while the job runs (and
#                       /metrics, Prometheus' text, on the same port), 503
#                       once it stops (SIGTERM), nothing listening after the exit
# Single-node cases take --master-port 0 (a free port), so that ctest -j runs them side by side.
# Usage: torchrun_cli.sh GPURUN CASE
set -euo pipefail
GPURUN=$1 CASE=$2
HERE=$(cd "$(dirname "$0")" && pwd)
DUMP=$HERE/workers/dump_env.sh
TMP=$(mktemp -d)
trap 'for j in $(jobs -p); do kill "$j" 2> /dev/null; done; rm -rf "$TMP"' EXIT  # our gpuruns
export OUT_DIR=$TMP
fail() {
  echo "torchrun_cli_$CASE: FAIL: $*" >&2
  for f in "$TMP"/*.log; do [[ -f $f ]] && { echo "-- $f" >&2; tail -20 "$f" >&2; }; done
  exit 1
}
port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
val() { sed -n "s/^$2=//p" "$TMP/env.$1"; }  # val RANK NAME
run() { "$GPURUN" --device cpu "$@" > "$TMP/out.log" 2> "$TMP/err.log" || fail "gpurun exited $?"; }
. "$HERE/../common/wait_for.sh"
wait_line() { wait_for 10 "a line matching '$2' in $1" grep -qs "$2" "$1"; }  # FILE PATTERN
hosting() { wait_for 10 "node 0's store on port $1" port_open "$1"; }  # hosting PORT
worlds() {  # worlds N RANK...: each rank's WORLD_SIZE is N
  local n=$1 r
  shift
  for r in "$@"; do [[ $(val "$r" WORLD_SIZE) == "$n" ]] || fail "rank $r: world $(val "$r" WORLD_SIZE), not $n"; done
}
case $CASE in
  c10d_single)
    run --nnodes 1 --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint "localhost:$(port)" \
      --rdzv-id job7 --role trainer "$DUMP"
    for r in 0 1; do
      [[ $(val $r WORLD_SIZE) == 2 && $(val $r TORCHELASTIC_RUN_ID) == job7 &&
         $(val $r ROLE_NAME) == trainer && $(val $r MASTER_ADDR) == localhost ]] ||
        fail "rank $r: $(grep -E '^(WORLD_SIZE|TORCHELASTIC_RUN_ID|ROLE_NAME|MASTER_ADDR)=' "$TMP/env.$r")"
    done
    ;;
  c10d_two_nodes)
    P=$(port)
    args=(--nnodes 2 --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint "127.0.0.1:$P"
          --rdzv-id job8 "$DUMP")
    "$GPURUN" --device cpu "${args[@]}" > "$TMP/a.log" 2>&1 &
    a=$!
    hosting "$P"
    "$GPURUN" --device cpu "${args[@]}" > "$TMP/b.log" 2>&1 || fail "the second gpurun exited $?"
    wait "$a" || fail "the first gpurun exited $?"
    grep -q "joined as node 1 (join order)" "$TMP/b.log" || fail "the second node was not given node rank 1"
    for r in 0 1 2 3; do
      [[ -f $TMP/env.$r ]] || fail "no rank $r"
      [[ $(val $r WORLD_SIZE) == 4 && $(val $r GROUP_RANK) == $((r / 2)) &&
         $(val $r GROUP_WORLD_SIZE) == 2 && $(val $r LOCAL_RANK) == $((r % 2)) &&
         $(val $r MASTER_PORT) == "$P" ]] || fail "rank $r: $(grep -E '^(WORLD_SIZE|GROUP_|LOCAL_RANK|MASTER_PORT)' "$TMP/env.$r" | tr '\n' ' ')"
    done
    ;;
  nnodes_range)
    run --nnodes 1:2 --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint "127.0.0.1:$(port)" \
      --rdzv-conf last_call_timeout=1 "$DUMP"
    grep -q "starting with 1 node (--nnodes 1:2; the last call ended)" "$TMP/err.log" ||
      fail "no line saying it started with 1 node"
    [[ $(val 1 WORLD_SIZE) == 2 && $(val 1 GROUP_WORLD_SIZE) == 1 ]] || fail "rank 1: world $(val 1 WORLD_SIZE)"
    ;;
  mixed_ranks)
    P=$(port)
    args=(--nnodes 3 --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint "127.0.0.1:$P" "$DUMP")
    "$GPURUN" --device cpu "${args[@]}" > "$TMP/a.log" 2>&1 &
    a=$!
    hosting "$P"
    "$GPURUN" --device cpu --node-rank 1 "${args[@]}" > "$TMP/b.log" 2>&1 &
    b=$!
    wait_line "$TMP/b.log" "joined node 0's store"
    "$GPURUN" --device cpu "${args[@]}" > "$TMP/c.log" 2>&1 || fail "the third gpurun exited $?"
    wait "$b" || fail "the node given --node-rank 1 exited $?"
    wait "$a" || fail "node 0 exited $?"
    grep -q "joined as node 2 (join order)" "$TMP/c.log" || fail "the third node did not take rank 2"
    worlds 3 0 1 2
    ;;
  node_left)
    P=$(port)
    args=(--nnodes 3 --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint "127.0.0.1:$P" "$DUMP")
    "$GPURUN" --device cpu "${args[@]}" > "$TMP/a.log" 2>&1 &
    a=$!
    hosting "$P"
    "$GPURUN" --device cpu "${args[@]}" > "$TMP/b.log" 2>&1 &
    b=$!
    wait_line "$TMP/b.log" "joined as node 1"
    kill -INT "$b"
    wait "$b" || true
    wait_line "$TMP/a.log" "left before the start"
    "$GPURUN" --device cpu "${args[@]}" > "$TMP/c.log" 2>&1 &
    c=$!
    wait_line "$TMP/c.log" "joined node 0's store"
    "$GPURUN" --device cpu "${args[@]}" > "$TMP/d.log" 2>&1 || fail "the fourth gpurun exited $?"
    wait "$c" || fail "the third gpurun exited $?"
    wait "$a" || fail "node 0 exited $?"
    grep -q "joined as node 1 (join order)" "$TMP/c.log" || fail "the replacement did not take rank 1"
    worlds 3 0 1 2
    ;;
  stale_job)
    P=$(port)
    "$GPURUN" --device cpu --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d \
      --rdzv-endpoint "127.0.0.1:$P" --rdzv-id jobA --join-timeout 20 "$DUMP" > "$TMP/a.log" 2>&1 &
    a=$!
    hosting "$P"
    rc=0
    "$GPURUN" --device cpu --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d \
      --rdzv-endpoint "127.0.0.1:$P" --rdzv-id jobB "$DUMP" > "$TMP/b.log" 2>&1 || rc=$?
    [[ $rc == 1 ]] || fail "the joiner of another job exited $rc, not 1"
    grep -q "runs job 'jobA', this node was started for 'jobB' (--rdzv-id): not joining it" \
      "$TMP/b.log" || fail "the joiner does not name both jobs"
    kill -TERM "$a"
    wait "$a" || true
    ;;
  same_instant)
    P=$(port)
    args=(--nnodes 3 --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint "127.0.0.1:$P" "$DUMP")
    for i in 1 2 3; do "$GPURUN" --device cpu "${args[@]}" > "$TMP/n$i.log" 2>&1 & done
    for j in $(jobs -p); do wait "$j" || fail "a gpurun exited $?"; done
    worlds 6 0 1 2 3 4 5
    ;;
  late_node)
    P=$(port)
    args=(--nnodes 1:2 --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint "127.0.0.1:$P"
          --rdzv-conf last_call_timeout=0)
    mkfifo "$TMP/go"  # node 0's worker runs until the test writes a line to it
    "$GPURUN" --device cpu "${args[@]}" sh -c 'touch "$OUT_DIR/up"; read -r _ < "$OUT_DIR/go"' \
      > "$TMP/a.log" 2>&1 &
    a=$!
    wait_for 10 "node 0's worker to start ($TMP/up)" test -f "$TMP/up"
    rc=0
    "$GPURUN" --device cpu "${args[@]}" /bin/true > "$TMP/b.log" 2>&1 || rc=$?
    [[ $rc == 1 ]] || fail "the late node exited $rc, not 1"
    grep -q "node 0 closed the rendezvous with 1 node before this node (1) joined" "$TMP/b.log" ||
      fail "the late node does not say why it was refused"
    exec 3<> "$TMP/go"  # read-write: never blocks, even with no reader left
    echo go >&3
    wait "$a" || fail "node 0 exited $?"
    ;;
  module)
    mkdir -p "$TMP/pkg"
    : > "$TMP/pkg/__init__.py"
    printf 'import os\nopen(os.path.join(os.environ["OUT_DIR"], "env." + os.environ["RANK"]), "w").write("".join(f"{k}={v}\\n" for k, v in os.environ.items()))\n' > "$TMP/pkg/mod.py"
    (cd "$TMP" && PET_NPROC_PER_NODE=2 PYTHON_EXEC=/usr/bin/python3 PYTHON=/nonexistent/python \
      run --master-port 0 -m pkg.mod)  # torchrun's PYTHON_EXEC wins
    [[ -f $TMP/env.0 && -f $TMP/env.1 && $(val 1 LOCAL_WORLD_SIZE) == 2 ]] || fail "the module did not run twice"
    ;;
  no_python)
    cp "$DUMP" "$TMP/dump.py"  # a shell script whose name ends in .py: run as a program
    run --master-port 0 --nproc-per-node 2 --no-python "$TMP/dump.py"
    [[ -f $TMP/env.1 ]] || fail "the program did not run"
    ;;
  local_ranks_filter)
    run --master-port 0 --nproc_per_node=2 --local-ranks-filter 1 "$DUMP"
    grep -q "stdout of rank 1" "$TMP/out.log" || fail "local rank 1 is not on the console"
    ! grep -q "of rank 0" "$TMP/out.log" "$TMP/err.log" || fail "local rank 0 is on the console"
    ;;
  redirects_tee)
    run --master-port 0 --nproc-per-node 2 -r 1 -t 2 --log-dir "$TMP/logs" --rdzv-id job9 "$DUMP"
    ! grep -q "stdout of rank" "$TMP/out.log" || fail "redirected stdout reached the console"
    grep -q "stderr of rank 1" "$TMP/err.log" || fail "tee'd stderr is not on the console"
    out=$(find "$TMP/logs" -path '*job9*/attempt_0/1/stdout.log')
    [[ -n $out ]] && grep -q "stdout of rank 1" "$out" || fail "no stdout.log with rank 1's line under $TMP/logs"
    ;;
  health_check)
    P=$(port)
    get() { /usr/bin/python3 - "$P" <<'PY'
import sys, urllib.request, urllib.error
try:
    r = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/health", timeout=5)
    print(r.status, r.read().decode().strip())
except urllib.error.HTTPError as e:
    print(e.code, e.read().decode().strip())
except OSError as e:
    print("down", e)
PY
    }
    TORCHELASTIC_HEALTH_CHECK_PORT=$P "$GPURUN" --device cpu --master-port 0 --nproc-per-node 2 --grace-period 10 \
      sh -c 'trap "sleep 2; exit 0" TERM; touch "$OUT_DIR/up.$RANK"; while :; do sleep 0.1; done' \
      > "$TMP/out.log" 2> "$TMP/err.log" &
    g=$!
    wait_for 10 "both workers to start ($TMP/up.0, up.1)" test -f "$TMP/up.0" -a -f "$TMP/up.1"
    a=$(get)
    [[ $a == "200 "*'"alive": true'*'"state": "running"'*'"workers": 2'* ]] || fail "while running: $a"
    # /metrics on the same port: Prometheus' text (docs/metrics.md), a plain run's world size
    m=$(/usr/bin/python3 -c 'import sys, urllib.request
r = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=5)
print(r.status, r.headers["Content-Type"]); print(r.read().decode())' "$P")
    [[ $m == "200 text/plain; version=0.0.4; charset=utf-8"* ]] || fail "/metrics: $m"
    grep -q '^gpurun_world_size{job="none"} 2$' <<< "$m" || fail "/metrics has no world size 2: $m"
    grep -q '^gpurun_slot_state{job="none",slot="1",node="0",Hostname="[^"]*",state="active"} 1$' \
      <<< "$m" || fail "/metrics has no active slot 1: $m"
    kill -TERM "$g"
    stopping() { b=$(get); [[ $b == "503 "*'"state": "stopping"'* ]]; }  # the workers take 2 s
    wait_for 2 "503 and state stopping from $P/health after SIGTERM" stopping
    wait "$g" || true
    c=$(get)
    [[ $c == down* ]] || fail "after the exit: $c"
    grep -q "health check: http://127.0.0.1:$P/" "$TMP/err.log" || fail "no health check line"
    ;;
  *) fail "unknown case" ;;
esac
echo "torchrun_cli_$CASE: OK"
