#!/usr/bin/env python3
"""A plain PyTorch DDP training script, written as the PyTorch DDP tutorial writes one: nothing
in it knows gpurun. Run under gpurun or torchrun, it must train the same way.

    gpurun --nproc 2 --device cpu python3 ddp_plain.py OUT_DIR
    torchrun --nproc-per-node 2 ddp_plain.py OUT_DIR

Each rank writes OUT_DIR/result.<rank>: per-epoch mean loss (rank 0's view of the all-reduced
loss) and a SHA-256 of the final parameters, so the two launchers' runs can be compared.
"""
import hashlib
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main(out_dir):
    dist.init_process_group("gloo")  # env:// from the launcher: MASTER_ADDR/PORT, RANK, ...
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    x = torch.randn(512, 16)
    y = (x @ torch.randn(16, 1)).squeeze(1) + 0.1 * torch.randn(512)
    data = TensorDataset(x, y)
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=3)
    loader = DataLoader(data, batch_size=32, sampler=sampler)
    torch.manual_seed(1)
    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    lines = []
    for epoch in range(4):
        sampler.set_epoch(epoch)
        total = torch.zeros(2)
        for xb, yb in loader:
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(xb).squeeze(1), yb)
            loss.backward()
            opt.step()
            total += torch.tensor([loss.item() * len(xb), len(xb)])
        dist.all_reduce(total)
        lines.append(f"epoch {epoch} loss {total[0].item() / total[1].item():.10f}")
    digest = hashlib.sha256()
    for p in model.parameters():
        digest.update(p.detach().numpy().tobytes())
    lines.append(f"params {digest.hexdigest()}")
    lines.append(f"world {world} local_rank {os.environ['LOCAL_RANK']}")
    with open(os.path.join(out_dir, f"result.{rank}"), "w") as f:
        f.write("\n".join(lines) + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
