#!/usr/bin/env bash
# Issue 7, the 2-GPU correctness run (NCCL between two GPUs of one host), in <= 240 s:
#   1. elastic_trainer under gpurun --nproc 2 --config, release mode: [0,1] -> shrink to [0]
#      (nvidia-smi: GPU 1 holds no process of ours) -> grow to [0,1] (the joiner on GPU 1
#      receives the state from rank 0 over NCCL) -> finish. Latencies, bytes, checksums.
#   2. the same in hold mode: GPU 1 keeps its parked process (MiB while parked, same pid).
#   3. gradient all-reduce bandwidth: bench/allreduce_bench (the runtime's bucketed
#      all_reduce_gradients) under gpurun vs bench/anchors/allreduce_bw.py under torchrun.
#   4. ViT-B throughput of vit_step_bench --mode runtime at 1 and 2 GPUs (same micro-batch).
# Usage (GPU machine, after a CUDA build of the targets gpurun elastic_trainer allreduce_bench
# vit_step_bench):
#   scripts/gpu-multi.sh BUILD_DIR OUT_DIR
# Prints one table last and writes OUT_DIR/multi.json; logs, traces, event logs in OUT_DIR.
# Exit status: 0 when every step passed its checks, 1 otherwise, 2 without 2 GPUs.
# MULTI_DEVICE=cpu: a smoke test on a CPU machine (--device cpu virtual slots, Gloo, small
# models; no nvidia-smi, no torch anchor). MULTI_BUDGET_S (default 240): total time limit.
set -uo pipefail
SELF=$(realpath "$0"); ROOT=$(realpath "$(dirname "$SELF")/..")
SCEN=; if [[ ${1:-} == --scenario ]]; then SCEN=$2; shift 2; fi
B=$(realpath -m "${1:?usage: gpu-multi.sh BUILD_DIR OUT_DIR}"); OUT=$(realpath -m "${2:?out dir}")
mkdir -p "$OUT"; cd "$ROOT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export GPURUN_COMM_TIMEOUT_MS=${GPURUN_COMM_TIMEOUT_MS:-60000}
DEV=${MULTI_DEVICE:-cuda}
G=$B/launcher/gpurun T=$B/tests/worker_runtime/elastic_trainer
AR=$B/bench/allreduce_bench VIT=$B/bench/vit_step_bench
if [[ $DEV == cpu ]]; then
  MODEL=(--width 256 --depth 2 --samples 512 --micro 32 --epoch-ms 200)
  ARARGS=(--mib 16 --iters 3 --warmup 1) VARGS=(--model tiny --micro 8 --steps 3 --warmup 1)
else  # gpu-elastic.sh's MLP: 117.6 M parameters, AdamW: 1.41 GB of state; 8 steps an epoch
  MODEL=(--width 4096 --depth 8 --samples 4096 --micro 256 --epoch-ms 200)
  ARARGS=(--mib 256 --iters 20 --warmup 5) VARGS=(--model b --micro 64 --steps 20 --warmup 5)
fi
source "$ROOT/scripts/lib-events.sh"   # count, wait_count, cfg

# Per-GPU reading: "G <index> <memory.used MiB>" per GPU, then "P <index> <pid> <MiB>" per
# compute process (uuid mapped to index). Nothing on the CPU.
smi_gpus() {
  [[ $DEV == cpu ]] && { echo "cpu: no nvidia-smi"; return; }
  local map pid uuid mib; map=$(nvidia-smi --query-gpu=index,uuid,memory.used --format=csv,noheader,nounits)
  awk -F', *' '{print "G", $1, $3}' <<< "$map"
  while IFS=', ' read -r pid uuid mib; do
    [[ -n $uuid ]] && echo "P $(awk -F', *' -v u="$uuid" '$2 == u {print $1}' <<< "$map") $pid $mib"
  done < <(nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory --format=csv,noheader,nounits)
}
ntrace() { local n; n=$(grep -c "\"event\":\"$2\"" "$1" 2>/dev/null); echo "${n:-0}"; }
wait_trace() {  # FILE EVENT N TIMEOUT_S
  local end=$((SECONDS + $4)); while (( $(ntrace "$1" "$2") < $3 )); do
    (( SECONDS > end )) && { echo "timeout waiting for $3 $2 events in $1"; return 1; }
    ! kill -0 "$gp" 2>/dev/null && { echo "gpurun exited while waiting for $2 in $1"; return 1; }
    sleep 0.1; done; }
