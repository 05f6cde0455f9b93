#!/usr/bin/env bash
# A node's join, planned leave and loss in one elastic job over two gpurun processes ("nodes")
# on loopback (issue 46 item 6; docs/results.md#elastic-nodes-on-loopback), with ~1 GB of state,
# and the state's transfer rate against a raw TCP copy of the same bytes on the same link
# (bench/tcp_copy.py) and against Gloo's own broadcast of them (bench/gloo_copy.py,
# torch.distributed), measured in the same run, before and after the job.
#
#   bench/elastic_nodes.sh BUILD_DIR OUT_DIR
#   env: WIDTH=4096 DEPTH=6 (tests/worker_runtime/elastic_trainer's MLP: with AdamW's two moments
#        1.008 GB of state), MICRO=16, SAMPLES=256 (an epoch), EVERY=1 (a boundary every step),
#        NPROC=1 (CPU workers per node), REPEAT=3 (raw TCP copies before and after the job),
#        TRAINER=cpp (tests/worker_runtime/elastic_trainer, the C++ runtime) or python
#        (bench/elastic_py_trainer.py under PY: the same MLP and AdamW on the gpurun Python
#        package; it writes the trace lines read here itself, without the joiner's warm_ready:
#        no start-up columns).
#
# Node 0: `gpurun --nnodes 2 --node-rank 0 --master-port 0 --device cpu --nproc NPROC --config`;
# the script then, waiting on events (the workers' traces, node 0's event log), never on sleeps:
#   join 1   starts node 1's gpurun (`--node-rank 1 --master-addr 127.0.0.1 --master-port P`):
#            its slot is spawned as a warm joiner and admitted at a boundary, the state comes from
#            node 0's worker over the job's communicator (Gloo, TCP on 127.0.0.1);
#   leave    SIGTERM to node 1's gpurun: its slot leaves at the next boundary, it exits 0;
#   join 2   a new node 1 gpurun (node id 2, job slot 2000): a second join;
#   kill     kill -9 of that gpurun (its worker dies with it): node 0's worker goes on alone;
#   end      OUT/w/stop: the job ends at the next epoch.
# Times: the `resize` events of node 0's event log (monotonic ms per rank and phase,
# docs/control-protocol.md#resize-timings), node 0's worker's trace (GPURUN_TRACE_DIR: each
# boundary's wall time and wait, each generation's first step) and the script's own wall clock
# at each action (OUT/marks.txt). GPURUN_SNAPSHOT_PREPARE=0: no pause snapshot file is prepared
# (a pause is not measured here; 1 GB less of /dev/shm per worker). Everything else default
# (comm timeout 300 s, no --node-timeout). Prints a table last; logs under OUT_DIR.
set -uo pipefail
B=${1:?build dir}; OUT=${2:?out dir}
HERE=$(cd "$(dirname "$0")" && pwd)
G=$B/launcher/gpurun
PY=${PY:-/usr/bin/python3}
TRAINER=${TRAINER:-cpp}
case $TRAINER in
  cpp) T=("$B/tests/worker_runtime/elastic_trainer") ;;
  python) T=("$PY" "$HERE/elastic_py_trainer.py") ;;
  *) echo "elastic_nodes: TRAINER=$TRAINER: cpp or python" >&2; exit 2 ;;
esac
WIDTH=${WIDTH:-4096}; DEPTH=${DEPTH:-6}; MICRO=${MICRO:-16}; SAMPLES=${SAMPLES:-256}
EVERY=${EVERY:-1}; NPROC=${NPROC:-1}; REPEAT=${REPEAT:-3}
STANDBY=${STANDBY:-}  # true|false: node 0's [park] standby (unset: gpurun's default)
rm -rf "$OUT"; mkdir -p "$OUT/w"
OUT=$(cd "$OUT" && pwd)
export GPURUN_SNAPSHOT_PREPARE=0 GPURUN_TRACE_DIR=$OUT/trace
ARGS=("$OUT/w" --width "$WIDTH" --depth "$DEPTH" --micro "$MICRO" --samples "$SAMPLES"
  --epochs 100000)
