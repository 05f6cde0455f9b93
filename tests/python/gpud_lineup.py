#!/usr/bin/env python3
"""A gpud-form program whose code after each call makes a collective (rank 0 "validates", then
every rank meets at a barrier), for tests/python/run_gpud_lineup.sh:

    gpurun --config config.toml --nproc 2 --device cpu python3 gpud_lineup.py OUT EPOCHS

Its loop is `for epoch in range(EPOCHS)`. Rank 0 appends one line per call to OUT/calls.<pid>:
the program's epoch, the job's epoch the call trained (None: a catch-up call), the world size.
"""
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "worker_runtime", "python"))
from gpurun import elastic_scheduler  # noqa: E402

out, epochs = sys.argv[1], int(sys.argv[2])


# num_workers=0: this test is about lining up, not about the loader's worker processes
@elastic_scheduler(config_path=os.environ.get("GPURUN_CONFIG", "config.toml"), num_workers=0)
def train_one_epoch(model, dataset, optimizer, criterion, epoch, device):
    for x, y in dataset:
        optimizer.zero_grad()
        criterion(model(x), y).backward()
        optimizer.step()
    time.sleep(0.3)
    return epoch


torch.manual_seed(0)
x = torch.randn(128, 4)
data = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=16)
model = nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for epoch in range(epochs):
    trained = train_one_epoch(model, data, opt, nn.MSELoss(), epoch, "cpu")
    if dist.get_rank() == 0:
        with open(os.path.join(out, f"calls.{os.getpid()}"), "a") as f:
            f.write(f"{epoch} {trained} {dist.get_world_size()}\n")
    dist.barrier()  # the program's own collective after each call
