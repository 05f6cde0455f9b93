#!/usr/bin/env python3
"""A trainer whose rank 0 does the program's own work between epochs, for
tests/python/run_busy_rank0.sh: the gpurun.Runtime loop form, and at the end of each epoch's
body rank 0 sleeps BUSY_S seconds (as rank-0-only validation or a checkpoint write would)
while the other ranks wait at the boundary.

    gpurun --config config.toml --nproc 2 --device cpu python3 busy_rank0.py OUT EPOCHS BUSY_S

Each process appends to OUT/log.<slot>.<pid> one JSON line per epoch: epoch, rank, world,
generation, the sample indices it trained.
"""
import json
import os
import sys
import time

import torch
import torch.nn as nn
from torch.utils.data import TensorDataset

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "worker_runtime", "python"))
import gpurun  # noqa: E402

out, epochs, busy_s = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
torch.manual_seed(0)
x = torch.randn(64, 4)
data = TensorDataset(x, x.sum(1), torch.arange(64))

rt = gpurun.Runtime()
net = nn.Linear(4, 1)
opt = torch.optim.SGD(net.parameters(), lr=0.01)
rt.track(model=net, optimizer=opt)
loader = rt.loader(data, batch_size=8, seed=1)
log = open(os.path.join(out, f"log.{rt.slot}.{os.getpid()}"), "a")
for epoch in rt.epochs(epochs):
    seen = []
    for xb, yb, ib in loader:
        opt.zero_grad()
        nn.functional.mse_loss(rt.model(xb).squeeze(1), yb).backward()
        opt.step()
        seen += ib.tolist()
    log.write(json.dumps({"epoch": epoch, "rank": rt.rank, "world": rt.world_size,
                          "generation": rt.generation, "seen": seen}) + "\n")
    log.flush()
    if rt.rank == 0:
        time.sleep(busy_s)  # "validation": rank 0 only, between this boundary and the next
print(f"busy_rank0 slot {rt.slot}: done", flush=True)