# AdamW's state of the MLP (16 -> WIDTH, DEPTH-1 x WIDTH -> WIDTH, WIDTH -> 4): 3 x 4 bytes a
# parameter (the parameter and its two moments); the runtime's own count is in the events.
BYTES=$(((17 * WIDTH + (DEPTH - 1) * (WIDTH + 1) * WIDTH + 4 * WIDTH + 4) * 12))

now_ms() { local t=${EPOCHREALTIME/./}; echo $((t / 1000)); }
mark() { echo "$1 $(now_ms)" >> "$OUT/marks.txt"; }
gp0=; gp1=
stop_all() {  # the gpuruns this script started (their workers die with them)
  local p
  for p in $gp0 $gp1; do [[ -n $p && $p -gt 1 ]] && kill -9 "$p" 2> /dev/null; done
  return 0
}
trap stop_all EXIT
wait_for() {  # DESCRIPTION TIMEOUT_S COMMAND...: until COMMAND succeeds while node 0 runs
  local what=$1 end=$((SECONDS + $2)); shift 2
  until "$@"; do
    ((SECONDS > end)) && { echo "elastic_nodes: timeout waiting for $what" >&2; return 1; }
    kill -0 "$gp0" 2> /dev/null || { echo "elastic_nodes: node 0 exited while waiting for $what" >&2; return 1; }
    sleep 0.05
  done
}
n_lines() { local n; n=$(grep -c "$2" "$1" 2> /dev/null); echo "${n:-0}"; }
steps0() { n_lines "$OUT/trace/gpu0.jsonl" '"event":"boundary"'; }
steps_ge() { (($(steps0) >= $1)); }
wait_steps() { local n; n=$(steps0); wait_for "$1 more steps of node 0's worker" 600 steps_ge $((n + $1)); }
resizes_ge() { (($(n_lines "$OUT/events.jsonl" '"event": "resize"') >= $1)); }
gone() { ! kill -0 "$1" 2> /dev/null; }
port_known() { grep -qs "node 0's store listens on port" "$OUT/node0.log"; }
first_step_after() {  # node 0's worker did a step in a generation >= the last resize's
  local g
  g=$(grep '"event": "resize"' "$OUT/events.jsonl" | tail -1 | sed -nE 's/.*"generation": ([0-9]+).*/\1/p')
  grep -qs "\"event\":\"first_step\",\"pid\":[0-9]*,\"generation\":$g," "$OUT/trace/gpu0.jsonl"
}
start_node1() {  # LABEL: a gpurun for node rank 1 (its node id comes from node 0's counter)
  printf 'active_gpus = [%s]\n' "$(seq -s ', ' 0 $((NPROC - 1)))" > "$OUT/c1.toml"
  mark "$1_launch"
  "$G" --nnodes 2 --node-rank 1 --master-addr 127.0.0.1 --master-port "$PORT" --device cpu \
    --nproc "$NPROC" --config "$OUT/c1.toml" --event-log "$OUT/events_$1.jsonl" \
    "${T[@]}" "${ARGS[@]}" > "$OUT/node_$1.log" 2>&1 &
  gp1=$!
}
run_job() {
  printf 'active_gpus = [%s]\n[boundary]\nevery = %s\n' "$(seq -s ', ' 0 $((NPROC - 1)))" \
    "$EVERY" > "$OUT/c0.toml"
  [[ -z $STANDBY ]] || printf '[park]\nstandby = %s\n' "$STANDBY" >> "$OUT/c0.toml"
  mark node0_launch
  "$G" --master-port 0 --nnodes 2 --node-rank 0 --device cpu --nproc "$NPROC" \
    --config "$OUT/c0.toml" --event-log "$OUT/events.jsonl" "${T[@]}" "${ARGS[@]}" > "$OUT/node0.log" 2>&1 &
  gp0=$!
  wait_for "node 0's store port" 60 port_known || return 1
  PORT=$(sed -nE "s/.*node 0's store listens on port ([0-9]+).*/\1/p" "$OUT/node0.log" | head -1)
  wait_steps 5 || return 1  # node 0 trains alone

  start_node1 join1
  wait_for "the first join's resize" 600 resizes_ge 1 || return 1
  wait_for "a step after the first join" 600 first_step_after || return 1
  wait_steps 5 || return 1

  mark leave_term
  kill -TERM "$gp1"
  wait_for "the leaving gpurun's exit" 600 gone "$gp1" || return 1  # its own time, first
  local rc=0
  wait "$gp1" || rc=$?
  mark "leaver_exit_rc$rc"
  gp1=
  wait_for "the leave's resize" 600 resizes_ge 2 || return 1
  wait_for "a step after the leave" 600 first_step_after || return 1
  wait_steps 5 || return 1

  start_node1 join2
  wait_for "the second join's resize" 600 resizes_ge 3 || return 1
  wait_for "a step after the second join" 600 first_step_after || return 1
  wait_steps 5 || return 1

  mark kill
  kill -9 "$gp1"
  wait "$gp1" 2> /dev/null
  gp1=
  wait_for "the loss's resize" 600 resizes_ge 4 || return 1
  wait_for "a step after the loss" 600 first_step_after || return 1
  wait_steps 3 || return 1

  local e
  e=$(grep '"event":"boundary"' "$OUT/trace/gpu0.jsonl" | tail -1 | sed -nE 's/.*"epoch":([0-9]+).*/\1/p')
  echo $((e + 1)) > "$OUT/w/stop"
  mark stop
  local end=$((SECONDS + 600))
  while kill -0 "$gp0" 2> /dev/null && ((SECONDS < end)); do sleep 0.2; done
  gone "$gp0" || { echo "elastic_nodes: node 0 still runs 600 s after the stop" >&2; return 1; }
  rc=0
  wait "$gp0" || rc=$?
  mark "node0_exit_rc$rc"
  gp0=
}

