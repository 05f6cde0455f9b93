#!/usr/bin/env bash
# ctest python_nodes_pet: Kubernetes' conventions (docs/kubernetes.md), with no cluster: the
# environment is the interface. Two gpurun processes get only Kubeflow v1's elastic PyTorchJob
# variables (PET_NNODES=1:3, PET_RDZV_BACKEND=c10d, PET_RDZV_ENDPOINT, PET_RDZV_ID and its
# PET_N_PROC_PER_NODE spelling) and the same command line, `gpurun --device cpu --config FILE
# python3 elastic_train.py …`; the second "pod" starts while the first trains. Asserts: the
# first hosts the store (node 0), the second joins it as node 1 and its slots 1000, 1001 enter
# at a boundary (world 4), every epoch trains each sample once from one state checksum, and
# both exit 0.
TEST=python_nodes_pet
source "$(dirname "$0")/common.sh"
source "$HERE/nodes_lib.sh"
mkdir -p "$TMP/out"
PORT=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
export PET_NNODES=1:3 PET_RDZV_BACKEND=c10d PET_RDZV_ENDPOINT=127.0.0.1:$PORT PET_RDZV_ID=pet-job
export PET_N_PROC_PER_NODE=2
printf 'active_gpus = [0, 1]\n' > "$TMP/c0.toml"
printf 'active_gpus = [0, 1]\n' > "$TMP/c1.toml"
pod() {  # pod K: the same line in each pod, its own config file
  "$GPURUN" --device cpu --config "$TMP/c$1.toml" --event-log "$TMP/events$1.jsonl" \
    "$PY" "$HERE/elastic_train.py" "$TMP/out" 40 0.4 > "$TMP/pod$1.log" 2>&1 &
}
pod 0
pid=$!
LOG=$TMP/pod0.log
cp /dev/null "$TMP/events.jsonl"  # fail() shows node 0's events
ln -sf "$TMP/events0.jsonl" "$TMP/events.jsonl"
done_epochs() { cat "$TMP"/out/log.* 2> /dev/null | awk -F'[:,]' '
/^\{"epoch": [0-9]+, "rank": 0,/ { if ($2 + 1 > n) n = $2 + 1 } END { print n + 0 }'; }
reached() { (($(done_epochs) >= $1)); }
wait_running 60 "epoch 1" reached 1
pod 1
npid[1]=$!
wait_event '"event": "decision".*"active": \[0,1,1000,1001\]'
grep -q "node 1 (.*) joined the job: slots \[1000, 1001\]" "$LOG" || fail "node 0 did not say node 1 joined"
grep -q "node 1: joined node 0's elastic job 'pet-job'" "$TMP/pod1.log" \
  || fail "the second pod did not join as node 1: $(tail -5 "$TMP/pod1.log")"
wait_running 60 "an epoch at world 4" grep -qs '"world": 4' $TMP/out/log.*
touch "$TMP/out/fast"
wait_nodes_end  # pod 0 is node 0; pod 1 is npid[1]
check_nodes "$TMP/out" <<'PY'
import sys
import nodes_check as nc
logs = [l for l in nc.read(sys.argv[1], "log") if "seen" in l]
worlds = nc.exactly_once(logs, logs, 40, checksum="start_checksum")
assert 4 in worlds and worlds[0] == 2, f"worlds {worlds}"
print("worlds:", worlds)
PY
echo "$TEST: OK"
