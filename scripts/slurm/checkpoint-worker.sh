#!/bin/bash
# A stand-in for a training program under preempt.sbatch, showing the contract: on SIGUSR2
# save a checkpoint and exit 0; on start resume from the checkpoint if there is one.
# "Training" is STEPS steps of STEP_SECONDS each; the checkpoint is the step reached, one file
# per global rank in CHECKPOINT_DIR. Prints one line at start, at the checkpoint and at the end.
# Environment: CHECKPOINT_DIR [checkpoints/job-$SLURM_JOB_ID], STEPS [3000], STEP_SECONDS [1].
set -u
dir=${CHECKPOINT_DIR:-checkpoints/job-${SLURM_JOB_ID:-0}}
ckpt=$dir/rank$RANK.step
steps=${STEPS:-3000}
mkdir -p "$dir"
step=0
sleeper=0
[[ -s $ckpt ]] && step=$(<"$ckpt")
start=$step
if ((step > 0)); then
  echo "checkpoint-worker: rank $RANK of $WORLD_SIZE resumed from step $step"
else
  echo "checkpoint-worker: rank $RANK of $WORLD_SIZE starting at step 0"
fi
save_and_exit() {
  kill "$sleeper" 2>/dev/null
  echo "$step" > "$ckpt.tmp" && mv "$ckpt.tmp" "$ckpt"
  echo "checkpoint-worker: rank $RANK: SIGUSR2: checkpoint at step $step saved to $ckpt, exiting"
  exit 0
}
trap save_and_exit USR2
while ((step < steps)); do
  sleep "${STEP_SECONDS:-1}" &
  sleeper=$!
  wait "$sleeper"  # returns at once when SIGUSR2 arrives (the trap runs then)
  step=$((step + 1))
done
echo "$step" > "$ckpt"
echo "checkpoint-worker: rank $RANK: done, $steps steps ($((steps - start)) in this run)"
