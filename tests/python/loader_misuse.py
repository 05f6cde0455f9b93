#!/usr/bin/env python3
"""Misuses of rt.loader / rt.steps under gpurun --config, for tests/python/run_loader_errors.sh.

    loader_misuse.py outside|small_global|steps_ok
outside: iterates the loader before epochs(); small_global: steps() with the config's
[batch] global; steps_ok: steps() for 2 epochs (no warning may be printed)."""
import os
import sys

import torch
from torch.utils.data import TensorDataset

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "worker_runtime", "python"))
import gpurun  # noqa: E402

mode = sys.argv[1]
rt = gpurun.Runtime()
net = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(net.parameters(), lr=0.01)
rt.track(model=net, optimizer=opt)
loader = rt.loader(TensorDataset(torch.randn(48, 4), torch.randn(48, 1)), batch_size=4)
if mode == "outside":
    for x, y in loader:
        pass
for epoch in rt.epochs(2):
    for step in rt.steps(loader):
        opt.zero_grad()
        for (x, y), w in step:
            (torch.nn.functional.mse_loss(rt.model(x), y) * w).backward()
        opt.step()
print(f"loader_misuse {mode}: slot {rt.slot} done", flush=True)