fail() { echo "scenario: $*"; kill "$gp" 2>/dev/null; wait "$gp"; exit 1; }

# Steps 1-2, one mode (the script calls itself with --scenario MODE under timeout).
scenario() {
  local mode=$1 d=$OUT/$1; rm -rf "$d"; mkdir -p "$d/out"
  cfg "[0, 1]" "$mode" "$d/config.toml"
  GPURUN_TRACE_DIR=$d/trace "$G" --device "$DEV" --nproc 2 --config "$d/config.toml" --grace-period 5 \
    --event-log "$d/events.jsonl" --master-port 0 "$T" "$d/out" "${MODEL[@]}" > "$d/gpurun.log" 2>&1 &
  gp=$!
  wait_count "$d/events.jsonl" continue 2 100 || fail "no training on [0,1]"
  smi_gpus > "$d/smi_training.txt"
  cfg "[0]" "$mode" "$d/config.toml"                        # shrink at the next boundary
  wait_count "$d/events.jsonl" resize 1 30 || fail "no shrink"
  if [[ $mode == release ]]; then
    local end=$((SECONDS + 20))
    until grep -q '"event": "worker_exited"' "$d/events.jsonl"; do
      (( SECONDS > end )) && fail "slot 1 did not exit"; sleep 0.1; done
    sleep 1
  else
    wait_trace "$d/trace/gpu1.jsonl" parked 1 30 || fail "slot 1 did not park"
    sleep 1
  fi
  smi_gpus > "$d/smi_shrunk.txt"
  cfg "[0, 1]" "$mode" "$d/config.toml"                     # grow at the next boundary
  wait_count "$d/events.jsonl" resize 2 30 || fail "no grow"
  local c0; c0=$(count "$d/events.jsonl" continue)
  wait_count "$d/events.jsonl" continue $((c0 + 2)) 60 || fail "no training after the grow"
  smi_gpus > "$d/smi_grown.txt"
  # Both ranks read the stop file at an epoch start after a common boundary: stop 3 epochs on.
  local last; last=$(python3 -c "import json,sys;print(max(json.loads(l).get('epoch',0) for l in open(sys.argv[1]) if '\"decision\"' in l))" "$d/events.jsonl")
  echo $((last + 3)) > "$d/out/stop"
  wait "$gp"; local rc=$?; echo "gpurun rc=$rc"; echo "$rc" > "$d/rc"; return "$rc"
}
if [[ -n $SCEN ]]; then scenario "$SCEN"; exit; fi

# ---- the run ------------------------------------------------------------------------------
BUDGET=${MULTI_BUDGET_S:-240}; START=$SECONDS
STEPLOG=$OUT/steps.tsv; : > "$STEPLOG"
# step NAME LIMIT_S CMD...: CMD under timeout (LIMIT_S, cut to what is left of the budget),
# output in OUT/NAME.log; "NAME rc seconds" appended to steps.tsv.
step() {
  local name=$1 limit=$2; shift 2
  local left=$((BUDGET - (SECONDS - START) - 8)); (( limit > left )) && limit=$left
  if (( limit < 5 )); then printf '%s\t%s\t%s\n' "$name" skipped 0 >> "$STEPLOG"; echo "== $name: skipped (budget)"; return 1; fi
  local t0=$EPOCHREALTIME; timeout -k 5 "$limit" "$@" > "$OUT/$name.log" 2>&1; local rc=$?
  local s; s=$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN{printf "%.1f", b-a}')
  printf '%s\t%s\t%s\n' "$name" "$rc" "$s" >> "$STEPLOG"
  echo "== $name: rc=$rc ${s}s (limit ${limit}s): $(tail -n 1 "$OUT/$name.log")"
}
for f in "$G" "$T" "$AR" "$VIT"; do
  [[ -x $f ]] || { echo "gpu-multi: $f is missing: cmake --build $B --target gpurun elastic_trainer allreduce_bench vit_step_bench"; exit 2; }
