#!/usr/bin/env bash
# Issue 6's benchmarks on one GPU, each against its PyTorch anchor measured in the same run:
#   1. launch -> first all-reduce done: gpurun + bench/first_allreduce vs torchrun +
#      bench/anchors/first_allreduce.py (wall time of the whole command, median of reps)
#   2. training throughput of the ViT preset: vit_step_bench bare (plain LibTorch) and under
#      gpurun (worker runtime) vs bench/anchors/ddp_vit.py under torchrun (DDP)
#   3. pause/resume latencies (release and hold mode) of vit_step_bench under gpurun --config
#   4. bench/offload_bench (when built) and bench/store_bench vs torch's TCPStore server
# Usage (after a CUDA build, see README.md "On a GPU machine"):
#   scripts/bench-gpu.sh [--quick] [BUILD_DIR [OUT_DIR]]      # defaults: build-gpu, ./bench-out
# Prints one markdown table last and writes OUT_DIR/bench-gpu.json; full logs in OUT_DIR.
# Environment (defaults; --quick or BENCH_QUICK=1 changes the model to b and fewer steps):
#   BENCH_MODEL=h BENCH_MICRO=32 BENCH_STEPS=50 BENCH_WARMUP=5   throughput runs (ViT-H: ~0.1 s
#                           a step on an H200; the whole script takes ~2.5 min there)
#   BENCH_REPS=3            timed launches per command (after one untimed warm-up launch each)
#   BENCH_RESIZE_MODEL=b    model of the pause/resume runs
#   BENCH_DEVICE=cuda       cpu: a smoke test on a CPU machine (tiny model, Gloo; anchors
#                           are skipped when python3 has no torch)
set -uo pipefail
SELF=$(realpath "$0")
QUICK=${BENCH_QUICK:-0}; ARGS=(); RESIZE_ONLY=
while (($#)); do
  case $1 in --quick) QUICK=1 ;; --resize) RESIZE_ONLY=$2; shift ;; *) ARGS+=("$1") ;; esac; shift
done
ROOT=$(dirname "$SELF")/..; ROOT=$(realpath "$ROOT")
B=$(realpath -m "${ARGS[0]:-$ROOT/build-gpu}"); OUT=$(realpath -m "${ARGS[1]:-$PWD/bench-out}")
mkdir -p "$OUT"; cd "$ROOT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1

DEV=${BENCH_DEVICE:-cuda}
if [[ $DEV == cpu ]]; then d_model=tiny d_micro=8 d_steps=3 d_warmup=1 d_resize=tiny
elif [[ $QUICK == 1 ]]; then d_model=b d_micro=32 d_steps=20 d_warmup=3 d_resize=b
else d_model=h d_micro=32 d_steps=50 d_warmup=5 d_resize=b; fi
MODEL=${BENCH_MODEL:-$d_model} MICRO=${BENCH_MICRO:-$d_micro}
STEPS=${BENCH_STEPS:-$d_steps} WARMUP=${BENCH_WARMUP:-$d_warmup}
REPS=${BENCH_REPS:-3} RESIZE_MODEL=${BENCH_RESIZE_MODEL:-$d_resize}

G=$B/launcher/gpurun VIT=$B/bench/vit_step_bench FIRST=$B/bench/first_allreduce
for f in "$G" "$VIT" "$FIRST"; do
  [[ -x $f ]] || { echo "bench-gpu: $f is missing: build first: cmake --build $B --target gpurun vit_step_bench first_allreduce store_bench offload_bench"; exit 2; }
done
TORCHRUN=(python3 -m torch.distributed.run --nproc-per-node 1)
HAVE_TORCH=1; python3 -c 'import torch' 2>/dev/null || HAVE_TORCH=0
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
source "$ROOT/scripts/lib-events.sh"   # smi, count, wait_count, cfg

