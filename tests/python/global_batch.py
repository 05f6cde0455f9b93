#!/usr/bin/env python3
"""[batch] global under resizes, for tests/python/run_global_batch.sh: Runtime.steps() with a
fixed global batch; rank 0 appends "epoch loss world" lines to OUT/loss (the epoch's mean loss
over all its samples, all ranks). Between epochs (after the epoch's loss all-reduce, before
its boundary) each rank writes the epoch to OUT/reduced.<job slot>, sleeps SLEEP_S (none once
OUT/fast exists) and waits while OUT/hold exists (rank 0 then writes the epoch to OUT/held):
tests/python/run_nodes_global_batch.sh kills a node there, where no step is cut in half.

    gpurun --config config.toml --nproc N --device cpu python3 global_batch.py OUT EPOCHS SLEEP_S
"""
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils.data import TensorDataset

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "worker_runtime", "python"))
import gpurun  # noqa: E402

out, epochs, sleep_s = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
torch.manual_seed(0)
x = torch.randn(288, 8)
data = TensorDataset(x, torch.tanh(x @ torch.randn(8)))
net = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))
opt = torch.optim.SGD(net.parameters(), lr=0.1)
rt = gpurun.Runtime()
rt.track(model=net, optimizer=opt)
loader = rt.loader(data, batch_size=16, seed=5)
torch.set_default_dtype(torch.float32)
for epoch in rt.epochs(epochs):
    total = torch.zeros(2, dtype=torch.float64)
    for step in rt.steps(loader):
        opt.zero_grad()
        for (xb, yb), w in step:
            loss = nn.functional.mse_loss(rt.model(xb).squeeze(1), yb)
            (loss * w).backward()
            total += torch.tensor([loss.item() * len(yb), len(yb)], dtype=torch.float64)
        opt.step()
    if dist.is_initialized():
        dist.all_reduce(total)
    with open(os.path.join(out, f"reduced.{os.environ.get('GPURUN_SLOT', '0')}"), "w") as f:
        f.write(f"{epoch}\n")
    if rt.rank == 0:
        with open(os.path.join(out, "loss"), "a") as f:
            f.write(f"{epoch} {total[0].item() / total[1].item():.12g} {rt.world_size}\n")
    while os.path.exists(os.path.join(out, "hold")):
        if rt.rank == 0 and not os.path.exists(os.path.join(out, "held")):
            with open(os.path.join(out, "held.new"), "w") as f:
                f.write(f"{epoch}\n")
            os.rename(os.path.join(out, "held.new"), os.path.join(out, "held"))
        time.sleep(0.05)
    if not os.path.exists(os.path.join(out, "fast")):
        time.sleep(sleep_s)
