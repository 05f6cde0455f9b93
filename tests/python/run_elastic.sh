#!/usr/bin/env bash
# ctest python_elastic_<mode>: tests/python/elastic_train.py (the gpurun Python package) under
# gpurun --config with Debian's torch 1.13, 3 CPU slots: [0,1,2] -> shrink to [0] -> grow to
# [0,2] -> pause [] -> resume [1,2] -> [1] in the other park mode (hold <-> release: a leaver
# follows the decision's mode), edited while it trains. Asserts: every epoch trains each
# of the 240 samples exactly once over all ranks; the state checksum at the start of each epoch
# is equal on every rank; the world sizes follow the edits; gpurun exits 0.
# Each edit waits for a state the test observes (an epoch done, a decision, in release mode the
# pause's standbys' mapped snapshot), and the job is long enough (EPOCHS at 0.3 s each) that the
# last edit lands before it ends on any machine; once its decision is seen, OUT/fast makes the
# remaining epochs go by without their sleep.
# Usage: run_elastic.sh GPURUN release|hold
MODE=${2:-release}
TEST=python_elastic_$MODE
source "$(dirname "$0")/common.sh"
mkdir -p "$TMP/out"
conf() { printf 'active_gpus = %s\n[park]\nmode = "%s"\n' "$1" "${2:-$MODE}" > "$TMP/config.toml.new"
         mv "$TMP/config.toml.new" "$TMP/config.toml"; }