# Step 3, one mode (the script calls itself with --resize MODE): vit_step_bench in runtime mode
# with a boundary every 5 steps; after 2 boundaries active_gpus = [] (pause), then [0]
# (resume), 2 more boundaries, then the stop file ends it. Trace, event log and step log in
# OUT/resize_MODE.
resize() {  # MODE
  local mode=$1 d=$OUT/resize_$1; rm -rf "$d"; mkdir -p "$d"
  cfg "[0]" "$mode" "$d/config.toml"
  GPURUN_TRACE_DIR=$d/trace "$G" --nproc 1 --device "$DEV" --config "$d/config.toml" \
    --event-log "$d/events.jsonl" --master-port 0 "$VIT" --mode runtime --model "$RESIZE_MODEL" \
    --micro "$MICRO" --warmup 0 --steps 1 --epoch-steps 5 --epochs 1000000 \
    --step-log "$d/steps.jsonl" --stop-file "$d/stop" > "$d/gpurun.log" 2>&1 &
  gp=$!
  wait_count "$d/events.jsonl" continue 2 120 || { kill $gp; return 1; }
  echo "training: $(smi)"
  cfg "[]" "$mode" "$d/config.toml"
  wait_count "$d/events.jsonl" resize 1 60 || { kill $gp; return 1; }
  sleep 2; echo "paused: $(smi)"
  cfg "[0]" "$mode" "$d/config.toml"
  wait_count "$d/events.jsonl" resize 2 60 || { kill $gp; return 1; }
  local c0; c0=$(count "$d/events.jsonl" continue)
  wait_count "$d/events.jsonl" continue $((c0 + 2)) 120 || { kill $gp; return 1; }
  echo "resumed: $(smi)"
  touch "$d/stop"; wait $gp; local rc=$?; echo "gpurun rc=$rc"; unset gp; return $rc
}
if [[ ${RESIZE_ONLY:-} ]]; then resize "$RESIZE_ONLY"; exit; fi  # one pause/resume run (step 3)

STEPLOG=$OUT/steps.tsv; : > "$STEPLOG"
# step NAME TIMEOUT_S CMD...: runs CMD under timeout with its output in OUT/NAME.log; appends
# "NAME rc seconds" to steps.tsv (seconds: wall time of the command, taken here).
step() {
  local name=$1 limit=$2; shift 2
  local t0=$EPOCHREALTIME; timeout "$limit" "$@" > "$OUT/$name.log" 2>&1; local rc=$?
  local s; s=$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN{printf "%.3f", b-a}')
  printf '%s\t%s\t%s\n' "$name" "$rc" "$s" >> "$STEPLOG"
  echo "== $name: rc=$rc ${s}s: $(tail -n 1 "$OUT/$name.log")"
  return $rc
}
echo "bench-gpu: device $DEV, model $MODEL micro $MICRO, $WARMUP+$STEPS steps, $REPS launches each, resize model $RESIZE_MODEL, out $OUT"

# ---- 1. launch -> first all-reduce done --------------------------------------------------
cfg "[0]" release "$OUT/launch.toml"
launch_gpurun_elastic() { step "$1" 120 "$G" --nproc 1 --device "$DEV" --config "$OUT/launch.toml" --master-port 0 "$FIRST"; }
launch_gpurun_static() { step "$1" 120 "$G" --nproc 1 --device "$DEV" --master-port 0 "$FIRST"; }
launch_torchrun() { step "$1" 120 "${TORCHRUN[@]}" --master-port "$(free_port)" bench/anchors/first_allreduce.py; }
kinds=(gpurun_elastic gpurun_static); [[ $HAVE_TORCH == 1 && $DEV == cuda ]] && kinds+=(torchrun)
for r in $(seq 0 "$REPS"); do  # rep 0: warm-up (page cache of the shared libraries), not counted
  for k in "${kinds[@]}"; do "launch_$k" "launch_${k}_$r"; done
done

# ---- 2. training throughput ---------------------------------------------------------------
VARGS=(--model "$MODEL" --micro "$MICRO" --steps "$STEPS" --warmup "$WARMUP")
cfg "[0]" release "$OUT/train.toml"
step vit_bare 300 "$VIT" --mode bare "${VARGS[@]}" --device "$DEV" --json "$OUT/vit_bare.json"
step vit_runtime 300 "$G" --nproc 1 --device "$DEV" --config "$OUT/train.toml" --master-port 0 \
  "$VIT" --mode runtime "${VARGS[@]}" --json "$OUT/vit_runtime.json"