echo "elastic_nodes: raw TCP copies and Gloo broadcasts of $BYTES bytes over 127.0.0.1 (before the job)"
"$PY" "$HERE/tcp_copy.py" "$BYTES" "$REPEAT" > "$OUT/tcp_before.jsonl" || exit 1
"$PY" "$HERE/gloo_copy.py" "$BYTES" "$REPEAT" > "$OUT/gloo_before.jsonl" || exit 1
echo "elastic_nodes: the job (TRAINER=$TRAINER WIDTH=$WIDTH DEPTH=$DEPTH NPROC=$NPROC), logs in $OUT"
run_job || { echo "elastic_nodes: the job failed; see $OUT/node*.log" >&2; stop_all; }
echo "elastic_nodes: raw TCP copies and Gloo broadcasts (after the job)"
"$PY" "$HERE/tcp_copy.py" "$BYTES" "$REPEAT" > "$OUT/tcp_after.jsonl" || exit 1
"$PY" "$HERE/gloo_copy.py" "$BYTES" "$REPEAT" > "$OUT/gloo_after.jsonl" || exit 1

"$PY" - "$OUT" "$NPROC" "$TRAINER" <<'PY'
import datetime, json, statistics, sys
out, nproc, trainer = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def lines(p):
    try: return [json.loads(l) for l in open(p) if l.strip()]
    except OSError: return []
def wall_ms(ts):
    return datetime.datetime.strptime(ts, "%Y-%m-%dT%H:%M:%S.%fZ").replace(
        tzinfo=datetime.timezone.utc).timestamp() * 1e3
ev = lines(out + "/events.jsonl")
tr = lines(out + "/trace/gpu0.jsonl")  # node 0's first worker: a member of every generation
marks = {}
for l in open(out + "/marks.txt"):
    k, v = l.split(); marks[k] = float(v)
