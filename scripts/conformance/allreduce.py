#!/usr/bin/env python3
"""A plain torch worker for gpurun: init_process_group(env://), one all_reduce, check the sum.

    gpurun --nproc 4 --device cpu python3 allreduce.py gloo
    gpurun --nproc 1 python3 allreduce.py nccl
"""
import os
import sys

import torch
import torch.distributed as dist

backend = sys.argv[1] if len(sys.argv) > 1 else "gloo"
dist.init_process_group(backend, init_method="env://")
rank, world = dist.get_rank(), dist.get_world_size()
dev = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if backend == "nccl" else torch.device("cpu")
t = torch.full((4,), float(rank + 1), device=dev)
dist.all_reduce(t)
expected = world * (world + 1) / 2
ok = bool(torch.all(t == expected))
print(f"rank {rank}/{world} backend={backend} all_reduce sum={t[0].item()} expected={expected} {'OK' if ok else 'MISMATCH'}", flush=True)
dist.destroy_process_group()
sys.exit(0 if ok else 1)
