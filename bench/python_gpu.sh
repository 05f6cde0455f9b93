#!/usr/bin/env bash
# GPU evidence for the gpurun Python package (docs/python.md): examples/python/fmnist_vit.py,
# one worker, for each model of MODELS in one run:
#  1. throughput: the same script and arguments under torchrun (static: the package sees
#     torchrun's environment) and under gpurun --config (elastic, active_gpus = [0]), run
#     A B A B (REPS pairs); samples/s from the script's own --timings (the training loop only,
#     epoch 0 left out as warm-up) and the median gpurun/torchrun ratio over the pairs;
#  2. pause and resume in release and in hold mode: after the first epoch boundary
#     active_gpus = [], once `gpurun status` shows every slot PARKED nvidia-smi is read, then
#     [0] again and the run finishes; decision -> PARKED (the snapshot decision's and the
#     PARKED worker_state's ts in gpurun's event log), the resume's total_ms (config seen ->
#     training, docs/control-protocol.md#resize-timings), and whether the state checksum at
#     the end of the last epoch before the pause equals the one at the start of the first
#     epoch after it (the example's --checksums: the package records none of its own).
#     Each pause runs PAUSE_REPS times (default 3); "edit -> first step" is from the resume's
#     config edit to the first step's loss read back in the epoch after it (the example's
#     first_step_unix).
#  3. the anchor, torchrun's kill and restart of the same model (bench/anchors/restart_vit.py,
#     RESTART_REPS times, default 3): pause = torch.save of the checkpoint + the job's exit,
#     resume = a new torchrun to the first step done (start-up, model build, torch.load); the
#     cycle ratio is the anchor's median cycle over each gpurun mode's median cycle (decision ->
#     PARKED + edit -> first step);
#  4. torch's own floor for a parked process (bench/park_floor.py), against the hold rows.
# Prints a markdown table last (also OUT_DIR/table.md, rewritten after each model); logs,
# event logs, timings and summary.json under OUT_DIR.
#
#   bench/python_gpu.sh BUILD_DIR OUT_DIR DEVICE "MODELS"
#   e.g. bench/python_gpu.sh build-gpu out/py cuda "b h"
#        bench/python_gpu.sh build /tmp/pyb cpu tiny        (the dry run: torchrun may be absent)
# Environment: PAUSE_REPS, RESTART_REPS (above), PY (a python3 with torch; default: python3 on PATH if it imports torch, else
# /usr/bin/python3), REPS (pairs, default 2), EPOCHS (per run, default 3), ARGS_<model>
# (the example's arguments for a model, replacing the preset below), EXTRA (arguments added
# to every run, e.g. --bf16), WAIT_S (timeout of every wait, default 300), RUN_TIMEOUT
# (seconds per throughput run, default 420), MODES (the pause runs, default "release standby
# hold": release without and with [park] standby, hold; REPS=0 skips the throughput runs), FLOOR (0:
# no bench/park_floor.py, e.g. in a second call over the same OUT_DIR), AHEAD (0: a standby mode's
# resume edit as soon as the standby waits, before its snapshot map is done; default 1: once it
# is). Waits on events and states, never on fixed sleeps.
set -uo pipefail
B=${1:?build dir}; OUT=${2:?out dir}; DEV=${3:?cpu or cuda}; MODELS=${4:?models, e.g. \"b h\"}
[[ $DEV == cpu || $DEV == cuda ]] || { echo "python_gpu.sh: DEVICE must be cpu or cuda, not '$DEV'" >&2; exit 2; }
G=$(cd "$B" 2>/dev/null && pwd)/launcher/gpurun
[[ -x $G ]] || { echo "python_gpu.sh: no gpurun at $B/launcher/gpurun (build it first)" >&2; exit 2; }
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
cd "$(dirname "$0")/.." || exit 2  # the repository root: the example's path below
export NCCL_NVLS_ENABLE=0
REPS=${REPS:-2}; PAUSE_REPS=${PAUSE_REPS:-3}; RESTART_REPS=${RESTART_REPS:-3}; EPOCHS=${EPOCHS:-3}; WAIT_S=${WAIT_S:-300}; RUN_TIMEOUT=${RUN_TIMEOUT:-420}
EX=examples/python/fmnist_vit.py
if [[ -z ${PY:-} ]]; then
  for p in "$(command -v python3 || true)" /usr/bin/python3; do
    [[ -n $p ]] && "$p" -c 'import torch' 2>/dev/null && { PY=$p; break; }
  done
fi
[[ -n ${PY:-} ]] || { echo "python_gpu.sh: no python3 with torch (set PY)" >&2; exit 2; }
DATA=()
[[ -e /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]] || DATA=(--data .carry/data)

preset() {  # MODEL: the example's arguments (about 10-20 s per epoch on one H200 for b and h)
  local v=ARGS_$1
  if [[ -n ${!v:-} ]]; then echo "${!v}"; return; fi
  case $1 in
    tiny) echo "--batch 64 --limit-train 2048 --limit-val 256" ;;
    b) echo "--batch 256 --limit-train 40000" ;;
    h) echo "--batch 128 --limit-train 8192" ;;
    *) echo "--limit-train 4096" ;;
  esac
}
smi() {
  [[ $DEV == cuda ]] || { echo "-"; return; }
  local s
  s=$(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader 2>/dev/null |
    tr '\n' ';' | sed 's/;$//')
  echo "${s:-none}"
}
cfg() {  # ACTIVE MODE FILE (written whole, then renamed: gpurun never reads half a file)
  # MODE: release (no standby), standby (release with [park] standby), or hold.
  local mode=$2 sb=false
  [[ $mode == standby ]] && { mode=release; sb=true; }
  printf 'active_gpus = %s\n[park]\nmode = "%s"\nstandby = %s\n' "$1" "$mode" "$sb" > "$3.new" &&
    mv "$3.new" "$3"
}
# The standby reached rt.device and (AHEAD=1, the default) did all it does before its go: the
# snapshot mapped (a user's resume comes later than the bench's; AHEAD=0 edits at once).
standby_waits() {
  grep -q "standby: waiting" "$1" && { [[ ${AHEAD:-1} == 0 ]] || grep -q "standby: snapshot mapped ahead" "$1"; }
}
standby_rss() {  # resident set (KiB) of the slot's standby process (pid from `gpurun status`)
  local p
  p=$("$G" status --json --pid "$gp" 2>/dev/null | "$PY" -c '
import json, sys
print(next((s["pid"] for s in json.load(sys.stdin)["slots"] if s["state"] == "STANDBY"), ""))')
  # RssAnon + RssFile: not RssShmem, the pause snapshot it maps while it waits (the file's own
  # pages, shared: no memory of the standby's)
  [[ -n $p ]] && awk '/^Rss(Anon|File):/ {k += $2} END {print k}' "/proc/$p/status"
}
n_events() { local n; n=$(grep -c "\"event\": \"$2\"" "$1" 2>/dev/null); echo "${n:-0}"; }
n_decisions() { local n; n=$(grep -c "\"event\": \"decision\".*\"kind\": \"$2\"" "$1" 2>/dev/null); echo "${n:-0}"; }
ge() { (($(n_events "$1" "$2") >= $3)); }
ge_dec() { (($(n_decisions "$1" "$2") >= $3)); }
wait_for() {  # DESCRIPTION TIMEOUT_S COMMAND...: until COMMAND succeeds while gpurun ($gp) lives
  local what=$1 end=$((SECONDS + $2)); shift 2
  until "$@"; do
    ((SECONDS > end)) && { echo "timeout ($WAIT_S s) waiting for $what"; return 1; }
    kill -0 "$gp" 2>/dev/null || { echo "gpurun exited while waiting for $what"; return 1; }
    sleep 0.05
  done
}
parked() {  # every slot PARKED in `gpurun status` (release: the worker has exited)
  "$G" status --json --pid "$gp" 2>/dev/null | "$PY" -c '
import json, sys
slots = json.load(sys.stdin)["slots"]
sys.exit(0 if slots and all(s["state"] in ("PARKED", "STANDBY") for s in slots) else 1)'
}
finish() {  # waits (WAIT_S) for gpurun ($gp) to exit, else SIGTERM, then SIGKILL; prints rc
  local end=$((SECONDS + WAIT_S))
  while kill -0 "$gp" 2>/dev/null && ((SECONDS <= end)); do sleep 0.1; done
  if kill -0 "$gp" 2>/dev/null; then
    kill "$gp" 2>/dev/null; end=$((SECONDS + 40))
    while kill -0 "$gp" 2>/dev/null && ((SECONDS <= end)); do sleep 0.1; done
    kill -0 "$gp" 2>/dev/null && kill -9 "$gp" 2>/dev/null
  fi
  wait "$gp"
}
now_ms() { local t=${EPOCHREALTIME/./}; echo $((t / 1000)); }

# torchrun: a one-process probe first (Debian 12's torchrun fails under Python 3.11).
printf 'import sys, torch\nprint("probe ok", sys.executable, torch.__version__)\n' > "$OUT/torchrun_probe.py"
TORCHRUN=unavailable
if command -v torchrun > /dev/null &&
  timeout -k 5 120 torchrun --standalone --nproc_per_node 1 "$OUT/torchrun_probe.py" \
    > "$OUT/torchrun_probe.log" 2>&1 && grep -q "probe ok" "$OUT/torchrun_probe.log"; then
  TORCHRUN=ok
  mine=$("$PY" -c 'import sys, torch; print(sys.executable, torch.__version__)')
  theirs=$(grep -o "probe ok .*" "$OUT/torchrun_probe.log" | head -1 | sed 's/^probe ok //')
  [[ $mine == "$theirs" ]] || echo "warning: torchrun runs $theirs, gpurun runs $mine" | tee -a "$OUT/torchrun_probe.log"
fi
echo "torchrun: $TORCHRUN ($OUT/torchrun_probe.log); python: $PY; device: $DEV; models: $MODELS"
[[ $DEV == cuda ]] && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$OUT/gpu.txt" 2>&1

throughput() {  # MODEL LAUNCHER REP
  local m=$1 l=$2 d=$OUT/$1/$2-$3 t0 rc
  rm -rf "$d"; mkdir -p "$d"
  local -a args
  read -ra args <<< "$(preset "$m") ${EXTRA:-}"
  args=(--model "$m" --epochs "$EPOCHS" --no-bar "${DATA[@]}" "${args[@]}" --timings "$d/timings.jsonl")
  t0=$(now_ms)
  if [[ $l == torchrun ]]; then
    timeout -k 30 "$RUN_TIMEOUT" torchrun --standalone --nproc_per_node 1 "$EX" "${args[@]}" > "$d/log" 2>&1
  else
    cfg "[0]" release "$d/config.toml"
    timeout -k 30 "$RUN_TIMEOUT" "$G" --nproc 1 --device "$DEV" --config "$d/config.toml" \
      --master-port 0 --grace-period 10 --event-log "$d/events.jsonl" "$PY" -u "$EX" "${args[@]}" > "$d/log" 2>&1
  fi
  rc=$?
  printf '{"rc": %d, "wall_s": %.3f}\n' "$rc" "$(($(now_ms) - t0))e-3" > "$d/run.json"
  echo "  $m $l run $3: rc=$rc, $(($(now_ms) - t0)) ms"
}

pause() {  # MODEL MODE REP: pause to [] after the first epoch boundary, resume to [0]
  local m=$1 mode=$2 d=$OUT/$1/$2-$3 t
  rm -rf "$d"; mkdir -p "$d"
  local -a args
  read -ra args <<< "$(preset "$m") ${EXTRA:-}"
  args=(--model "$m" --epochs "$EPOCHS" --no-bar "${DATA[@]}" "${args[@]}"
    --timings "$d/timings.jsonl" --checksums)
  cfg "[0]" "$mode" "$d/config.toml"
  "$G" --nproc 1 --device "$DEV" --config "$d/config.toml" --master-port 0 --grace-period 10 \
    --event-log "$d/events.jsonl" "$PY" -u "$EX" "${args[@]}" > "$d/log" 2>&1 &
  gp=$!
  {
    wait_for "the first epoch boundary" "$WAIT_S" ge_dec "$d/events.jsonl" continue 1 &&
      echo "training: $(smi)" &&
      cfg "[]" "$mode" "$d/config.toml" && t=$(now_ms) && echo "pause_edit_ms: $t" &&
      wait_for "the pause's resize event" "$WAIT_S" ge "$d/events.jsonl" resize 1 &&
      wait_for "every slot PARKED" "$WAIT_S" parked &&
      echo "edit_to_parked_poll_ms: $(($(now_ms) - t))" &&
      { [[ $mode != standby ]] ||
        { wait_for "the standby waiting for its go" "$WAIT_S" standby_waits "$d/log" &&
          echo "standby_rss_kib: $(standby_rss)"; }; } &&
      echo "paused: $(smi)" &&
      cfg "[0]" "$mode" "$d/config.toml" && echo "resume_edit_ms: $(now_ms)" &&
      wait_for "the resume's resize event" "$WAIT_S" ge "$d/events.jsonl" resize 2 &&
      echo "resumed: $(smi)"
  } > "$d/steps.txt" 2>&1
  local ok=$?
  ((ok == 0)) || { cat "$d/steps.txt"; kill "$gp" 2>/dev/null; }
  finish; local rc=$?
  echo "rc: $rc" >> "$d/steps.txt"
  echo "  $m $mode run $3: rc=$rc$( ((ok == 0)) || echo ", $(tail -2 "$d/steps.txt" | head -1)")"
}

restart() {  # MODEL REP: the anchor: torchrun trains, saves a checkpoint and ends; a new
  # torchrun loads it and takes one step (bench/anchors/restart_vit.py)
  local m=$1 d=$OUT/$1/restart-$2 t0 t1 t2 rc1 rc2
  rm -rf "$d"; mkdir -p "$d"
  local -a args
  read -ra args <<< "$(preset "$m") ${EXTRA:-}"
  local -a keep=()  # the example's arguments the anchor shares: model, batch, data, bf16
  local i
  for ((i = 0; i < ${#args[@]}; i++)); do
    case ${args[i]} in
      --batch | --data) keep+=("${args[i]}" "${args[i + 1]}"); ((i++)) ;;
      --bf16) keep+=(--bf16) ;;
    esac
  done
  local -a common=(--model "$m" "${DATA[@]}" "${keep[@]}" --limit-train 4096)
  t0=$(now_ms)
  timeout -k 30 "$RUN_TIMEOUT" torchrun --standalone --nproc_per_node 1 bench/anchors/restart_vit.py \
    "${common[@]}" --steps 3 --save "$d/ckpt.pt" --json "$d/save.json" > "$d/save.log" 2>&1
  rc1=$?; t1=$(now_ms)
  timeout -k 30 "$RUN_TIMEOUT" torchrun --standalone --nproc_per_node 1 bench/anchors/restart_vit.py \
    "${common[@]}" --steps 2 --resume "$d/ckpt.pt" --json "$d/resume.json" > "$d/resume.log" 2>&1
  rc2=$?; t2=$(now_ms)
  printf '{"rc_save": %d, "rc_resume": %d, "launch1_ms": %d, "exit1_ms": %d, "exit2_ms": %d}\n' \
    "$rc1" "$rc2" "$t0" "$t1" "$t2" > "$d/run.json"
  rm -f "$d/ckpt.pt"
  echo "  $m torchrun restart run $2: rc=$rc1/$rc2, $((t2 - t0)) ms"
}

summary() {  # writes OUT/summary.json and OUT/table.md; prints the details and the table
  "$PY" - "$OUT" "$DEV" "$TORCHRUN" "$@" <<'PY'
import datetime, json, os, statistics, sys
out, dev, torchrun, models = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]

def lines(p):
    try:
        return [json.loads(l) for l in open(p) if l.strip()]
    except (OSError, ValueError):
        return []

def wall_ms(ts):
    return datetime.datetime.strptime(ts, "%Y-%m-%dT%H:%M:%S.%fZ").replace(
        tzinfo=datetime.timezone.utc).timestamp() * 1e3

def rate(d):  # samples/s of one run: the epochs after the first (all if only one), or None
    t = lines(d + "/timings.jsonl")
    run = lines(d + "/run.json")
    if not t or not run or run[0]["rc"] != 0:
        return None
    t = t[1:] or t
    return sum(x["samples"] for x in t) / sum(x["seconds"] for x in t)

summ, rows, details = {}, [], []
for m in models:
    md = os.path.join(out, m)
    runs = {l: sorted(e for e in os.listdir(md) if e.startswith(l + "-")) if os.path.isdir(md) else []
            for l in ("torchrun", "gpurun")}
    r = {l: [rate(os.path.join(md, e)) for e in runs[l]] for l in runs}
    walls = {l: [(lines(os.path.join(md, e, "run.json")) or [{}])[0].get("wall_s") for e in runs[l]]
             for l in runs}
    pairs = [g / t for t, g in zip(r["torchrun"], r["gpurun"]) if t and g]
    s = {"samples_per_s": r, "wall_s": walls, "ratios": pairs}
    fmt = lambda v: "/".join(f"{x:.0f}" if x else "failed" for x in v) or "-"  # noqa: E731
    sps = f"gpurun {fmt(r['gpurun'])}; torchrun " + (fmt(r["torchrun"]) if torchrun == "ok" else "unavailable")
    if pairs:
        med = statistics.median(pairs)
        ratio = f"{med:.3f} (pairs {', '.join(f'{p:.3f}' for p in pairs)})"
        s["median_ratio"] = med
    else:
        ratio = "torchrun: unavailable" if torchrun != "ok" else "failed"
    good = r["gpurun"] and all(r["gpurun"]) and (torchrun != "ok" or all(r["torchrun"]))
    result = ("ok" if good else "failed") + (f", target 0.98: {'met' if s['median_ratio'] >= 0.98 else 'NOT met'}"
                                             if pairs else "")
    rows.append(f"| {m} | throughput | {sps} | {ratio} | | | | | | {result} |")
    details.append(f"{m} throughput: samples/s {r}; process wall s {walls}")
    cycles = {}
    for mode, rep in [(mo, e.split("-", 1)[1]) for mo in ("release", "standby", "hold")
                      for e in (sorted(os.listdir(md)) if os.path.isdir(md) else [])
                      if e.startswith(mo + "-")]:
        d = os.path.join(md, f"{mode}-{rep}")
        ev = lines(d + "/events.jsonl")
        steps = dict(l.split(": ", 1) for l in open(d + "/steps.txt").read().splitlines()
                     if ": " in l) if os.path.exists(d + "/steps.txt") else {}
        rz = [e for e in ev if e.get("event") == "resize"]
        snap = next((e for e in ev if e.get("event") == "decision" and e.get("kind") == "snapshot"), None)
        parked = [wall_ms(e["ts"]) for e in ev if e.get("event") == "worker_state"
                  and e.get("to") == "PARKED" and snap and wall_ms(e["ts"]) >= wall_ms(snap["ts"])]
        t = lines(d + "/timings.jsonl")
        # the epoch before the pause and the first after the resume (a later generation)
        after = next((i for i, x in enumerate(t) if i and x["generation"] > t[0]["generation"]), None)
        same = None
        if after is not None and t[after]["epoch"] == t[after - 1]["epoch"] + 1:
            same = t[after - 1].get("end_checksum") == t[after].get("start_checksum")
        first = t[after].get("first_step_unix") if after is not None else None
        edit_first = (first * 1e3 - float(steps["resume_edit_ms"])
                      if first and "resume_edit_ms" in steps else None)
        x = {"decision_to_parked_ms": max(parked) - wall_ms(snap["ts"]) if parked else None,
             "edit_to_first_step_ms": edit_first,
             "pause": rz[0] if rz else None, "resume": rz[1] if len(rz) > 1 else None,
             "smi": {k: steps.get(k) for k in ("training", "paused", "resumed", "standby_rss_kib")},
             "rc": steps.get("rc"), "checksums_equal": same, "timings": t}
        ok = x["rc"] == "0" and x["resume"] and x["decision_to_parked_ms"] is not None and same
        s[f"{mode}-{rep}"] = x
        if ok and edit_first is not None:
            cycles.setdefault(mode, []).append(x["decision_to_parked_ms"] + edit_first)
        dp = f"{x['decision_to_parked_ms']:.0f}" if x["decision_to_parked_ms"] is not None else "failed"
        res = f"{x['resume']['total_ms']:.0f}" if x["resume"] else "failed"
        ef = f"{edit_first:.0f}" if edit_first is not None else "-"
        rows.append(f"| {m} | pause/resume {mode} run {rep} | | | {dp} | {x['smi']['paused'] or 'failed'} | "
                    f"{res} | {ef} | {'failed' if same is None else same} | {'ok' if ok else 'failed'} |")
        details.append(f"{m} {mode}: pause {json.dumps(x['pause'] and x['pause']['phases_ms'])}, total "
                       f"{x['pause'] and x['pause']['total_ms']} ms; resume "
                       f"{json.dumps(x['resume'] and x['resume']['phases_ms'])}; nvidia-smi {x['smi']}; rc {x['rc']}")
    anchor = []  # torchrun kill and restart: (pause ms, resume ms)
    for e in sorted(os.listdir(md)) if os.path.isdir(md) else []:
        if not e.startswith("restart-"):
            continue
        run, sv, rs = (lines(os.path.join(md, e, f)) for f in ("run.json", "save.json", "resume.json"))
        if not (run and sv and rs) or run[0]["rc_save"] or run[0]["rc_resume"]:
            rows.append(f"| {m} | torchrun kill + restart {e[8:]} | | | failed | | | | | failed |")
            continue
        pz = sv[0]["save_ms"] + (run[0]["exit1_ms"] - sv[0]["saved_unix"] * 1e3)
        rz = rs[0]["first_step_unix"] * 1e3 - run[0]["exit1_ms"]
        anchor.append((pz, rz))
        rows.append(f"| {m} | torchrun kill + restart {e[8:]} (save {sv[0]['save_ms']:.0f}, load "
                    f"{rs[0]['load_ms']:.0f}) | | | {pz:.0f} (save + exit) | | | {rz:.0f} (launch -> first step) "
                    f"| | ok |")
    s["restart"] = anchor
    if anchor:
        tr = statistics.median(p + r for p, r in anchor)
        for mode, c in cycles.items():
            g = statistics.median(c)
            s.setdefault("cycle_ratio", {})[mode] = tr / g
            rows.append(f"| {m} | cycle {mode}: torchrun {tr:.0f} / gpurun {g:.0f} ms (medians, "
                        f"{len(anchor)} and {len(c)} runs) | | | | | | | | **{tr / g:.1f}x** |")
    summ[m] = s
floor = lines(out + "/park_floor.json")
if floor:
    summ["park_floor"] = floor[0]
    rows.append("| all | torch's floor (bench/park_floor.py, MiB) | | | | idle "
                f"{floor[0].get('idle_mib')}, after a ViT step freed {floor[0].get('after_training_freed_mib')}, "
                f"after a DDP/NCCL step freed {floor[0].get('after_nccl_training_freed_mib')} | | | | |")
json.dump(summ, open(out + "/summary.json", "w"), indent=1)
table = [f"fmnist_vit.py on {dev}, one worker; samples/s: the script's training loop, epochs after the first; "
         "ms from gpurun's event log",
         "| model | scenario | samples/s (per run) | gpurun/torchrun (median) | decision -> PARKED ms | "
         "paused: nvidia-smi | resume: config seen -> training ms | edit -> first step ms | checksums equal | "
         "result |",
         "|" + "---|" * 10] + rows
open(out + "/table.md", "w").write("\n".join(table) + "\n")
print("\n".join(details))
print()
print("\n".join(table))
PY
}

start=$SECONDS
[[ $DEV == cuda && ${FLOOR:-1} == 1 ]] && "$PY" bench/park_floor.py --embed 1280 --depth 32 > "$OUT/park_floor.json" 2> "$OUT/park_floor.log"
done_models=()
for m in $MODELS; do
  echo "== $m: $(preset "$m") ${EXTRA:-}"
  for ((i = 1; i <= REPS; i++)); do  # A B A B
    [[ $TORCHRUN == ok ]] && throughput "$m" torchrun "$i"
    throughput "$m" gpurun "$i"
  done
  for ((i = 1; i <= PAUSE_REPS; i++)); do
    for mode in ${MODES:-release standby hold}; do pause "$m" "$mode" "$i"; done
  done
  if [[ $TORCHRUN == ok ]]; then
    for ((i = 1; i <= RESTART_REPS; i++)); do restart "$m" "$i"; done
  fi
  done_models+=("$m")
  summary "${done_models[@]}" > "$OUT/summary.txt" 2>&1 || echo "summary failed: $OUT/summary.txt"
done
echo "total: $((SECONDS - start)) s"
echo
cat "$OUT/summary.txt"
