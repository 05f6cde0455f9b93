#!/usr/bin/env bash
# ctest python_example_gpud: examples/python/gpud_fmnist.py (issue 43's first evidence item: a
# gpud program, `@elastic_scheduler(config_path="config.toml")` on
# train_one_epoch(model, dataset, optimizer, criterion, epoch, device), its own `while True:`
# loop, tqdm on rank 0, validation on rank 0 every epoch) on 2 CPU slots under gpurun --config,
# config.toml edited while it trains: [0, 1] -> [0] -> [0, 1] -> [1]. Asserts: only the import
# differs from its torchrun form; the worlds follow the edits; after [1] the survivor (slot 1)
# reads RANK=0 WORLD_SIZE=1 from os.environ and its console prefix is [rank0 gpu1]; the tqdm bar shows
# % and an ETA; one validation line per epoch, each by the rank 0 of its generation; exit 0.
# Usage: run_gpud_example.sh GPURUN
TEST=python_example_gpud
source "$(dirname "$0")/common.sh"
EX=$HERE/../../examples/python/gpud_fmnist.py
EPOCHS=14
more_than() { (( $(grep -Ec "$1" "$LOG" 2>/dev/null || true) > $2 )); }  # PATTERN N
wait_count() { wait_running 90 "line $(($2 + 1)) matching '$1'" more_than "$1" "$2"; }  # PATTERN N
conf() { printf 'active_gpus = %s\n' "$1" > "$TMP/config.toml.new"; mv "$TMP/config.toml.new" "$TMP/config.toml"; }

# The torchrun form (gpud's import) differs from the example by the import line only.
changed=$(sed 's/^from gpurun import elastic_scheduler$/from gpud import elastic_scheduler/' "$EX" |
          diff - "$EX" | grep -c '^[<>]' || true)
[[ $changed == 2 ]] || fail "the torchrun form differs in $((changed / 2)) lines, not 1"

conf "[0, 1]"
cd "$TMP"  # where config.toml is: the decorator's config_path is gpurun's --config
PYTHONPATH=$HERE/../../worker_runtime/python \
  "$GPURUN" --master-port 0 --nproc 2 --device cpu --config "$TMP/config.toml" \
  --event-log "$TMP/events.jsonl" "$PY" "$EX" --epochs $EPOCHS --limit 3000 --limit-val 1000 \
  > "$LOG" 2>&1 &
pid=$!
wait_line "^\[rank0\]: epoch 0 RANK=0 WORLD_SIZE=2: validation"; conf "[0]"
wait_event '"active": \[0\],'
wait_line "WORLD_SIZE=1: validation"; conf "[0, 1]"
wait_event '"active": \[0,1\],'
# an epoch trained by the grown world, then the last shrink: slot 1 becomes rank 0
wait_count "WORLD_SIZE=2: validation" "$(grep -c "WORLD_SIZE=2: validation" "$LOG")"; conf "[1]"
wait_event '"active": \[1\],'
wait "$pid" || fail "gpurun exited $?"
grep "config_path" "$LOG" && fail "config_path config.toml in $TMP was not taken as gpurun's --config"

# The survivor's lines after [1]: slot 1's (its generation-1 rank 0 prints them).
tr '\r' '\n' < "$LOG" > "$TMP/lines"
last_gen=$(grep '"kind": "resize"' "$TMP/events.jsonl" | tail -1 | sed 's/.*"generation": \([0-9]*\),.*/\1/')
after=$(grep -E "RANK=[0-9]+ WORLD_SIZE=1" "$TMP/lines" | tail -3)
echo "$after"
grep -Eq "epoch $((EPOCHS - 1)) RANK=0 WORLD_SIZE=1: validation" <<< "$after" ||
  fail "the last epoch was not validated by RANK=0 WORLD_SIZE=1"
# Slot 1's own epoch lines (its pid) after the last shrink say RANK=0 WORLD_SIZE=1.
spid=$(grep -E "pid [0-9]+: " "$TMP/lines" | tail -1 | sed 's/.* pid \([0-9]*\):.*/\1/')
grep -q "\"gpu\": 1.*\"pid\": $spid\|\"pid\": $spid.*\"gpu\": 1" "$TMP/events.jsonl" ||
  fail "the last epoch's process (pid $spid) is not slot 1's"
grep -E "epoch $((EPOCHS - 1)) RANK=0 WORLD_SIZE=1 pid $spid: " "$TMP/lines" ||
  fail "slot 1 (pid $spid) does not read RANK=0 WORLD_SIZE=1 from os.environ after [1]"
# The console prefix of the survivor's lines says rank 0, on slot 1 (issue 43 item 3).
grep -E "^\[rank0 gpu1\]: epoch $((EPOCHS - 1)) RANK=0 WORLD_SIZE=1 pid $spid: " "$TMP/lines" ||
  fail "the survivor's console prefix does not say [rank0 gpu1]"
# tqdm's bar (rank 0, len() of the elastic loader): a percentage and an ETA
grep -Eq '[0-9]+%\|[^|]*\| *[0-9]+/[0-9]+ \[[0-9:]+<[0-9:]+' "$TMP/lines" ||
  fail "no tqdm bar with % and ETA"
"$PY" - "$TMP/lines" "$EPOCHS" <<'PY' || fail "the checks above"
import re, sys
lines = open(sys.argv[1]).read().splitlines()
epochs = int(sys.argv[2])
val = [re.search(r"epoch (\d+) RANK=(\d+) WORLD_SIZE=(\d+): validation", l) for l in lines]
val = [(int(m[1]), int(m[2]), int(m[3])) for m in val if m]
assert [v[0] for v in val] == list(range(epochs)), f"validated epochs: {[v[0] for v in val]}"
assert all(r == 0 for _, r, _ in val), val
worlds = [w for _, _, w in val]
changes = [w for i, w in enumerate(worlds) if i == 0 or w != worlds[i - 1]]
assert changes == [2, 1, 2, 1], f"worlds per epoch {worlds}"
print("one validation per epoch by rank 0; worlds per epoch", worlds)
trained = [re.search(r"epoch (\d+) RANK=(\d+) WORLD_SIZE=(\d+) pid \d+: (\d+) samples", l)
           for l in lines]
trained = [(int(m[1]), int(m[3]), int(m[4])) for m in trained if m]
for e in range(epochs):  # each epoch's samples over its ranks: the whole subset once
    got = [t for t in trained if t[0] == e]
    assert len(got) == got[0][1] and sum(t[2] for t in got) == 3000, (e, got)
PY
echo "$TEST: OK"
