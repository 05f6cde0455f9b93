#!/usr/bin/env python3
"""Anchor for bench/allreduce_bench.cpp: torch.distributed.all_reduce bandwidth over NCCL.

    python3 -m torch.distributed.run --nproc-per-node 2 --master-port P \\
        bench/anchors/allreduce_bw.py --mib 256 --iters 20 --warmup 5 --json torch.json

Each rank fills one float32 tensor of --mib MiB with rank + 1, all-reduces it --warmup times
untimed, then --iters times between two torch.cuda.synchronize() calls. Bus bandwidth as
nccl-tests defines it for all-reduce: busbw = 2 (n - 1) / n x bytes / seconds-per-call
(algbw = bytes / seconds-per-call). Rank 0 prints the result and writes --json.
"""
import argparse
import json
import os
import time

import torch
import torch.distributed as dist


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--json")
    a = ap.parse_args()
    local_rank = int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local_rank)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    rank, world = dist.get_rank(), dist.get_world_size()
    nbytes = a.mib << 20
    t = torch.full((nbytes // 4,), float(rank + 1), dtype=torch.float32, device=device)
    for _ in range(a.warmup):
        dist.all_reduce(t)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(a.iters):
        dist.all_reduce(t)
    torch.cuda.synchronize()
    per = (time.perf_counter() - t0) / a.iters
    algbw = nbytes / per / 1e9
    busbw = algbw * 2 * (world - 1) / world
    if rank == 0:
        print(f"allreduce_bw.py: world {world}, {a.mib} MiB float32, torch {torch.__version__}, "
              f"NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}: {per * 1e3:.3f} ms per "
              f"all_reduce, algbw {algbw:.2f} GB/s, busbw {busbw:.2f} GB/s", flush=True)
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"bench": "allreduce", "impl": "torch.distributed", "world": world,
                           "bytes": nbytes, "iters": a.iters, "ms_per_call": per * 1e3,
                           "algbw_gbps": algbw, "busbw_gbps": busbw,
                           "torch": torch.__version__}, f)
                f.write("\n")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
