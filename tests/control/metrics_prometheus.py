#!/usr/bin/env python3
"""ctest metrics_prometheus: a real Prometheus (Debian's `prometheus`, scrape interval 1 s)
scrapes gpurun's /metrics (--metrics-port) of an elastic job on two simulated GPUs
(--simulate-gpus 2, fake workers) through a shrink and a grow (config edits). Its HTTP query
API must answer what the job's event log says, within one scrape interval:
  * world size: after each resize event, the set the event names (`to`);
  * resizes: sum(gpurun_resizes_total) = the resize events so far, by kind; the duration
    histogram's count and sum = the events' count and Σ total_ms;
  * energy per GPU: the last scraped gpurun_gpu_energy_joules_total of each GPU = the
    energy_summary's gpu_energy_j less what the GPU drew between that scrape and the end;
  * labels: job (the run id, honor_labels), slot, node, gpu, UUID, modelName, Hostname.
--dcgm-job-dir: DCGM exporter's per-GPU job files follow the GPUs (GPU 1's goes while it is
parked, comes back with the grow) and are gone after the job. docs/metrics.md.
Usage: metrics_prometheus.py GPURUN FAKE_WORKER
"""
import calendar
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

GPURUN, WORKER = sys.argv[1], sys.argv[2]
SCRAPE_S = 1.0
RUN_ID = "prom"
tmp = tempfile.mkdtemp(prefix="gpurun-prom-")
gpurun = prometheus = None


def fail(msg):
    print(f"metrics_prometheus: FAIL: {msg}", file=sys.stderr)
    for name in ("err.log", "prometheus.log"):
        path = os.path.join(tmp, name)
        if os.path.exists(path):
            print(f"-- {name}", file=sys.stderr)
            with open(path, errors="replace") as f:
                print("".join(f.readlines()[-25:]), file=sys.stderr)
    print("-- events (no worker_state)", file=sys.stderr)
    for e in events()[-25:]:
        if e["event"] != "worker_state":
            print(json.dumps(e), file=sys.stderr)
    raise SystemExit(1)