tcp = lines(out + "/tcp_before.jsonl") + lines(out + "/tcp_after.jsonl")
tcp_gbs = statistics.median(t["gb_s"] for t in tcp) if tcp else float("nan")
gloo = lines(out + "/gloo_before.jsonl") + lines(out + "/gloo_after.jsonl")
gloo_gbs = statistics.median(t["gb_s"] for t in gloo) if gloo else float("nan")
bounds = [t for t in tr if t["event"] == "boundary"]
def report_t(b): return b["t_ms"] - b["wait_ms"]
def steady(gen):  # the median time from one step's report to the next within generation gen
    rs = [report_t(b) for b in bounds if b["generation"] == gen and b["kind"] == "continue"]
    d = [b - a for a, b in zip(rs, rs[1:])][1:]
    return statistics.median(d) if d else float("nan")
rows, notes = [], []
resizes = [e for e in ev if e["event"] == "resize"]
for i, r in enumerate(resizes):
    g = r["generation"]
    what = ("loss" if r["failed"] else "leave" if r["leavers"] else "join")
    # in the trace's order (its 1 ms stamps tie): the generation's first step done, the failed
    # collective before it (a loss), and the last boundary reported before either
    fi = next((i for i, t in enumerate(tr) if t["event"] == "first_step" and t["generation"] == g), None)
    first = tr[fi] if fi is not None else None
    fail_i = next((i for i, t in enumerate(tr[:fi or 0]) if t["event"] == "comm_failure" and
                   t["generation"] == g - 1), None)
    fail = tr[fail_i] if fail_i is not None else None
    upto = fail_i if fail_i is not None else (fi or 0)
    rb = next((t for t in reversed(tr[:upto]) if t["event"] == "boundary"), None)
    dec = next((e for e in ev if e["event"] == "decision" and e.get("generation") == g), None)
    ph = r["phases_ms"]; keys = list(ph)
    t_dec = sum(ph[k] for k in keys[:keys.index("decision") + 1]) if "decision" in ph else 0.0
    # origin "decision" (a node's join, leave or loss): total_ms runs from the decision
    dec_to_resumed = r["total_ms"] if r["origin"] == "decision" else r["total_ms"] - t_dec
    x = dict(n=i + 1, what=what, gen=g, world=len(r["to"]), phases=ph, total=r["total_ms"],
             dec_to_resumed=dec_to_resumed)
    x["steady_before"], x["steady_after"] = steady(g - 1), steady(g)
    joiners = [k for k in r["ranks"] if k["role"] == "joiner"]
    if joiners:
        j = joiners[0]
        x["bytes"] = j["bytes"]
        x["state_ms"] = j["ms"]["state"] - j["ms"]["comm"]
        x["comm_ms"] = j["ms"]["comm"] - j["ms"].get("ready", j["ms"].get("seen", 0))
        x["checksum_ms"] = j["ms"]["checksum"] - j["ms"]["state"]
        x["gbs"] = j["bytes"] / x["state_ms"] / 1e6
        jt = lines(f"{out}/trace/gpu{j['gpu']}.jsonl")
        st = next((t for t in jt if t["event"] == "start"), None)
        wr = next((t for t in jt if t["event"] == "warm_ready"), None)
        njoin = sum(1 for y in rows if "bytes" in y) + 1
        launch = marks.get(f"join{njoin}_launch")
        if st and wr and launch:
            x["startup_ms"] = wr["t_ms"] - launch  # gpurun launched -> the joiner is ready
            x["proc_ms"] = wr["t_ms"] - st["t_ms"]  # of it: the worker's own set-up
        if dec and wr:
            x["ready_to_decision"] = wall_ms(dec["ts"]) - wr["t_ms"]
    if rb and first:
        x["stall"] = first["t_ms"] - report_t(rb)  # last step's report -> the first step done
    if what == "leave" and "leave_term" in marks and dec:
        x["term_to_decision"] = wall_ms(dec["ts"]) - marks["leave_term"]
        x["redone"] = 1 if fail else 0
        ex = [k for k in marks if k.startswith("leaver_exit_rc")]
        if ex: x["leaver_exit"] = (marks[ex[0]] - marks["leave_term"], ex[0][len("leaver_exit_rc"):])
    if what == "loss" and "kill" in marks:
        if fail: x["kill_to_fail"] = fail["t_ms"] - marks["kill"]
        if dec: x["kill_to_decision"] = wall_ms(dec["ts"]) - marks["kill"]
        if first: x["kill_to_step"] = first["t_ms"] - marks["kill"]
        lastb = [b for b in bounds if b["t_ms"] <= marks["kill"]]
        if lastb: x["since_last_report"] = marks["kill"] - report_t(lastb[-1])
    rows.append(x)