done
if [[ $DEV == cpu ]]; then NGPU=0; else NGPU=$(nvidia-smi -L | wc -l); fi
echo "gpu-multi: device $DEV, GPUs detected: $NGPU, budget ${BUDGET}s, out $OUT"
if [[ $DEV != cpu ]] && (( NGPU < 2 )); then echo "gpu-multi: needs 2 GPUs ($NGPU detected)"; exit 2; fi
[[ $DEV != cpu ]] && nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader > "$OUT/gpus.txt"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

step elastic_release 60 "$SELF" --scenario release "$B" "$OUT"
step elastic_hold 60 "$SELF" --scenario hold "$B" "$OUT"
step allreduce_gpurun 25 "$G" --nproc 2 --device "$DEV" --master-port 0 "$AR" "${ARARGS[@]}" --json "$OUT/allreduce_gpurun.json"
if [[ $DEV != cpu ]]; then
  step allreduce_torch 40 python3 -m torch.distributed.run --nproc-per-node 2 --master-port "$(free_port)" \
    bench/anchors/allreduce_bw.py "${ARARGS[@]}" --json "$OUT/allreduce_torch.json"
fi
for n in 1 2; do
  cfg "$([[ $n == 1 ]] && echo "[0]" || echo "[0, 1]")" release "$OUT/vit$n.toml"
  step "vit_$n" 25 "$G" --nproc "$n" --device "$DEV" --config "$OUT/vit$n.toml" --master-port 0 \
    "$VIT" --mode runtime "${VARGS[@]}" --json "$OUT/vit_$n.json"
done

# ---- the table ----------------------------------------------------------------------------
python3 - "$OUT" "$DEV" "$NGPU" "$((SECONDS - START))" <<'PY'
import glob, json, os, sys
from datetime import datetime

out, dev, ngpu, wall = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
steps = {}
for line in open(os.path.join(out, "steps.tsv")):
    n, rc, s = line.rstrip("\n").split("\t")
    steps[n] = {"rc": rc, "s": float(s)}

def jsonl(p):
    try:
        return [json.loads(l) for l in open(p) if l.strip()]
    except OSError:
        return []

def load(n):
    try:
        return json.load(open(os.path.join(out, n)))
    except (OSError, ValueError):
        return None

def ms(ts):
    return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp() * 1e3

def smi(d, name):  # {"gpus": {idx: MiB}, "procs": [(idx, pid, MiB)]} or None (cpu / missing)
    try:
        lines = open(os.path.join(d, f"smi_{name}.txt")).read().split("\n")
    except OSError:
        return None
    if any(l.startswith("cpu") for l in lines):
        return None
    g = {int(l.split()[1]): int(l.split()[2]) for l in lines if l.startswith("G ")}
    p = [tuple(int(x) for x in l.split()[1:4]) for l in lines if l.startswith("P ") and len(l.split()) == 4]
    return {"gpus": g, "procs": p}

result = {"device": dev, "gpus_detected": ngpu, "wall_s": wall, "steps": steps}
rows, failed = [], [n for n, s in steps.items() if s["rc"] != "0"]

def row(what, value, ok=None):
    rows.append((what, value, {True: "yes", False: "**NO**", None: "–"}[ok]))
    if ok is False:
        failed.append(what)