if [[ $HAVE_TORCH == 1 && $DEV == cuda ]]; then
  step vit_ddp 300 "${TORCHRUN[@]}" --master-port "$(free_port)" bench/anchors/ddp_vit.py \
    "${VARGS[@]}" --json "$OUT/vit_ddp.json"
  # like for like: gpurun steps AdamW with torch's fused kernel (gpurun::FusedAdamW)
  step vit_ddp_fused 300 "${TORCHRUN[@]}" --master-port "$(free_port)" bench/anchors/ddp_vit.py \
    "${VARGS[@]}" --fused --json "$OUT/vit_ddp_fused.json"
fi

# ---- 3. pause -> resume on one GPU (release and hold): resize() above, each in its own call
for mode in release hold; do step "resize_$mode" 100 "$SELF" --resize "$mode" "$B" "$OUT"; done

# ---- 4. offload bandwidth and the store ------------------------------------------------------
if [[ -x $B/bench/offload_bench ]]; then
  step offload 180 "$B/bench/offload_bench" --device "$DEV" --json "$OUT/offload.json"
fi
if [[ -x $B/bench/store_bench ]]; then
  SB=(--threads 16 --ops 20000 --rendezvous 2000,10000)
  step store_gpurun 200 "$B/bench/store_bench" "${SB[@]}"
  # the same server on one reactor thread (the design before the multi-threaded store)
  step store_gpurun_1t 100 "$B/bench/store_bench" --threads 16 --ops 20000 --server-threads 1
  if [[ $HAVE_TORCH == 1 ]]; then
    P=$(free_port); python3 bench/anchors/torch_store_server.py "$P" > "$OUT/torch_store_server.log" 2>&1 &
    TS=$!; sleep 3
    step store_torch 200 "$B/bench/store_bench" --host 127.0.0.1 --port "$P" "${SB[@]}"
    kill "$TS"; wait "$TS" 2>/dev/null
  fi
fi

# ---- the table --------------------------------------------------------------------------------
python3 - "$OUT" "$MODEL" "$DEV" <<'PY'
import glob, json, os, re, statistics, sys
from datetime import datetime

out, model, dev = sys.argv[1:4]
steps = {}
for line in open(os.path.join(out, "steps.tsv")):
    name, rc, s = line.rstrip("\n").split("\t")
    steps[name] = (int(rc), float(s))

