#!/usr/bin/env bash
# Resize latency of the main job (fmnist_train) under gpurun, one worker: a pause to [] and a
# resume to [0], in release and hold mode, broken down from gpurun's `resize` events
# (docs/control-protocol.md#resize-timings) and the worker traces (snapshot write/read).
# "standby": release mode with [park] standby (the resume tells the standby to go).
# RUNS="release hold" runs a subset; REPEAT=N runs each N times (labels release-1 ... release-N).
# "edit -> first step": the resume's config edit to the worker's first step done in the
# resumed generation (its trace's first_step; the step's loss was read back). The "before" row is the same run the slow way (model built and initialised on the CPU, no
# prepared snapshot): the ratios in the last table are against it, in the same run.
#
#   bench/resize_latency.sh BUILD_DIR OUT_DIR DEVICE MODEL [fmnist_train args...]
#   e.g. bench/resize_latency.sh build-gpu out cuda h --bf16 --micro 64 --limit-train 6400
#        bench/resize_latency.sh build out cpu tiny --limit-train 4096
#
# Waits on events, never on fixed sleeps: nvidia-smi is read once `gpurun status` shows every
# slot PARKED (release: the worker has exited and been reaped); "decision -> PARKED" is from
# gpurun's own event log (the snapshot decision's and the PARKED worker_state's ts, 1 ms).
# "decision -> GPU free (NVML)": on cuda, bench/nvml_watch.py polls NVML's process list every
# 2 ms during the pause; the moment the worker's pid stopped being listed (release mode; hold
# keeps its context). AHEAD=0: the standby run's resume edit as soon as the standby waits, before
# its snapshot map is done (default: once its trace says standby_mapped). Prints a table last;
# logs, traces and event logs under OUT_DIR.
set -uo pipefail
B=${1:?build dir}; OUT=${2:?out dir}; DEV=${3:?cpu or cuda}; MODEL=${4:?model preset}; shift 4
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
G=$B/launcher/gpurun; T=$B/examples/fashion_mnist/fmnist_train
EVERY=${EVERY:-10}  # a boundary every EVERY optimizer steps

smi() {
  [[ $DEV == cuda ]] || { echo "-"; return; }
  local s
  s=$(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader 2>/dev/null |
    tr '\n' ';' | sed 's/;$//')
  echo "${s:-none}"
}
n_events() { local n; n=$(grep -c "\"event\": \"$2\"" "$1" 2>/dev/null); echo "${n:-0}"; }
n_decisions() { local n; n=$(grep -c "\"event\": \"decision\".*\"kind\": \"$2\"" "$1" 2>/dev/null); echo "${n:-0}"; }
wait_for() {  # DESCRIPTION TIMEOUT_S COMMAND...: until COMMAND succeeds, gpurun ($gp) alive
  local what=$1 end=$((SECONDS + $2)); shift 2
  until "$@"; do
    ((SECONDS > end)) && { echo "timeout waiting for $what"; return 1; }
    kill -0 "$gp" 2>/dev/null || { echo "gpurun exited while waiting for $what"; return 1; }
    sleep 0.05
  done
}
ge() { (($(n_events "$1" "$2") >= $3)); }
ge_dec() { (($(n_decisions "$1" "$2") >= $3)); }
parked() {  # every slot PARKED in `gpurun status` (release: the worker has exited)
  "$G" status --json --pid "$gp" 2>/dev/null | python3 -c '
import json, sys
slots = json.load(sys.stdin)["slots"]
sys.exit(0 if slots and all(s["state"] in ("PARKED", "STANDBY") for s in slots) else 1)'
}
nw_started() { [[ -s $1/nvml.jsonl ]] || ! kill -0 "$nw" 2>/dev/null; }  # written, or it ended
stop_nw() { [[ -n $nw ]] && { kill "$nw" 2>/dev/null; wait "$nw" 2>/dev/null; }; nw=""; }
now_ms() { local t=${EPOCHREALTIME/./}; echo $((t / 1000)); }
prepared() { grep -qs '"event": *"snapshot_prepared".*"path"' "$1"/trace/gpu0.jsonl; }
cfg() {  # ACTIVE MODE FILE; env STANDBY (true|false, default false): [park] standby
  printf 'active_gpus = %s\n[park]\nmode = "%s"\nstandby = %s\n[boundary]\nevery = %s\ndeadline_s = 600\n' \
    "$1" "$2" "${STANDBY:-false}" "$EVERY" > "$3.new" && mv "$3.new" "$3"
}
# The standby waits in device() and (AHEAD=1, the default) did all it does before its go: the
# snapshot mapped (a user's resume comes later than the bench's; AHEAD=0 edits at once).
standby_waits() {
  grep -qs '"event": *"standby"' "$1"/trace/gpu0.jsonl &&
    { [[ ${AHEAD:-1} == 0 ]] || grep -qs '"event": *"standby_mapped"' "$1"/trace/gpu0.jsonl; }
}

