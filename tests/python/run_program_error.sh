#!/usr/bin/env bash
# ctest python_program_error (issue 25 item 9): the decorator form on 3 CPU slots; slot 1's
# train_one_epoch raises ValueError at epoch 2. A program's own exception is a failure of the
# job, as under torchrun: gpurun stops the others and exits non-zero (the worker's code 1),
# naming the error. With DROP_ON_ERROR=1 (gpurun.elastic(drop_on_error=True)) it goes on
# without the rank instead, as after a crash: the two others finish, exit 0. DIE_HOW=exit2:
# sys.exit(2) inside train_one_epoch fails the job with status 2 (not "goes on without it").
# Usage: run_program_error.sh GPURUN
TEST=python_program_error
source "$(dirname "$0")/common.sh"
printf 'active_gpus = [0, 1, 2]\n' > "$TMP/config.toml"
# job OUT [VAR=VALUE...]: slot 1 dies at epoch 2 step 3 (DIE_HOW from the arguments); sets rc
job() {
  local out=$TMP/$1
  shift
  mkdir -p "$out"
  rc=0
  env "$@" DIE_SLOT=1 DIE_EPOCH=2 DIE_STEP=3 GPURUN_COMM_TIMEOUT_MS=20000 timeout 200 \
    "$GPURUN" --master-port 0 --nproc 3 --device cpu --config "$TMP/config.toml" \
    "$PY" "$HERE/decorated_train.py" "$out" 5 > "$LOG" 2>&1 || rc=$?
}
job out DIE_HOW=raise
[[ $rc == 1 ]] || fail "gpurun exited $rc, not 1 (the worker's ValueError)"
grep -q "after the program's own error: ValueError: slot 1 found a bad batch" "$LOG" \
  || fail "gpurun did not name the program's error"
grep -q "done, world" "$LOG" && fail "a rank finished training although the job failed"
echo "$TEST: the program's ValueError failed the job (exit $rc)"
job out3 DIE_HOW=exit2  # sys.exit(2) in train_one_epoch: the job fails with 2, as under torchrun
[[ $rc == 2 ]] || fail "after sys.exit(2) gpurun exited $rc, not 2"
grep -q "after the program's own error: SystemExit: sys.exit(2) in train_one_epoch" "$LOG" \
  || fail "gpurun did not name the program's sys.exit(2)"
echo "$TEST: the program's sys.exit(2) failed the job (exit $rc)"
job out2 DROP_ON_ERROR=1 DIE_HOW=raise
[[ $rc == 0 ]] || fail "with drop_on_error gpurun exited $rc, not 0"
[[ $(grep -c 'decorated_train slot .: done, world 2' "$LOG") == 2 ]] \
  || fail "with drop_on_error slots 0 and 2 did not both finish with world 2"
echo "$TEST: OK"