row("GPUs detected (nvidia-smi -L)", str(ngpu) if dev != "cpu" else "cpu smoke test (2 virtual slots)")
for mode in ("release", "hold"):
    d = os.path.join(out, mode)
    ev = jsonl(os.path.join(d, "events.jsonl"))
    tr = {int(os.path.basename(f)[3:-6]): jsonl(f) for f in glob.glob(os.path.join(d, "trace", "gpu*.jsonl"))}
    allt = sorted((t for ts in tr.values() for t in ts), key=lambda t: t["t_ms"])
    dec = [e for e in ev if e.get("event") == "decision" and e.get("kind") == "resize"]
    shrink = next((e for e in dec if e.get("active") == [0]), None)
    grow = next((e for e in dec if shrink and e.get("active") == [0, 1] and e["generation"] > shrink["generation"]), None)
    gens = {}
    for t in allt:
        if t["event"] == "generation":
            gens.setdefault(t["generation"], []).append(t)
    m = {"rc": steps.get(f"elastic_{mode}", {}).get("rc")}
    # checksums: every member of every generation reports one, all equal
    sums, ok = {}, bool(gens)
    for g, ts in sorted(gens.items()):
        members = [t for t in ts if t.get("gpu") in t.get("active", [])]
        cs = sorted({t["checksum"] for t in members})
        world = max(t.get("world", 0) for t in ts)
        sums[g] = {"checksums": [t["checksum"] for t in members], "world": world}
        ok = ok and len(members) == world and len(cs) == 1 and cs[0] is not None
    m["checksums"] = sums
    m["checksums_equal"] = ok
    if shrink:
        t0 = ms(shrink["ts"])
        surv = next((t for t in gens.get(shrink["generation"], []) if t["gpu"] == 0), None)
        m["shrink_ms"] = surv and surv["t_ms"] - t0
        m["shrink_enter_ms"] = surv and surv["ms"]
        if mode == "release":
            gone = next((e for e in ev if e.get("event") == "worker_exited" and ms(e["ts"]) >= t0 - 1), None)
            m["leaver_gone_ms"] = gone and ms(gone["ts"]) - t0
        else:
            pk = next((t for t in tr.get(1, []) if t["event"] == "parked"), None)
            m["leaver_parked_ms"] = pk and pk["t_ms"] - t0
            m["parked_device_bytes"] = pk and pk.get("device_bytes")
            m["parked_pid"] = pk and pk["pid"]
    if grow:
        t0 = ms(grow["ts"])
        gt = gens.get(grow["generation"], [])
        j = next((t for t in gt if t["gpu"] == 1), None)
        src = next((t for t in gt if t["gpu"] == 0), None)
        m["grow_ms"] = j and j["t_ms"] - t0
        m["grow_joiner_enter_ms"] = j and j["ms"]
        m["grow_source_enter_ms"] = src and src["ms"]
        m["bytes"] = j and j["bytes"]
        m["joiner_role"] = j and j["role"]
        m["joiner_pid"] = j and j["pid"]
    start1 = next((t for t in tr.get(1, []) if t["event"] == "start"), None)
    m["slot1_first_pid"] = start1 and start1["pid"]
    ours = {e["pid"] for e in ev if e.get("event") == "worker_started"}
    m["worker_pids"] = sorted(ours)
    sm = {k: smi(d, k) for k in ("training", "shrunk", "grown")}
    m["smi"] = sm
    result[mode] = m
    f = lambda v, u=" ms": "?" if v is None else f"{v:,.0f}{u}"
    row(f"{mode}: gpurun exit status", str(m["rc"]), m["rc"] == "0")
    row(f"{mode}: shrink [0,1]→[0]: decision (event log) → survivor's `generation` trace event "
        f"(its enter(): new comm + checksum {f(m.get('shrink_enter_ms'))})", f(m.get("shrink_ms")),
        None if m.get("shrink_ms") is None else True)
    if mode == "release":
        row("release: shrink decision → leaver process exited (worker_exited)", f(m.get("leaver_gone_ms")))
    else:
        row(f"hold: shrink decision → leaver parked (tracked bytes on device after: "
            f"{m.get('parked_device_bytes')})", f(m.get("leaver_parked_ms")))
    if sm["shrunk"] is not None:
        g1 = [p for p in sm["shrunk"]["procs"] if p[0] == 1]
        ours1 = [p for p in g1 if p[1] in ours]
        seen = sm["training"] and any(p[1] in ours for p in sm["training"]["procs"])
        mem1 = sm["shrunk"]["gpus"].get(1)
        if mode == "release":
            row("release, shrunk: GPU 1 processes of ours (nvidia-smi; GPU 1 memory.used)",
                f"{len(ours1)} ({mem1} MiB used){'' if seen else '; pids not visible even while training'}",
                len(ours1) == 0 and (mem1 is None or mem1 < 100))
        else:
            pp = m.get("parked_pid")
            mib = next((p[2] for p in g1 if p[1] == pp), None)
            m["parked_mib"] = mib
            row(f"hold, parked: GPU 1 process of ours pid {pp} (nvidia-smi MiB; GPU 1 memory.used)",
                f"{mib} MiB ({mem1} MiB used)", mib is not None if seen else None)
    if sm["training"] is not None:
        row(f"{mode}: MiB per GPU while training on [0,1] / after the grow (nvidia-smi memory.used)",
            f"{sm['training']['gpus']} / {(sm['grown'] or {}).get('gpus')}")
    row(f"{mode}: grow [0]→[0,1]: decision → joiner's `generation` trace event ({m.get('joiner_role')}; "
        f"joiner enter {f(m.get('grow_joiner_enter_ms'))}, source enter {f(m.get('grow_source_enter_ms'))})",
        f(m.get("grow_ms")), None if m.get("grow_ms") is None else True)
    b = m.get("bytes")
    row(f"{mode}: bytes handed off to the joiner (model + AdamW state)", "?" if b is None else f"{b:,} ({b / 1e9:.2f} GB)")
    if mode == "hold":
        same = m.get("joiner_pid") is not None and m.get("joiner_pid") == m.get("parked_pid") == m.get("slot1_first_pid")
        row("hold: GPU 1 pid at start / parked / after the grow (same process)",
            f"{m.get('slot1_first_pid')} / {m.get('parked_pid')} / {m.get('joiner_pid')}", same)
    row(f"{mode}: checksums of every rank equal at each generation (gen: checksum×ranks)",
        ", ".join(f"{g}: {' ≠ '.join(str(c) for c in sorted(set(s['checksums']), key=str)) or '–'}"
                  f"×{len(s['checksums'])}" for g, s in sums.items()) or "none",
        ok)