def load(name):
    try:
        with open(os.path.join(out, name)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None

def jsonl(path):
    try:
        return [json.loads(l) for l in open(path) if l.strip()]
    except OSError:
        return []

rows, result = [], {"device": dev, "model": model}

def row(name, ours, anchor, ratio, target, met, unit="", digits=1):
    fmt = lambda v: "–" if v is None else (f"{v:,.{digits}f}{unit}" if isinstance(v, float) else str(v))
    rows.append((name, fmt(ours), fmt(anchor), "–" if ratio is None else f"{ratio:.3f}×", target,
                 {True: "yes", False: "**no**", None: "–"}[met]))

# 1. launch -> first all-reduce: median wall seconds of the timed reps (rep 0 is a warm-up).
def launch(kind):
    v = [s for n, (rc, s) in steps.items() if n.startswith(f"launch_{kind}_") and
         not n.endswith("_0") and rc == 0]
    bad = [n for n, (rc, s) in steps.items() if n.startswith(f"launch_{kind}_") and rc != 0]
    return (statistics.median(v) if v else None), v, bad

launches = {k: launch(k) for k in ("gpurun_elastic", "gpurun_static", "torchrun")}
result["launch"] = {k: {"median_s": m, "runs_s": v, "failed": bad} for k, (m, v, bad) in launches.items()}
tr = launches["torchrun"][0]
comm = "NCCL" if dev == "cuda" else "Gloo"
for k, label, target in (("gpurun_elastic", f"launch → first all-reduce done (gpurun --config: {comm} comm + all-reduce)", "≤ 0.5×"),
                         ("gpurun_static", "launch → first all-reduce done (plain gpurun, world of 1: no collective)", "info")):
    m = launches[k][0]
    ratio = m / tr if m and tr else None
    met = (ratio <= 0.5) if ratio is not None and target != "info" else None
    row(label, m, tr, ratio, target, met, " s", 2)

# 2. throughput
bare, rt, ddp = load("vit_bare.json"), load("vit_runtime.json"), load("vit_ddp.json")
result["throughput"] = {"bare": bare, "runtime": rt, "ddp": ddp}
ips = lambda j: j["images_per_s"] if j else None
pr = lambda a, b: a / b if a and b else None
m = (rt or bare or ddp or {}).get("model", model)
r = pr(ips(rt), ips(ddp))
row(f"ViT-{m} train images/s: gpurun runtime vs DDP", ips(rt), ips(ddp), r, "≥ 1.0×",
    None if r is None else r >= 1.0)
r = pr(ips(rt), ips(bare))
row(f"ViT-{m} train images/s: gpurun runtime vs bare LibTorch", ips(rt), ips(bare), r, "≥ 0.98×",
    None if r is None else r >= 0.98)
ddpf = load("vit_ddp_fused.json")
result["throughput"]["ddp_fused"] = ddpf
r = pr(ips(rt), ips(ddpf))
row(f"ViT-{m} train images/s: gpurun runtime vs DDP with AdamW(fused=True)", ips(rt), ips(ddpf),
    r, "info", None)
r = pr(ips(bare), ips(ddp))
row(f"ViT-{m} train images/s: bare LibTorch vs DDP", ips(bare), ips(ddp), r, "info", None)
pc = {k: j.get("parameters") for k, j in (("bare", bare), ("runtime", rt), ("ddp", ddp)) if j}
same = len(set(pc.values())) == 1 if len(pc) >= 2 else None
result["parameters"] = pc
row(f"ViT-{m} parameters (C++ / Python)", pc.get("runtime", pc.get("bare")), pc.get("ddp"), None,
    "equal", same if "ddp" in pc else None)

# 3. pause / resume: gpurun's decision (event log ts) -> the worker's trace / step log (unix ms)
def ts_ms(ts):
    return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp() * 1e3

resize = {}
for mode in ("release", "hold"):
    d = os.path.join(out, f"resize_{mode}")
    ev = jsonl(os.path.join(d, "events.jsonl"))
    tr_ = sorted((t for f in glob.glob(os.path.join(d, "trace", "*.jsonl")) for t in jsonl(f)),
                 key=lambda t: t["t_ms"])
    st = jsonl(os.path.join(d, "steps.jsonl"))
    dec = [e for e in ev if e.get("event") == "decision" and e.get("kind") == "resize"]
    pause = next((e for e in dec if e.get("active") == []), None)
    resume = next((e for e in dec if pause and e.get("active") and e["generation"] > pause["generation"]), None)
    m_ = {}
    if pause:
        p0 = ts_ms(pause["ts"])
        snap = next((t for t in tr_ if t["event"] == "generation" and t.get("world") == 0), None)
        m_["snapshot_write_ms"] = snap and snap["ms"]
        m_["snapshot_bytes"] = snap and snap["bytes"]
        if mode == "release":
            gone = next((e for e in ev if e.get("event") == "worker_exited" and ts_ms(e["ts"]) >= p0 - 1), None)
            m_["pause_ms"] = gone and ts_ms(gone["ts"]) - p0
        else:
            parked = next((t for t in tr_ if t["event"] == "parked" and t["t_ms"] >= p0 - 1), None)
            m_["pause_ms"] = parked and parked["t_ms"] - p0
            m_["offload_ms"] = parked and parked["ms"]
    if resume:
        r0 = ts_ms(resume["ts"])
        first = next((s for s in st if s["t_ms"] >= r0 - 1), None)
        m_["resume_ms"] = first and first["t_ms"] - r0
        gen = next((t for t in tr_ if t["event"] == "generation" and t["generation"] == resume["generation"]), None)
        m_["resume_state_comm_ms"] = gen and gen["ms"]
        start = next((t for t in tr_ if t["event"] == "start" and t["t_ms"] >= r0 - 1), None)
        m_["respawn_to_runtime_ms"] = start and start["t_ms"] - r0
    resize[mode] = m_
result["resize"] = resize
rel, hold = resize["release"], resize["hold"]
def ms(v):
    return None if v is None else float(v)
row("pause, release: decision → worker process gone (snapshot write "
    f"{ms(rel.get('snapshot_write_ms')) or 0:.0f} ms)", ms(rel.get("pause_ms")), None, None, "info", None, " ms")
row("resume, release: decision → first step running (respawn, CUDA, comm, state "
    f"{ms(rel.get('resume_state_comm_ms')) or 0:.0f} ms)", ms(rel.get("resume_ms")), None, None, "info", None, " ms")
row("pause, hold: decision → parked (snapshot write "
    f"{ms(hold.get('snapshot_write_ms')) or 0:.0f} ms)", ms(hold.get("pause_ms")), None, None, "info", None, " ms")
row("resume, hold: decision → first step running (comm, state "
    f"{ms(hold.get('resume_state_comm_ms')) or 0:.0f} ms)", ms(hold.get("resume_ms")), None, None, "info", None, " ms")
rows.append(("shrink / grow of a multi-GPU world", "not measurable on one GPU", "–", "–", "–", "–"))

# 4. offload and store
off = load("offload.json")
result["offload"] = off
if "offload" in steps and not off:
    row("offload_bench (no offload.json)", f"rc={steps['offload'][0]}", None, None, "–", None)
for o in (off or {}).get("rows", []):  # anchor: the pinned-copy ceiling of the same run
    g, q = o.get("gbps"), o.get("ratio_to_ceiling") or None  # 0: a ceiling row itself
    row(f"offload {o.get('name')} (GB/s)", g, g / q if g and q else None, q, "–", None, digits=2)
if off and "target_met" in off:
    row("offload_bench's own target", "met" if off["target_met"] else "not met", None, None,
        "offload_bench", bool(off["target_met"]))
def store(name):
    try:
        text = open(os.path.join(out, f"{name}.log")).read()
    except OSError:
        return None
    tp = re.search(r"= ([0-9.]+) ops/s", text)
    rd = {int(k): float(v) for k, v in re.findall(r"rendezvous: (\d+) connections: .*? in ([0-9.]+) ms", text)}
    return {"ops_per_s": float(tp.group(1)) if tp else None, "rendezvous_ms": rd}
sg, st_, s1 = store("store_gpurun"), store("store_torch"), store("store_gpurun_1t")
result["store"] = {"gpurun": sg, "torch": st_, "gpurun_1_thread": s1}
if s1 and s1["ops_per_s"]:
    a = st_ and st_["ops_per_s"]
    row("store throughput, one reactor thread (ops/s)", s1["ops_per_s"], a, pr(s1["ops_per_s"], a),
        "info", None, digits=0)
if sg:
    a = st_ and st_["ops_per_s"]
    r = pr(sg["ops_per_s"], a)
    row("store throughput, 16 threads × 20,000 ops (ops/s)", sg["ops_per_s"], a, r, "≥ 2×",
        None if r is None else r >= 2.0, digits=0)
    for k, v in sorted(sg["rendezvous_ms"].items()):
        a = st_ and st_["rendezvous_ms"].get(k)
        row(f"store rendezvous {k:,} conns: barrier released (time)", v, a, pr(v, a), "info", None, " ms")

result["steps"] = {k: {"rc": rc, "seconds": s} for k, (rc, s) in steps.items()}
result["table"] = [dict(zip(("benchmark", "gpurun", "anchor", "ratio", "target", "met"), r)) for r in rows]
with open(os.path.join(out, "bench-gpu.json"), "w") as f:
    json.dump(result, f, indent=1)
    f.write("\n")
failed = [f"{k} (rc {rc})" for k, (rc, s) in steps.items() if rc != 0]
print()
print("| benchmark | gpurun | anchor | ratio | target | met? |")
print("|---|---|---|---|---|---|")
for r in rows:
    print("| " + " | ".join(r) + " |")
print("\nAt world 1 the runtime skips the gradient all-reduce (an average over one rank is the "
      "identity); DDP runs its reducer (bucket copies + a 1-rank NCCL all-reduce). The pause/resume "
      "clocks start at gpurun's decision (event log) and stop at the worker's trace or step log.")
print(f"anchors: torchrun + PyTorch in the same run; failed steps: {', '.join(failed) or 'none'}; "
      f"logs and bench-gpu.json in {out}")
PY