def events():
    path = os.path.join(tmp, "events.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def wait_for(seconds, what, fn):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        v = fn()
        if v:
            return v
        if gpurun is not None and gpurun.poll() is not None and what != "gpurun to exit":
            fail(f"gpurun exited ({gpurun.returncode}) while waiting for {what}")
        time.sleep(0.05)
    fail(f"no {what} within {seconds} s")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def unix(ts):  # the event log's RFC 3339 UTC with ms -> Unix seconds
    return calendar.timegm(time.strptime(ts[:19], "%Y-%m-%dT%H:%M:%S")) + float("0" + ts[19:-1])


def query(promql, at=None):
    args = {"query": promql}
    if at is not None:
        args["time"] = f"{at:.3f}"
    url = f"http://127.0.0.1:{prom_port}/api/v1/query?" + urllib.parse.urlencode(args)
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            body = json.load(r)
    except OSError:
        return None
    if body.get("status") != "success":
        fail(f"Prometheus refused {promql}: {body}")
    return body["data"]["result"]


def scalar(promql, at=None):  # the one sample's value, or None
    r = query(promql, at)
    return float(r[0]["value"][1]) if r and len(r) == 1 else None


def config(active):
    with open(os.path.join(tmp, "config.toml"), "w") as f:
        f.write(f"active_gpus = {active}\n")


def resize_events():
    return [e for e in events() if e["event"] == "resize"]


def dcgm_files():
    d = os.path.join(tmp, "dcgm")
    out = {}
    for name in os.listdir(d) if os.path.isdir(d) else []:
        with open(os.path.join(d, name)) as f:
            out[name] = f.read()
    return out


def check_resize(kind, n):
    """The n-th resize event is of `kind`; Prometheus shows its world size and the resize
    count from the first scrape one interval after it."""
    ev = wait_for(30, f"resize event #{n} ({kind})",
                  lambda: resize_events()[n - 1] if len(resize_events()) >= n else None)
    if ev["kind"] != kind:
        fail(f"resize #{n} is a {ev['kind']}, not a {kind}: {ev}")
    at = unix(ev["ts"]) + SCRAPE_S + 0.25  # one interval (and the scrape's own time) later
    wait_for(10, "Prometheus to have scraped past the resize",
             lambda: time.time() > at + 0.2 and
             (scalar(f'timestamp(gpurun_world_size{{job="{RUN_ID}"}})') or 0) >= at)
    world = scalar(f'gpurun_world_size{{job="{RUN_ID}"}}', at)
    if world != len(ev["to"]):
        fail(f"{SCRAPE_S} s after the {kind} to {ev['to']} Prometheus says world size {world}")
    logged = [e for e in resize_events() if unix(e["ts"]) <= at]
    total = scalar(f'sum(gpurun_resizes_total{{job="{RUN_ID}"}})', at)
    if total != len(logged):
        fail(f"Prometheus says {total} resizes, the event log {len(logged)}")
    by_kind = scalar(f'gpurun_resizes_total{{job="{RUN_ID}",kind="{kind}"}}', at)
    if by_kind != sum(1 for e in logged if e["kind"] == kind):
        fail(f"Prometheus says {by_kind} {kind} resizes")
    print(f"metrics_prometheus: {kind} to {ev['to']}: world size {world:g}, {total:g} resizes")


try:
    if shutil.which("prometheus") is None:
        fail("the 'prometheus' program is not installed: scripts/setup.sh installs Debian's "
             "prometheus package")
    os.makedirs(os.path.join(tmp, "w"))
    os.makedirs(os.path.join(tmp, "xdg"))
    with open(os.path.join(tmp, "w", "steps"), "w") as f:
        f.write("5\n")  # 5 steps per epoch, published in the progress file
    config("[0, 1]")
    env = dict(os.environ, XDG_RUNTIME_DIR=os.path.join(tmp, "xdg"))
    with open(os.path.join(tmp, "err.log"), "w") as err, \
            open(os.path.join(tmp, "out.log"), "w") as out:
        gpurun = subprocess.Popen(
            [GPURUN, "--simulate-gpus", "2", "--nproc", "2", "--master-port", "0", "--run-id",
             RUN_ID, "--config", os.path.join(tmp, "config.toml"), "--event-log",
             os.path.join(tmp, "events.jsonl"), "--metrics-port", "0", "--dcgm-job-dir",
             os.path.join(tmp, "dcgm"), WORKER, os.path.join(tmp, "w"), "200"],
            stdout=out, stderr=err, env=env)

    def metrics_port():
        with open(os.path.join(tmp, "err.log")) as f:
            m = re.search(r"metrics: http://127\.0\.0\.1:(\d+)/metrics", f.read())
        return m and int(m.group(1))

    port = wait_for(20, "'metrics: http://127.0.0.1:PORT/metrics' line", metrics_port)
    prom_port = free_port()
    with open(os.path.join(tmp, "prometheus.yml"), "w") as f:
        f.write(f"""global:
  scrape_interval: {SCRAPE_S:g}s
  scrape_timeout: 900ms
scrape_configs:
  - job_name: gpurun
    honor_labels: true   # the series' job label is the run id (docs/metrics.md)
    static_configs:
      - targets: ['127.0.0.1:{port}']
""")
    with open(os.path.join(tmp, "prometheus.log"), "w") as log:
        prometheus = subprocess.Popen(
            ["prometheus", f"--config.file={tmp}/prometheus.yml",
             f"--storage.tsdb.path={tmp}/tsdb", f"--web.listen-address=127.0.0.1:{prom_port}",
             "--log.level=warn"], stdout=log, stderr=log)
    world = wait_for(30, "a first scrape of gpurun_world_size = 2 in Prometheus",
                     lambda: scalar(f'gpurun_world_size{{job="{RUN_ID}"}}') == 2)
    # DCGM exporter's job files of both GPUs, and the labels that join with its series.
    wait_for(5, "DCGM job files 0 and 1", lambda: dcgm_files() == {"0": "prom\n", "1": "prom\n"})
    series = wait_for(10, "both GPUs' energy series",
                      lambda: (lambda r: r if r and len(r) == 2 else None)(
                          query(f'gpurun_gpu_energy_joules_total{{job="{RUN_ID}"}}')))
    for s in series:
        m = s["metric"]
        if not (m.get("UUID", "").startswith("GPU-") and m.get("gpu") == m.get("slot") and
                m.get("node") == "0" and m.get("modelName") and m.get("Hostname") and
                m.get("job") == RUN_ID):
            fail(f"the energy series lacks DCGM exporter's labels: {m}")

    config("[0]")  # shrink: GPU 1 leaves at the next boundary
    check_resize("shrink", 1)
    wait_for(2, "GPU 1's DCGM job file removed", lambda: dcgm_files() == {"0": "prom\n"})
    config("[0, 1]")  # grow: GPU 1 comes back
    check_resize("grow", 2)
    wait_for(2, "GPU 1's DCGM job file back", lambda: dcgm_files() == {"0": "prom\n", "1": "prom\n"})

    # The end: every worker stops 3 epochs after the last decision.
    last = [e for e in events() if e["event"] == "decision"][-1]
    with open(os.path.join(tmp, "w", "stop"), "w") as f:
        f.write(f"{last['epoch'] + 3}\n")
    wait_for(30, "gpurun to exit", lambda: gpurun.poll() is not None)
    if gpurun.returncode != 0:
        fail(f"gpurun exited {gpurun.returncode}")
    if dcgm_files():
        fail(f"DCGM job files left after the job: {dcgm_files()}")
    summary = [e for e in events() if e["event"] == "energy_summary"][-1]
    end = unix(summary["ts"])
    resizes = resize_events()
    hist = query(f'sum(gpurun_resize_duration_seconds_count{{job="{RUN_ID}"}})', end)
    hsum = query(f'sum(gpurun_resize_duration_seconds_sum{{job="{RUN_ID}"}})', end)
    if float(hist[0]["value"][1]) != len(resizes):
        fail(f"the duration histogram counts {hist}, the event log {len(resizes)} resizes")
    want = sum(e["total_ms"] for e in resizes) / 1000
    if abs(float(hsum[0]["value"][1]) - want) > 1e-6:
        fail(f"the duration histogram's sum is {hsum}, the events' total_ms {want} s")
    # Energy per GPU: the last scrape's counter, plus what the GPU drew (at the power it
    # reported) between that scrape and the end, is the summary's (the event log's windows).
    for slot, joules in summary["gpu_energy_j"].items():
        sel = f'{{job="{RUN_ID}",slot="{slot}"}}'
        samples = query(f"gpurun_gpu_energy_joules_total{sel}[2m]", end + 1)[0]["values"]
        power = query(f"gpurun_gpu_power_watts{sel}[2m]", end + 1)[0]["values"]
        t, v = float(samples[-1][0]), float(samples[-1][1])
        p = float(power[-1][1])
        if not 0 <= end - t <= SCRAPE_S + 0.5:
            fail(f"GPU {slot}: the last scrape was {end - t:.2f} s before the end")
        expected = v + p * (end - t)
        if abs(joules - expected) > p * 0.3 + 1:
            fail(f"GPU {slot}: the event log says {joules:.1f} J; Prometheus' last sample "
                 f"{v:.1f} J at {end - t:.2f} s before the end at {p:g} W gives {expected:.1f} J")
        values = [float(s[1]) for s in samples]
        if any(b < a for a, b in zip(values, values[1:])):
            fail(f"GPU {slot}: the energy counter went down: {values}")
        print(f"metrics_prometheus: GPU {slot}: event log {joules:.1f} J, Prometheus {v:.1f} J "
              f"{end - t:.2f} s before the end ({expected:.1f} J with {p:g} W since)")
    print("metrics_prometheus: OK")
finally:
    for proc in (gpurun, prometheus):
        if proc is not None and proc.poll() is None and proc.pid > 1:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    shutil.rmtree(tmp, ignore_errors=True)
