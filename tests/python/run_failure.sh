#!/usr/bin/env bash
# ctest python_elastic_failure: the decorator form (tests/python/decorated_train.py) on 3 CPU
# slots; slot 1 crashes (exit 1) before step 3 of epoch 2. The other two must report at once,
# be told to go on without it, run the rest of epoch 2 again over two ranks and finish: each
# sample trained exactly once in every epoch (the crashed rank's completed steps included),
# equal state checksums at every epoch start, gpurun's decision names slot 1 as failed.
# ctest python_elastic_failure_loop (ARGS loop): the same with decorated_train.py's loop form
# (FORM=loop): the survivors' all-reduce fails inside the program's own backward(); the runtime
# recovers at the loader's next step (docs/python.md#failures).
# ctest python_elastic_failure_after_update (ARGS after_update): the decorator form whose function
# all-reduces its loss after opt.step() (DIE_AFTER_UPDATE=1); slot 1 dies after step 3's update,
# before that all-reduce: the survivors' all-reduce fails after their update, so step 3 counts
# once and the function's next call starts at step 4 (a step trained twice: 264 samples).
# Usage: run_failure.sh GPURUN [loop|after_update]
TEST=python_elastic_failure${2:+_$2}
[[ ${2:-} != loop ]] || export FORM=loop
[[ ${2:-} != after_update ]] || export DIE_AFTER_UPDATE=1
source "$(dirname "$0")/common.sh"
mkdir -p "$TMP/out"
printf 'active_gpus = [0, 1, 2]\n' > "$TMP/config.toml"
rc=0
DIE_SLOT=1 DIE_EPOCH=2 DIE_STEP=3 GPURUN_COMM_TIMEOUT_MS=20000 timeout 240 \
  "$GPURUN" --master-port 0 --nproc 3 --device cpu --config "$TMP/config.toml" --event-log "$TMP/events.jsonl" \
  "$PY" "$HERE/decorated_train.py" "$TMP/out" 5 > "$LOG" 2>&1 || rc=$?
echo "$TEST: gpurun exited $rc"
grep -q '"failed": \[1\]' "$TMP/events.jsonl" || fail "no decision without the failed slot 1"
[[ $(grep -c 'decorated_train slot .: done, world 2' "$LOG") == 2 ]] \
  || fail "slots 0 and 2 did not both finish with world 2"
"$PY" - "$TMP/out" <<'PY' || fail "the checks above"
import collections, glob, json, sys
steps = [json.loads(l) for f in glob.glob(sys.argv[1] + "/steps.*") for l in open(f)]
starts = [json.loads(l) for f in glob.glob(sys.argv[1] + "/epochs.*") for l in open(f)]
for e in range(5):
    seen = sorted(i for s in steps if s["epoch"] == e for i in s["seen"])
    assert seen == list(range(240)), f"epoch {e}: {len(seen)} samples, {len(set(seen))} distinct"
    sums = {s["checksum"] for s in starts if s["epoch"] == e}
    assert len(sums) == 1, f"epoch {e}: ranks start from different states {sums}"
    worlds = sorted({s["world"] for s in steps if s["epoch"] == e})
    print(f"epoch {e}: 240 samples once, worlds {worlds}")
PY
echo "$TEST: OK"
