# shellcheck shell=bash disable=SC2034  # sourced; the variables are the caller's
# Sourced by the elastic-node tests (issue 46: tests/python/run_nodes*.sh; docs/cli.md#elastic-nodes)
# after common.sh: one elastic job (--config) over several gpurun processes ("nodes") on
# loopback, each node 2 CPU slots (--device cpu, gloo). Node 0 is `--master-port 0 --nnodes
# $NNODES --node-rank 0` (its port read from its "node 0's store listens on port N" line); node
# k > 0 is `--nnodes $NNODES --node-rank k --master-addr 127.0.0.1 --master-port $PORT` with its
# own config $TMP/ck.toml, and its local slot i is job slot k*1000+i.
# The script sets before use: TRAIN (array: the program every node runs and its arguments),
# EPOCHS; it may set NNODES (default 1:3) and NODE_CONFIG (what start_node writes in a node's
# config; default "active_gpus = [0, 1]").
# State: pid (node 0's gpurun; common.sh's wait_running watches it), npid[K] (node K's),
# also_stop (array: other gpuruns the script started). Defines
#   stop_all              SIGKILL to each of those that still runs (its workers go with it);
#                         run at exit, with common.sh's removal of $TMP
#   fail MSG              "$TEST: FAIL: MSG", the last 30 lines of every $TMP/*.log, node 0's
#                         last 8 decisions; stop_all; exit 1
#   conf K LIST           $TMP/cK.toml := "active_gpus = LIST", renamed into place (a running
#                         gpurun re-reads it)
#   node0 CONFIG LOG EVENTS [PROGRAM...]  node 0's gpurun in the background (default TRAIN)
#   node0_port            waits for node 0's store line in $LOG, sets PORT
#   start_node K          node K's gpurun (config NODE_CONFIG, log $TMP/nodeK.log, event log
#                         $TMP/eventsK.jsonl) into npid[K]
#   wait_node_exit K SECONDS [training]   node K's gpurun ends within SECONDS with status 0
#                         (WANT_RC=N: N);
#                         with "training", while node 0 still runs and after node 0's release
#   kill_node K           SIGKILL to node K's gpurun; its workers must be gone within 10 s
#   wait_nodes_end        node 0's gpurun exits 0, then every node still started within 30 s
#   epoch_now / wait_epoch E / wait_world E W   (decorated_train.py's step logs in $TMP/out)
#                         the highest epoch of a step; a step of epoch >= E; one at world W
#   wait_decision PATTERN a decision of node 0's event log ($TMP/events.jsonl) matching it
#   note MSG              "$TEST: MSG (after N s, <progress>)"; progress: epoch of EPOCHS
#   check_nodes ARGS...   runs the Python check script on stdin with ARGS (PYTHONPATH: this
#                         folder, for nodes_check.py); fail when it fails
NNODES=${NNODES:-1:3}
NODE_CONFIG=${NODE_CONFIG:-active_gpus = [0, 1]}
declare -A npid
pid=
also_stop=()

