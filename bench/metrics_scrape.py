#!/usr/bin/env python3
"""What a /metrics scrape costs the training (docs/metrics.md): the workers' step time with
no scraper, with one scrape a second (a Prometheus at a 1 s interval; DCGM exporter's default
is 30 s) and with 100 a second (a stress), interleaved over several rounds.

The job: gpurun --simulate-gpus 2 --nproc 2 --metrics-port 0 (the energy monitor on, so the
text carries every GPU's series), each worker a fixed CPU step (a pure-Python loop, ~10 ms of one
core) timed with perf_counter; a step time is the median over a worker's steps after its
first 20. The scrape runs on gpurun's io thread, never in a worker: what it can cost them is
CPU time. Run on an idle machine (other load is noise of the same size).

    /usr/bin/python3 bench/metrics_scrape.py build/launcher/gpurun [--steps 600] [--rounds 3]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

WORKER = r"""
import json, os, statistics, sys, time
times = []
for i in range(int(sys.argv[2])):
    t = time.perf_counter()
    s = 0
    for k in range(150000):  # ~10 ms of one core, no library: the same on every machine
        s += k * k
    times.append(time.perf_counter() - t)
with open(os.path.join(sys.argv[1], f"rank{os.environ['RANK']}.json"), "w") as f:
    json.dump({"median_ms": statistics.median(times[20:]) * 1e3,
               "p90_ms": sorted(times[20:])[int(0.9 * (len(times) - 20))] * 1e3}, f)
"""


def run(gpurun, steps, rate, tmp):
    out = tempfile.mkdtemp(dir=tmp)
    worker = os.path.join(tmp, "worker.py")
    with open(worker, "w") as f:
        f.write(WORKER)
    err_path = os.path.join(out, "err.log")
    with open(err_path, "w") as err:
        p = subprocess.Popen([gpurun, "--simulate-gpus", "2", "--nproc", "2", "--master-port", "0",
                              "--metrics-port", "0", "--no-python", "/usr/bin/python3", worker,
                              out, str(steps)], stdout=subprocess.DEVNULL, stderr=err,
                             env=dict(os.environ, XDG_RUNTIME_DIR=out))
    port = None
    while port is None and p.poll() is None:
        with open(err_path) as f:
            m = re.search(r"metrics: http://127\.0\.0\.1:(\d+)/metrics", f.read())
        port = m and int(m.group(1))
        time.sleep(0.01)
    latencies, size = [], 0
    cpu = {"s": 0.0, "t0": time.monotonic(), "t": time.monotonic()}
    tick = os.sysconf("SC_CLK_TCK")

    def watch_cpu():  # gpurun's own CPU time (all its threads, not its workers'): /proc
        while p.poll() is None:
            try:
                with open(f"/proc/{p.pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                cpu["s"] = (int(fields[11]) + int(fields[12])) / tick  # utime + stime
                cpu["t"] = time.monotonic()
            except (OSError, IndexError, ValueError):
                break
            time.sleep(0.1)

    watcher = threading.Thread(target=watch_cpu)
    watcher.start()

    def scrape():
        nonlocal size
        while p.poll() is None:
            t = time.perf_counter()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                    size = len(r.read())
            except OSError:
                break
            latencies.append(time.perf_counter() - t)
            time.sleep(max(0.0, 1.0 / rate - (time.perf_counter() - t)))

    scraper = threading.Thread(target=scrape) if rate and port else None
    if scraper:
        scraper.start()
    if p.wait() != 0:
        sys.exit(f"gpurun exited {p.returncode}: see {err_path}")
    if scraper:
        scraper.join()
    watcher.join()
    ranks = [json.load(open(os.path.join(out, f"rank{r}.json"))) for r in range(2)]
    return {"step_ms": statistics.mean(r["median_ms"] for r in ranks),
            "p90_ms": statistics.mean(r["p90_ms"] for r in ranks), "scrapes": len(latencies),
            "scrape_ms": statistics.median(latencies) * 1e3 if latencies else None,
            "bytes": size, "gpurun_cpu": cpu["s"] / max(1e-9, cpu["t"] - cpu["t0"])}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("gpurun")
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    rates = [0, 1, 100]
    results = {r: [] for r in rates}
    with tempfile.TemporaryDirectory(prefix="gpurun-metrics-bench-") as tmp:
        for rnd in range(args.rounds):
            for rate in rates if rnd % 2 == 0 else reversed(rates):
                r = run(args.gpurun, args.steps, rate, tmp)
                results[rate].append(r)
                print(f"round {rnd} scrapes/s {rate:>3}: step {r['step_ms']:.3f} ms "
                      f"(p90 {r['p90_ms']:.3f}), gpurun {r['gpurun_cpu'] * 100:.2f}% of a core, "
                      f"{r['scrapes']} scrapes"
                      + (f" of {r['bytes']} B, {r['scrape_ms']:.2f} ms each"
                         if r["scrape_ms"] else ""), flush=True)
    for rate in rates:
        m = statistics.median(r["step_ms"] for r in results[rate])
        # Paired per round (the machine's speed drifts between rounds): this rate / none.
        ratios = [a["step_ms"] / b["step_ms"] for a, b in zip(results[rate], results[0])]
        cpu = statistics.median(r["gpurun_cpu"] for r in results[rate])
        print(f"scrapes/s {rate:>3}: median step {m:.3f} ms, per round vs none "
              f"{', '.join(f'{(x - 1) * 100:+.1f}%' for x in ratios)} (median "
              f"{(statistics.median(ratios) - 1) * 100:+.1f}%); gpurun {cpu * 100:.2f}% of a core")


if __name__ == "__main__":
    main()
