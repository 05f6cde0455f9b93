#!/usr/bin/env bash
# ctest python_setup_failure_<where>: a joiner killed during the resize's set-up. 2 CPU slots
# train (loop form, tests/python/elastic_train.py; the joiner's load slowed by SLOW_LOAD); a
# grow to [0,1,2] admits slot 2, which is SIGKILLed inside its state load (load: the holders
# are in the checksum all-gather), or once it stopped itself in its first init_process_group (rendezvous,
# STOP_FIRST_INIT=2: the holders wait for it in torch's rendezvous of the new group until gpurun's
# abort key; the test used to SIGSTOP it after its warm_ready event, which under load could land
# after its admission). The holders must give up on it at
# once (not after the comm timeout), report again, and go on as [0,1]: gpurun decides
# failed [2], the job finishes every epoch (each sample once per epoch) and exits 0.
# member (issue 25 item 1): slot 1, a member holding the state, is SIGKILLed in the grow's
# set-up instead, after gpurun's arrival wait, inside torch's init_process_group
# (STALL_RENDEZVOUS=1), while slot 0 (the other holder) and the joiner wait in torch's own
# rendezvous for its address: gpurun abandons the generation's keys, which ends that wait at
# once (not at the comm timeout), and they go on as [0, 2] (gpurun decides failed [1]), not
# die in the group's set-up with "the training state is lost".
# source: slot 0, the state's source, is SIGKILLed SOURCE_DELAY s (default 1) into the
# joiner's slowed load (the joiner and slot 1 then meet in the checksum all-gather): they go
# on as [1, 2].
# wrap: the joiner is SIGKILLed inside torch's DDP construction (STALL_WRAP=2), after the new
# group was made, while the holders wait in DDP's own broadcast of the module: they report the
# failed collective and go on as [0, 1] (before the fix, they died of the connection reset).
# Usage: run_setup_failure.sh GPURUN load|rendezvous|member|source|wrap
WHERE=${2:-load}
TEST=python_setup_failure_$WHERE
source "$(dirname "$0")/common.sh"
mkdir -p "$TMP/out"
printf 'active_gpus = [0, 1]\n' > "$TMP/config.toml"
EPOCHS=30  # the joiner must be ready (torch's import: seconds on a loaded machine) before the end
STALL=; [[ $WHERE == member ]] && STALL=1
SLOW=30 COMM_MS=120000
# rendezvous, wrap, member: no load is slowed (the death comes before any load). source: the
# joiner's load (5 s) bounds how soon it sees the source gone and reports.
[[ $WHERE == rendezvous || $WHERE == wrap || $WHERE == member ]] && SLOW=0
WRAP=; [[ $WHERE == wrap ]] && WRAP=2
STOPINIT=; [[ $WHERE == rendezvous ]] && STOPINIT=2
[[ $WHERE == source ]] && SLOW=5
STOP_FIRST_INIT=$STOPINIT STALL_WRAP=$WRAP STALL_RENDEZVOUS=$STALL SLOW_LOAD=$SLOW GPURUN_COMM_TIMEOUT_MS=$COMM_MS "$GPURUN" --master-port 0 --nproc 3 --device cpu \
  --config "$TMP/config.toml" --event-log "$TMP/events.jsonl" \
  "$PY" "$HERE/elastic_train.py" "$TMP/out" "$EPOCHS" 1.0 > "$LOG" 2>&1 &
pid=$!
wait_event '"event": "decision", "generation": 0, "prev_generation": 0, "round": 1,'
printf 'active_gpus = [0, 1, 2]\n' > "$TMP/c.new"; mv "$TMP/c.new" "$TMP/config.toml"
if [[ $WHERE == member ]]; then
  wait_for 90 "slot 1 to reach the grow's init_process_group" test -s "$TMP/out/rendezvous.1"
  victim=$(cat "$TMP/out/rendezvous.1")
elif [[ $WHERE == wrap ]]; then
  wait_for 90 "slot 2 to reach DDP's construction" test -s "$TMP/out/wrap.2"
  victim=$(cat "$TMP/out/wrap.2")
  sleep 1  # the holders are in DDP's broadcast, waiting for it
elif [[ $WHERE == load || $WHERE == source ]]; then
  wait_for 90 "slot 2 to load a state" test -s "$TMP/out/loading.2"
  victim=$(cat "$TMP/out/loading.2")
  if [[ $WHERE == source ]]; then
    victim=$(cat "$TMP/out/pid.0")
    sleep "${SOURCE_DELAY:-1}"
  fi
else  # stopped in its own init_process_group: the holders wait for it in the rendezvous
  wait_for 90 "slot 2 to reach the grow's init_process_group" test -s "$TMP/out/rendezvous.2"
  victim=$(cat "$TMP/out/rendezvous.2")
  sleep 1  # the holders are in torch's rendezvous, waiting for it
fi
[[ $victim -gt 1 ]] && kill -9 "$victim"
killed=$(date +%s)
dead=2 survivors="[0, 1]" limit=20
[[ $WHERE == member ]] && dead=1 survivors="[0, 2]" limit=45
[[ $WHERE == source ]] && dead=0 survivors="[1, 2]"
wait_event "\"failed\": \\[$dead\\]"
waited=$(( $(date +%s) - killed ))
((waited < limit)) || fail "the holders waited $waited s for the dead rank"
echo "$TEST: the holders went on $(( $(date +%s) - killed )) s after the kill"
: > "$TMP/out/fast"  # what was to be seen is seen: the remaining epochs without their sleep
wait "$pid" || fail "gpurun exited $?"
grep -q "the training state is lost" "$LOG" && fail "gpurun says the state is lost"
"$PY" - "$TMP/out" "$survivors" "$EPOCHS" <<'PY' || fail "the checks above"
import glob, json, sys
lines = [json.loads(l) for f in glob.glob(sys.argv[1] + "/log.*") for l in open(f) if "seen" in l]
for e in range(int(sys.argv[3])):
    ls = [l for l in lines if l["epoch"] == e]
    assert sorted(i for l in ls for i in l["seen"]) == list(range(240)), f"epoch {e}"
    assert len({l["start_checksum"] for l in ls}) == 1, f"epoch {e}"
    assert {l["world"] for l in ls} == {2}, f"epoch {e}: worlds {[l['world'] for l in ls]}"
print(f"{sys.argv[3]} epochs, each sample once, ending on {sys.argv[2]}; the death did not stop them")
PY
echo "$TEST: OK"