stop_all() {
  local p
  for p in ${pid:-} "${npid[@]}" "${also_stop[@]}"; do
    [[ -n $p && $p -gt 1 ]] && kill -9 "$p" 2> /dev/null
  done
  return 0
}
trap 'stop_all; [[ -n ${KEEP_TMP:-} ]] || rm -rf "$TMP"' EXIT
[[ -z ${KEEP_TMP:-} ]] || echo "$TEST: its files stay in $TMP (KEEP_TMP)"
fail() {
  echo "$TEST: FAIL: $*" >&2
  local f
  for f in "$TMP"/*.log; do
    [[ -f $f ]] || continue
    echo "-- the last 30 lines of $(basename "$f"):" >&2
    tr '\r' '\n' < "$f" | tail -30 >&2
  done
  if [[ -f $TMP/events.jsonl ]]; then
    echo "-- node 0's decisions ($TMP/events.jsonl):" >&2
    grep '"event": "decision"' "$TMP/events.jsonl" | tail -8 >&2
  fi
  stop_all
  exit 1
}

conf() { printf 'active_gpus = %s\n' "$2" > "$TMP/c$1.toml.new"; mv "$TMP/c$1.toml.new" "$TMP/c$1.toml"; }
node0() {
  local config=$1 log=$2 events=$3
  shift 3
  (($#)) || set -- "${TRAIN[@]}"
  "$GPURUN" --master-port 0 --nnodes "$NNODES" --node-rank 0 --device cpu --nproc 2 --config "$config" \
    --event-log "$events" "$@" > "$log" 2>&1 &
}
node0_port() {
  wait_line "node 0's store listens on port [0-9]+"
  PORT=$(sed -nE "s/.*node 0's store listens on port ([0-9]+).*/\1/p" "$LOG" | head -1)
}
start_node() {
  printf '%s\n' "$NODE_CONFIG" > "$TMP/c$1.toml.new"
  mv "$TMP/c$1.toml.new" "$TMP/c$1.toml"
  "$GPURUN" --nnodes "$NNODES" --node-rank "$1" --master-addr 127.0.0.1 --master-port "$PORT" \
    --device cpu --nproc 2 --config "$TMP/c$1.toml" --event-log "$TMP/events$1.jsonl" \
    "${TRAIN[@]}" > "$TMP/node$1.log" 2>&1 &
  npid[$1]=$!
}
wait_node_exit() {
  local p=${npid[$1]} rc=0 i
  for ((i = 0; i < $2 * 5; i++)); do kill -0 "$p" 2> /dev/null || break; sleep 0.2; done
  kill -0 "$p" 2> /dev/null && fail "node $1's gpurun (pid $p) still runs after $2 s"
  wait "$p" || rc=$?
  unset "npid[$1]"
  ((rc == ${WANT_RC:-0})) || fail "node $1's gpurun exited $rc (expected ${WANT_RC:-0})"
  if [[ ${3:-} == training ]]; then
    kill -0 "$pid" 2> /dev/null || fail "node $1's gpurun exited only once node 0's job ended"
    grep -q "node $1: node 0 released this node" "$TMP/node$1.log" \
      || fail "node $1's gpurun exited without node 0's release"
  fi
  return 0
}
kill_node() {
  local p=${npid[$1]} kids w i
  kids=$(cat /proc/"$p"/task/*/children 2> /dev/null)
  [[ -n $kids ]] || fail "node $1's gpurun (pid $p) has no worker process"
  kill -9 "$p"
  wait "$p" 2> /dev/null || true
  unset "npid[$1]"
  for w in $kids; do
    for ((i = 0; i < 50; i++)); do kill -0 "$w" 2> /dev/null || break; sleep 0.2; done
    kill -0 "$w" 2> /dev/null && fail "node $1's worker pid $w outlived its gpurun's SIGKILL by 10 s"
  done
  return 0
}
wait_nodes_end() {
  local rc=0 k
  wait "$pid" || rc=$?
  pid=
  ((rc == 0)) || fail "node 0's gpurun exited $rc"
  for k in "${!npid[@]}"; do wait_node_exit "$k" 30; done
}

# The highest epoch any rank has taken a step in (-1: none yet). awk, not python (every 0.2 s).
epoch_now() { cat "$TMP"/out/steps.* 2> /dev/null | awk -F'[:,]' '
BEGIN { n = -1 } /^\{"epoch": [0-9]+,/ { if ($2 + 0 > n) n = $2 + 0 } END { print n }'; }
in_epoch() { (($(epoch_now) >= $1)); }
wait_epoch() { wait_running 60 "a step of epoch $1" in_epoch "$1"; }
# A step of epoch >= $1 at world $2 (a world the job reached after epoch $1 began).
world_since() { cat "$TMP"/out/steps.* 2> /dev/null | awk -F'[:,]' -v e="$1" -v w="\"world\": $2," '
/^\{"epoch": [0-9]+,/ && $2 + 0 >= e && index($0, w) { found = 1 } END { exit !found }'; }
wait_world() { wait_running 60 "world $2 from epoch $1 on" world_since "$1" "$2"; }
decided() { grep -qs "\"event\": \"decision\".*$1" "$TMP/events.jsonl"; }
wait_decision() { wait_running 60 "a decision with $1" decided "$1"; }
progress() { echo "epoch $(epoch_now) of $EPOCHS"; }
note() { echo "$TEST: $* (after ${SECONDS} s, $(progress))"; }

check_nodes() { PYTHONPATH=$HERE "$PY" - "$@" || fail "the checks above"; }
