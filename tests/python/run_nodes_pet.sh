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
pod1=$!
wait_event '"event": "decision".*"active": \[0,1,1000,1001\]'
grep -q "node 1 (.*) joined the job: slots \[1000, 1001\]" "$LOG" || fail "node 0 did not say node 1 joined"
grep -q "node 1: joined node 0's elastic job 'pet-job'" "$TMP/pod1.log" \
  || fail "the second pod did not join as node 1: $(tail -5 "$TMP/pod1.log")"
wait_running 60 "an epoch at world 4" grep -qs '"world": 4' $TMP/out/log.*
touch "$TMP/out/fast"
rc=0
wait "$pid" || rc=$?
pid=
((rc == 0)) || fail "pod 0's gpurun exited $rc"
rc=0
wait "$pod1" || rc=$?
((rc == 0)) || fail "pod 1's gpurun exited $rc: $(tail -5 "$TMP/pod1.log")"
"$PY" - "$TMP/out" <<'PY' || fail "the checks above"
import collections, glob, json, sys
by = collections.defaultdict(list)
for f in glob.glob(sys.argv[1] + "/log.*"):
    for l in open(f):
        j = json.loads(l)
        if "seen" in j:
            by[j["epoch"]].append(j)
assert sorted(by) == list(range(40)), f"epochs trained: {sorted(by)}"
worlds = []
for e in range(40):
    ls = by[e]
    assert sorted(i for l in ls for i in l["seen"]) == list(range(240)), f"epoch {e}: samples"
    assert len({l["start_checksum"] for l in ls}) == 1, f"epoch {e}: different start states"
    worlds.append(ls[0]["world"])
assert 4 in worlds and worlds[0] == 2, f"worlds {worlds}"
print("worlds:", worlds)
PY
echo "$TEST: OK"