# Epochs finished so far (rank 0's lines; any slot can be rank 0).
# awk, not python: this runs every 0.1 s, and a python3 start is ~40 ms of CPU each time.
done_epochs() { cat "$TMP"/out/log.* 2>/dev/null | awk -F'[:,]' '
/^\{"epoch": [0-9]+, "rank": 0,/ { if ($2 + 1 > n) n = $2 + 1 } END { print n + 0 }'; }
reached() { (( $(done_epochs) >= $1 )); }
wait_epochs() { wait_running 60 "epoch $1" reached "$1"; }

# Hold mode reads the batches with 2 DataLoader worker processes per rank (rt.loader's
# num_workers), release mode in the training process.
export WORKERS=$([[ $MODE == hold ]] && echo 2 || echo 0)
EPOCHS=40
conf "[0, 1, 2]"
"$GPURUN" --master-port 0 --nproc 3 --device cpu --config "$TMP/config.toml" --event-log "$TMP/events.jsonl" \
  "$PY" "$HERE/elastic_train.py" "$TMP/out" "$EPOCHS" 0.3 > "$LOG" 2>&1 &
pid=$!
wait_epochs 2;  conf "[0]"
wait_event '"active": \[0\],'
wait_epochs 5;  conf "[0, 2]"
wait_event '"active": \[0,2\]'
wait_epochs 7;  conf "[]"
wait_event '"active": \[\]'
if [[ $MODE == release ]]; then
  # The pause's leavers' standbys map the snapshot ahead of the go (asserted below): resume once
  # one said so, not after a guessed delay (their start-up is a Python and torch import).
  wait_line 'standby: snapshot mapped ahead of the go'
else
  sleep 1
fi
conf "[1, 2]"
wait_event '"active": \[1,2\]'
# The park mode of a leaver is the decision's: the other mode for the last shrink.
OTHER=$([[ $MODE == hold ]] && echo release || echo hold)
wait_epochs 14; conf "[1]" "$OTHER"
wait_event '"active": \[1\],'
touch "$TMP/out/fast"  # the last edit is decided: the remaining epochs need no pace
wait "$pid" || fail "gpurun exited $?"
WANT=$([[ $OTHER == hold ]] && echo 'parked \(hold mode\)' || echo 'released')
grep -Eq "\"gpu\": 2,[^}]*\"reason\": \"$WANT" "$TMP/events.jsonl" || fail "gpu 2 did not leave in $OTHER mode"

"$PY" - "$TMP/out" "$EPOCHS" <<'PY' || fail "the checks above"
import collections, glob, json, os, sys
EPOCHS = int(sys.argv[2])
lines = [json.loads(l) for f in glob.glob(sys.argv[1] + "/log.*") for l in open(f)]
by_epoch = collections.defaultdict(list)
for l in lines:
    by_epoch[l["epoch"]].append(l)
assert sorted(by_epoch) == list(range(EPOCHS)), f"epochs trained: {sorted(by_epoch)}"
worlds = []
for e in range(EPOCHS):
    ls = by_epoch[e]
    seen = sorted(i for l in ls for i in l["seen"])
    assert seen == list(range(240)), f"epoch {e}: {len(seen)} samples, {len(set(seen))} distinct"
    sums = {l["start_checksum"] for l in ls}
    assert len(sums) == 1, f"epoch {e}: ranks start from different states {sums}"
    assert len(ls) == ls[0]["world"], f"epoch {e}: {len(ls)} ranks logged, world {ls[0]['world']}"
    worlds.append(ls[0]["world"])
    print(f"epoch {e:2d} world {ls[0]['world']} generation {ls[0]['generation']} "
          f"loss {[l['loss'] for l in ls if l['rank'] == 0][0]:.6f}")
# The edits: 3 ranks, then 1, then 2, then (after the pause) 2 on other slots, then 1.
assert worlds[0] == 3 and 1 in worlds and 2 in worlds and worlds[-1] == 1, worlds
print("worlds", worlds)
# Per-slot RNG streams: each slot's torch and Python RNG state at the start of an epoch is the
# one it ended its previous epoch with, also across a leave and a rejoin or a pause and a
# resume in a new process (release mode); a rank's own draws differ from the others'.
by_slot = collections.defaultdict(list)
for f in glob.glob(sys.argv[1] + "/log.*"):
    slot = int(f.rsplit("/", 1)[1].split(".")[1])
    by_slot[slot] += [json.loads(l) for l in open(f)]
rejoined = 0
for slot, ls in sorted(by_slot.items()):
    ls.sort(key=lambda l: l["epoch"])
    for a, b in zip(ls, ls[1:]):
        rejoined += a["pid"] != b["pid"]
        assert b["rng_start"] == a["rng_end"], (
            f"slot {slot}: epoch {b['epoch']} (pid {b['pid']}) starts from another RNG state "
            f"than epoch {a['epoch']} (pid {a['pid']}) ended with")
assert rejoined >= 1 or all(len({l["pid"] for l in ls}) == 1 for ls in by_slot.values())
print(f"RNG streams continue per slot ({rejoined} rejoins in a new process)")
for e in range(EPOCHS):
    draws = [l["rng"] for l in by_epoch[e]]
    assert len(set(draws)) == len(draws), f"epoch {e}: ranks drew the same {draws}"
workers = int(os.environ["WORKERS"])
for l in lines:  # who read the samples: worker processes, or the rank itself
    if workers:
        assert l["pid"] not in l["readers"] and 1 <= len(l["readers"]) <= workers, l["readers"]
    else:
        assert l["readers"] == [l["pid"]], l["readers"]
print(f"samples read by {'%d DataLoader workers' % workers if workers else 'the ranks'}")
PY
grep -q '"state_source": -1' "$TMP/events.jsonl" || fail "no resume from the pause snapshot"
# Every resize's timing record arrived from each participant (docs/control-protocol.md#resize-timings).
"$PY" - "$TMP/events.jsonl" <<'PY' || fail "incomplete resize events"
import json, sys
ev = [json.loads(l) for l in open(sys.argv[1])]
rs = [e for e in ev if e["event"] == "resize"]
assert len(rs) >= 5, f"{len(rs)} resize events"
for e in rs:
    assert e["complete"] and not e["missing"], f"{e['kind']} {e['from']} -> {e['to']}: missing {e['missing']}"
    print(f"resize {e['kind']} {e['from']} -> {e['to']}: {e['total_ms']:.0f} ms, phases {e['phases_ms']}")
PY
if [[ $MODE == release ]]; then
  # [park] standby (default on): the shrink's release leavers got standbys, and the grow and the
  # resume told them to go (no process spawned for those slots then).
  grep -q '"to": "STANDBY"' "$TMP/events.jsonl" || fail "no standby started after the shrink"
  grep -q 'standby told to go' "$LOG" || fail "no standby was told to go"
  grep -q '"from": "STANDBY", "to": "WARMING"' "$TMP/events.jsonl" || fail "no STANDBY -> WARMING"
  # The pause's leavers' standbys (started once the snapshot was written) mapped it ahead of the go.
  grep -q 'standby: snapshot mapped ahead of the go' "$LOG" || fail "no standby mapped the snapshot ahead"
fi
echo "python_elastic_$MODE: OK"
