#!/usr/bin/env python3
"""Anchor for bench/first_allreduce.cpp: launch -> first all-reduce done, the PyTorch way.

    python3 -m torch.distributed.run --nproc-per-node 1 --master-port P \\
        bench/anchors/first_allreduce.py

Each worker imports torch, joins the NCCL process group (eager communicator: device_id),
all-reduces one float64 on its GPU, reads the result back (which waits for the collective),
destroys the process group and exits. scripts/bench-gpu.sh times the whole torchrun command.
"""
import os
import time

T0 = time.perf_counter()

import torch  # noqa: E402  (the import is part of what is measured)
import torch.distributed as dist  # noqa: E402


def main():
    local_rank = int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local_rank)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    t = torch.ones(1, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    total = t.item()
    world = dist.get_world_size()
    ms = (time.perf_counter() - T0) * 1e3
    print(f"first_allreduce.py: rank {dist.get_rank()} of {world} on {device}: sum {total:.0f} "
          f"(expected {world}), {ms:.1f} ms from the script's start to the result", flush=True)
    dist.destroy_process_group()
    return 0 if total == world else 1


if __name__ == "__main__":
    raise SystemExit(main())
