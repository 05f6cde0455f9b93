#!/usr/bin/env bash
# ctest python_example_vit[_hold]: examples/python/fmnist_vit.py (ViT tiny, Fashion-MNIST subset)
# under gpurun --config on 2 CPU slots with the tqdm bar on, in release (default) or hold mode
# ([park] mode); after epoch 0 config.toml shrinks the
# job to [0], once an epoch ran on one rank it grows back to [0, 1]. Asserts the worlds follow
# (2, 1, 2; the last of the 8 epochs on 2 ranks), the
# validation accuracy after the last epoch is >= 0.6, and gpurun exits 0.
# Usage: run_example.sh GPURUN [release|hold]
MODE=${2:-release}
TEST=python_example_vit$([[ $MODE == hold ]] && echo _hold)
source "$(dirname "$0")/common.sh"
conf() { printf 'active_gpus = %s\n[park]\nmode = "%s"\n' "$1" "$MODE" > "$TMP/config.toml.new"
         mv "$TMP/config.toml.new" "$TMP/config.toml"; }
conf "[0, 1]"
"$GPURUN" --master-port 0 --nproc 2 --device cpu --config "$TMP/config.toml" \
  --event-log "$TMP/events.jsonl" "$PY" \
  "$HERE/../../examples/python/fmnist_vit.py" --epochs 8 --limit-train 4000 > "$LOG" 2>&1 &
pid=$!
wait_line "epoch 0 world 2"; conf "[0]"
wait_line "epoch [12] world 1"; conf "[0, 1]"
wait "$pid" || fail "gpurun exited $?"
grep "^\[rank0\]: epoch .* generation" "$LOG"
grep -q "^\[rank0\]: epoch 7 world 2" "$LOG" || fail "the last epoch did not run on 2 ranks"
grep -q "it/s\|step/s\|s/step" "$LOG" || fail "no tqdm bar in the output"
acc=$(grep "^\[rank0\]: epoch 7 world" "$LOG" | sed 's/.*val acc //')
awk -v a="$acc" 'BEGIN{exit !(a >= 0.6)}' || fail "val acc $acc < 0.6"
if [[ $MODE == hold ]]; then  # slot 1 parked and was woken: one process all along
  [[ $(grep -c '"reason": "parked (hold mode)"' "$TMP/events.jsonl") -ge 1 ]] || fail "no park in hold mode"
fi
echo "$TEST: OK (val acc $acc)"
