#!/usr/bin/env python3
"""Watches which processes hold a GPU, for bench/resize_latency.sh's "decision -> GPU free".

    bench/nvml_watch.py OUT.jsonl [GPU_INDEX=0] [PERIOD_S=0.002]

Polls NVML (nvidia-ml-py's pynvml: nvmlDeviceGetComputeRunningProcesses) every PERIOD_S seconds
and appends one JSON line whenever the set changes: {"t_ms": wall-clock ms (time.time()),
"pids": {"<pid>": used GPU memory in bytes or null}}; the first line is written at once. Reads
only: nothing on the GPU is set. Ends on SIGTERM or SIGINT (exit 0); exits 3 with a message when
NVML is not available.
"""
import json
import signal
import sys
import time


def main():
    out = sys.argv[1]
    index = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    period = float(sys.argv[3]) if len(sys.argv) > 3 else 0.002
    try:
        import pynvml
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    except Exception as e:  # no module, no driver, no such GPU
        print(f"nvml_watch: NVML is not available: {e}", file=sys.stderr)
        return 3
    running = [True]
    signal.signal(signal.SIGTERM, lambda *_: running.__setitem__(0, False))
    signal.signal(signal.SIGINT, lambda *_: running.__setitem__(0, False))
    last = None
    with open(out, "a") as f:
        while running[0]:
            try:
                procs = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
            except pynvml.NVMLError:  # a transient failure: poll again
                time.sleep(period)
                continue
            now = {str(p.pid): p.usedGpuMemory for p in procs}
            if now != last:
                f.write(json.dumps({"t_ms": time.time() * 1e3, "pids": now}) + "\n")
                f.flush()
                last = now
            time.sleep(period)
    return 0


if __name__ == "__main__":
    sys.exit(main())
