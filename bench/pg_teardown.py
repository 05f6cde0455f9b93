#!/usr/bin/env python3
"""How long a hold-mode park spends ending torch's NCCL process group, and which way of ending
it is fastest: after one DDP step (its gradient buckets all-reduced) of a model of
``--mib`` MiB of float32 parameters on a one-rank NCCL group, each way runs ``--reps`` times,
each in a fresh process:

  destroy        dist.destroy_process_group()               (what the Python runtime does)
  no_monitor     the same with TORCH_NCCL_ENABLE_MONITORING=0 (no heartbeat monitor thread)
  abort          dist.distributed_c10d._abort_process_group() where torch has it
  thread         destroy_process_group() in a thread while the parameters are freed and the
                 cache emptied; the time is until both are done
  wake           destroy_process_group() inside gpurun's NcclWake (what the runtime does since
                 2026-12-04): NCCL's proxy UDS thread is woken, not waited for

Each child also prints what NVML says its process holds on the GPU after the teardown (MiB).

    python3 bench/pg_teardown.py [--mib 2000 --reps 5]     # GPU machine; reads only

Prints one JSON line per way: {"way": ..., "ms": [...], "median_ms": ...} (wall time, ms).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def child(way, mib):
    import tempfile
    import threading
    import torch
    import torch.distributed as dist
    store = dist.FileStore(tempfile.mktemp(prefix="pg_teardown_"), 1)
    dist.init_process_group("nccl", store=store, rank=0, world_size=1)
    n = mib * 2**20 // 4 // 8

    class Weights(torch.nn.Module):  # 8 tensors of mib / 8 MiB; the loss touches each
        def __init__(self):
            super().__init__()
            self.ws = torch.nn.ParameterList(torch.nn.Parameter(torch.zeros(n)) for _ in range(8))

        def forward(self, x):
            return sum((w * x).sum() for w in self.ws)

    model = Weights().cuda()
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[0])
    ddp(torch.ones((), device="cuda")).backward()  # one step: every bucket all-reduced
    torch.cuda.synchronize()
    del ddp
    t0 = time.perf_counter()
    if way == "abort":
        getattr(dist.distributed_c10d, "_abort_process_group")()
    elif way == "thread":
        th = threading.Thread(target=dist.destroy_process_group)
        th.start()
        for p in model.parameters():
            p.grad = None
            p.data = torch.empty(0, device="cuda")
        torch.cuda.empty_cache()
        th.join()
    elif way == "wake":
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                        "worker_runtime", "python"))
        from gpurun._comm import NcclWake
        with NcclWake():
            dist.destroy_process_group()
    else:
        dist.destroy_process_group()
    return (time.perf_counter() - t0) * 1e3, _process_mib()


def _process_mib():
    """This process's GPU memory in MiB per NVML (None without pynvml)."""
    try:
        import pynvml
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
            if p.pid == os.getpid():
                return round(p.usedGpuMemory / 2**20)
    except Exception:  # noqa: BLE001 - a measurement aid only
        pass
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=2000)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--child")
    ap.add_argument("--ways", default="destroy,no_monitor,abort,thread,wake")
    a = ap.parse_args()
    if a.child:
        ms, mib = child(a.child, a.mib)
        print(json.dumps({"ms": ms, "mib": mib}))
        return
    for way in a.ways.split(","):
        env = dict(os.environ, NCCL_NVLS_ENABLE="0")
        if way == "no_monitor":
            env["TORCH_NCCL_ENABLE_MONITORING"] = "0"
        ms, mibs, err = [], [], None
        for _ in range(a.reps):
            r = subprocess.run([sys.executable, __file__, "--child", way, "--mib", str(a.mib)],
                               capture_output=True, text=True, env=env)
            if r.returncode != 0:
                err = (r.stderr.strip().splitlines() or ["exit %d" % r.returncode])[-1]
                break
            got = json.loads(r.stdout.strip().splitlines()[-1])
            ms.append(round(got["ms"], 1))
            mibs.append(got["mib"])
        row = {"way": way, "ms": ms, "mib_after": mibs}
        if ms:
            row["median_ms"] = statistics.median(ms)
        if err:
            row["error"] = err
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