ours, torch_ = load("allreduce_gpurun.json"), load("allreduce_torch.json")
result["allreduce"] = {"gpurun": ours, "torch": torch_}
bw = lambda j: j and j.get("busbw_gbps")
r = bw(ours) / bw(torch_) if bw(ours) and bw(torch_) else None
if ours:
    row(f"all-reduce bus bandwidth, {ours['bytes'] / 2**20:.0f} MiB float32, world {ours['world']}: "
        f"runtime all_reduce_gradients ({ours['bucket_mib']} MiB buckets) / torch all_reduce",
        f"{bw(ours):.1f} / {'–' if not torch_ else f'{bw(torch_):.1f}'} GB/s"
        + ("" if r is None else f" = {r:.2f}×"), ours.get("correct"))
else:
    row("all-reduce bandwidth", "no result (see allreduce_gpurun.log)", False)
v1, v2 = load("vit_1.json"), load("vit_2.json")
result["vit"] = {"1": v1, "2": v2}
if v1 and v2:
    s = v2["images_per_s"] / v1["images_per_s"]
    row(f"ViT-{v1['model']} runtime images/s, micro {v1['micro']} per GPU: 1 GPU / 2 GPUs (scaling)",
        f"{v1['images_per_s']:,.0f} / {v2['images_per_s']:,.0f} ({s:.2f}×, {s / 2:.0%} efficiency)")
    result["vit"]["scaling"] = s
else:
    row("ViT throughput 1 → 2 GPUs", "no result (see vit_1.log, vit_2.log)", False)
result["table"] = [dict(zip(("measurement", "value", "ok"), r)) for r in rows]
result["failed"] = failed
with open(os.path.join(out, "multi.json"), "w") as fh:
    json.dump(result, fh, indent=1)
    fh.write("\n")
print("\n| measurement | value | ok |\n|---|---|---|")
for r_ in rows:
    print("| " + " | ".join(r_) + " |")
print(f"wall {wall} s; failed: {', '.join(failed) or 'none'}; logs and multi.json in {out}")
sys.exit(1 if failed else 0)
PY