json.dump(dict(rows=rows, tcp=tcp, gloo=gloo, marks=marks), open(out + "/summary.json", "w"), indent=1)

f = lambda v, d=0: "-" if v is None or v != v else f"{v:,.{d}f}"
print(f"\nelastic nodes on loopback: 2 gpurun nodes, {nproc} CPU worker(s) each (Gloo), "
      f"trainer {trainer}, node 0's worker's view; ms unless said")
print("raw TCP copy of the same bytes over 127.0.0.1 (bench/tcp_copy.py), GB/s: " +
      ", ".join(f"{t['gb_s']:.2f}" for t in tcp) + f" (median {tcp_gbs:.2f})")
print("Gloo broadcast of the same bytes (bench/gloo_copy.py, torch.distributed), GB/s: " +
      ", ".join(f"{t['gb_s']:.2f}" for t in gloo) + f" (median {gloo_gbs:.2f})")
print("\n| resize | world | steady step before / after | decision → training (phases) | "
      "last report → first step done | cost to the job (that − one steady step) |")
print("|---|---|---|---|---|---|")
for x in rows:
    cost = x.get("stall", float("nan")) - x["steady_after"]
    ph = ", ".join(f"{k} {v:,.0f}" for k, v in x["phases"].items())
    print(f"| {x['n']} {x['what']} (gen {x['gen']}) | {x['world']} | {f(x['steady_before'])} / "
          f"{f(x['steady_after'])} | {f(x['dec_to_resumed'])} ({ph}) | {f(x.get('stall'))} | "
          f"{f(cost)} |")
print("\n| join | gpurun launched → joiner ready (of it: the worker's set-up) | ready → admitted "
      "(decision) | comm | state GB | state ms | state GB/s | / raw TCP | / Gloo broadcast | checksum |")
print("|---|---|---|---|---|---|---|---|---|---|")
for x in rows:
    if "gbs" not in x: continue
    print(f"| {x['n']} (gen {x['gen']}) | {f(x.get('startup_ms'))} ({f(x.get('proc_ms'))}) | "
          f"{f(x.get('ready_to_decision'))} | {f(x['comm_ms'])} | {x['bytes'] / 1e9:.3f} | "
          f"{f(x['state_ms'])} | {x['gbs']:.2f} | **{x['gbs'] / tcp_gbs:.0%}** | {x['gbs'] / gloo_gbs:.0%} | "
          f"{f(x['checksum_ms'])} |")
for x in rows:
    if x["what"] == "leave":
        ex = x.get("leaver_exit", (float("nan"), "?"))
        print(f"\nleave (gen {x['gen']}): SIGTERM → decision {f(x.get('term_to_decision'))}, → "
              f"the leaving gpurun exited {f(ex[0])} (status {ex[1]}); steps redone by the "
              f"survivors: {x.get('redone', '?')}")
    if x["what"] == "loss":
        print(f"\nloss (gen {x['gen']}): kill -9 came {f(x.get('since_last_report'))} after the "
              f"survivor's last report; kill → its failed collective {f(x.get('kill_to_fail'))}, "
              f"→ decision {f(x.get('kill_to_decision'))}, → **next step done "
              f"{f(x.get('kill_to_step'))}**")
ends = [k for k in marks if k.startswith("node0_exit_rc")]
print(f"\nnode 0's gpurun exit status: {ends[0][len('node0_exit_rc'):] if ends else 'not reached'}")
PY