scenario() {  # LABEL MODE [extra fmnist_train args]; env: PREPARE=0|1
  local label=$1 mode=$2 d=$OUT/$1; shift 2
  rm -rf "$d"; mkdir -p "$d"
  cfg "[0]" "$mode" "$d/config.toml"
  GPURUN_SNAPSHOT_PREPARE=${PREPARE:-1} GPURUN_TRACE_DIR=$d/trace \
    "$G" --device "$DEV" --nproc 1 --config "$d/config.toml" --event-log "$d/events.jsonl" \
    --master-port 0 "$T" --model "$MODEL" --epochs 1 --timings "$d/timings.jsonl" \
    "${ARGS[@]}" "$@" > "$d/gpurun.log" 2>&1 &
  gp=$!
  wait_for "2 continue decisions" 300 ge_dec "$d/events.jsonl" continue 2 || { kill "$gp"; return 1; }
  if [[ ${PREPARE:-1} == 1 ]]; then
    wait_for "the prepared snapshot" 300 prepared "$d" || { kill "$gp"; return 1; }
  fi
  echo "training: $(smi)" > "$d/smi.txt"
  nw=""  # NVML watcher (bench/nvml_watch.py): when the worker's process leaves the GPU
  if [[ $DEV == cuda ]]; then
    python3 "$(dirname "$0")/nvml_watch.py" "$d/nvml.jsonl" 0 0.002 2> "$d/nvml.err" &
    nw=$!
    wait_for "the NVML watcher" 30 nw_started "$d"
    [[ -s $d/nvml.jsonl ]] || { echo "no NVML watcher: $(cat "$d/nvml.err")"; stop_nw; }
  fi
  cfg "[]" "$mode" "$d/config.toml"
  local t_edit; t_edit=$(now_ms)
  wait_for "the pause's resize event" 300 ge "$d/events.jsonl" resize 1 || { kill "$gp"; stop_nw; return 1; }
  wait_for "PARKED" 300 parked || { kill "$gp"; stop_nw; return 1; }
  local t_parked; t_parked=$(now_ms)
  stop_nw
  echo "edit_to_parked_ms: $((t_parked - t_edit))" >> "$d/smi.txt"
  echo "parked_at_ms: $t_parked" >> "$d/smi.txt"
  if [[ ${STANDBY:-false} == true ]]; then
    wait_for "the standby in device()" 300 standby_waits "$d" || { kill "$gp"; return 1; }
  fi
  echo "paused: $(smi)" >> "$d/smi.txt"
  cfg "[0]" "$mode" "$d/config.toml"
  echo "resume_edit_ms: $(now_ms)" >> "$d/smi.txt"
  wait_for "the resume's resize event" 300 ge "$d/events.jsonl" resize 2 || { kill "$gp"; return 1; }
  echo "resumed: $(smi)" >> "$d/smi.txt"
  wait "$gp"; echo "rc=$?" >> "$d/smi.txt"
}

ARGS=("$@")
[[ " $* " == *" --data "* ]] || [[ ! -d .carry/data ]] || ARGS+=(--data .carry/data)
if [[ $DEV == cuda ]]; then
  # An idle torch CUDA context on this GPU, for the hold-mode row (read only, nothing set).
  python3 - > "$OUT/idle_context.txt" 2>&1 <<'PY' || true
import subprocess, torch
x = torch.zeros(1, device="cuda"); torch.cuda.synchronize()
out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader"],
                     capture_output=True, text=True).stdout
import os
mine = [l for l in out.splitlines() if l.split(",")[0].strip() == str(os.getpid())]
print(mine[0].split(",")[1].strip() if mine else "unknown")
PY
fi
REPEAT=${REPEAT:-1}
for ((rep = 1; rep <= REPEAT; rep++)); do
  for run in ${RUNS:-before release standby hold}; do  # RUNS: a subset, e.g. "release hold"
    l=$run; ((REPEAT > 1)) && l=$run-$rep
    case $run in
      before) PREPARE=0 scenario "$l" release --build-on-cpu ;;
      release) PREPARE=1 scenario "$l" release ;;
      standby) PREPARE=1 STANDBY=true scenario "$l" release ;;
      hold) PREPARE=1 scenario "$l" hold ;;
    esac
    echo "$l: rc=$?"
  done
done

python3 - "$OUT" "$DEV" "$MODEL" <<'PY'
import glob, json, os, sys
out, dev, model = sys.argv[1:4]
def lines(p):
    try: return [json.loads(l) for l in open(p) if l.strip()]
    except OSError: return []
rows = {}
kinds = ("before", "release", "standby", "hold")
labels = sorted((e for e in os.listdir(out) if e.split("-")[0] in kinds and
                 os.path.isdir(os.path.join(out, e))),
                key=lambda e: (e.split("-")[1:], kinds.index(e.split("-")[0])))
for label in labels:
    d = os.path.join(out, label)
    ev = lines(d + "/events.jsonl")
    tr = [t for f in glob.glob(d + "/trace/*.jsonl") for t in lines(f)]
    rz = [e for e in ev if e.get("event") == "resize"]
    if len(rz) < 2: rows[label] = None; continue
    pause, resume = rz[0], rz[1]
    ph = pause["phases_ms"]
    # decision -> left: the phases after the pause decision (the leaver's record: release,
    # its loop ended and it is exiting; hold, it is parked)
    keys = list(ph); i = keys.index("decision") if "decision" in keys else -1
    gone = sum(ph[k] for k in keys[i + 1:]) if i >= 0 else None
    w = [t for t in tr if t["event"] == "snapshot_written"]
    r = [t for t in tr if t["event"] == "snapshot_read"]
    gens = [t for t in tr if t["event"] == "generation"]
    after = [t for t in gens if t.get("world", 0) > 0 and t["generation"] >= resume["generation"]]
    tim = lines(d + "/timings.jsonl")
    # The pause's first decision (the snapshot round, else the resize) -> every slot PARKED,
    # both on the wall clock of this machine (event ts, the bench's poll of gpurun status).
    import datetime
    first = next((e for e in ev if e.get("event") == "decision" and e.get("kind") == "snapshot"), None)
    def wall_ms(ts):
        return datetime.datetime.strptime(ts, "%Y-%m-%dT%H:%M:%S.%fZ").replace(
            tzinfo=datetime.timezone.utc).timestamp() * 1e3
    # gpurun's own PARKED moment (worker_state event; release: the process was reaped), the
    # last slot's, after the pause's first decision; the script's poll only gates nvidia-smi.
    parked = [wall_ms(e["ts"]) for e in ev if e.get("event") == "worker_state" and
              e.get("to") == "PARKED" and first and wall_ms(e["ts"]) >= wall_ms(first["ts"])]
    parked_ts = max(parked) if parked else None
    # The GPU free, as NVML saw it (bench/nvml_watch.py): the last moment before PARKED that
    # none of the worker processes (the traces' pids) was listed any more.
    # nan when no line lists one of them (another pid namespace, no NVML: nothing to time).
    ours = {str(t["pid"]) for t in tr if "pid" in t}
    gpu_free, seen_ours = float("nan"), False
    if first:
        for l in lines(d + "/nvml.jsonl"):
            if parked_ts and l["t_ms"] > parked_ts + 1000:
                continue
            listed = ours & set(l["pids"])
            seen_ours |= bool(listed)
            if l["t_ms"] < wall_ms(first["ts"]):
                continue
            if listed: gpu_free = float("nan")
            elif gpu_free != gpu_free and seen_ours: gpu_free = l["t_ms"] - wall_ms(first["ts"])
    smi = dict(l.split(": ", 1) for l in open(d + "/smi.txt").read().splitlines() if ": " in l)
    fs = [t["t_ms"] for t in tr if t["event"] == "first_step" and t["generation"] >= resume["generation"]]
    edit_first = min(fs) - float(smi["resume_edit_ms"]) if fs and "resume_edit_ms" in smi else float("nan")
    rows[label] = dict(
        write_ms=w[0]["ms"] if w else None, write=w[0] if w else {},
        read=r[0] if r else {}, gone_ms=gone, pause_total=pause["total_ms"], pause_phases=ph,
        resume_ms=resume["total_ms"], resume_phases=resume["phases_ms"], edit_to_first_step=edit_first,
        same=bool(w and after and w[0]["checksum"] == after[0]["checksum"]),
        paused_smi=smi.get("paused", "?"), edit_to_parked=float(smi.get("edit_to_parked_ms", "nan")),
        decision_to_parked=(parked_ts - wall_ms(first["ts"])) if first and parked_ts else float("nan"),
        decision_to_gpu_free=gpu_free, timings=tim, bytes=w[0].get("tensor_bytes") if w else None)
json.dump(rows, open(out + "/summary.json", "w"), indent=1)
idle = open(out + "/idle_context.txt").read().strip() if os.path.exists(out + "/idle_context.txt") else "-"
print(f"\nresize latency, fmnist_train --model {model} on {dev}, one worker (ms; monotonic clock)")
print("idle torch CUDA context on this GPU:", idle)
hdr = "| run | state GB | snapshot write | (copy / hash done, from the copy start) | decision -> left | decision -> GPU free (NVML) | decision -> PARKED | paused (nvidia-smi) | resume: edit -> training | edit -> first step | resume phases | checksums equal |"
print(hdr); print("|" + "---|" * 12)
for label, x in rows.items():
    if not x: print(f"| {label} | failed | | | | | | | | | | |"); continue
    wr = x["write"]
    print(f"| {label} | {x['bytes'] / 1e9 if x['bytes'] else 0:.2f} | {x['write_ms']:.0f} | "
          f"{wr.get('copy_ms', 0):.0f} / {wr.get('checksum_ms', 0):.0f} | {x['gone_ms']:.0f} | "
          f"{x['decision_to_gpu_free']:.0f} | {x['decision_to_parked']:.0f} | "
          f"{x['paused_smi']} | {x['resume_ms']:.0f} | {x['edit_to_first_step']:.0f} | "
          + ", ".join(f"{k} {v:.0f}" for k, v in x["resume_phases"].items()) +
          f" | {x['same']} |")
print("\nstart-up of each process (s): runtime, data, model, optimizer; joining / init")
for label, x in rows.items():
    for t in (x or {}).get("timings", []):
        print(f"  {label}: slot {t['slot']} joining={t['joining']} build={t['build']} init={t['init']}: "
              f"runtime {t['runtime_s']:.2f}, data {t['data_s']:.2f}, model {t['model_s']:.2f}, "
              f"optimizer {t['optimizer_s']:.2f}, total {t['total_s']:.2f}")
b = next((rows[l] for l in labels if l.split("-")[0] == "before" and rows[l]), None)
if b:
    print("\nratios against 'before' (same run):")
    for label in labels:
        x = rows.get(label)
        if not x or label.startswith("before"): continue
        print(f"  {label}: snapshot write {b['write_ms'] / max(x['write_ms'], 1e-3):.1f}x faster, "
              f"resume {b['resume_ms'] / max(x['resume_ms'], 1e-3):.1f}x faster, "
              f"pause+resume {(b['pause_total'] + b['resume_ms']) / max(x['pause_total'] + x['resume_ms'], 1e-3):.1f}x")
PY
