#!/usr/bin/env python3
"""Fashion-MNIST with a small CNN, written as a gpud program: elastic under gpurun.

    PYTHONPATH=worker_runtime/python \\
      gpurun --nproc 2 --device cpu --config config.toml python3 examples/python/gpud_fmnist.py

Its torchrun form is this file with one line changed, the import:

    from gpurun import elastic_scheduler     ->     from gpud import elastic_scheduler

    torchrun --nproc_per_node=2 examples/python/gpud_fmnist.py

Nothing else differs: the program's own ``while True:`` epoch loop calls
``train_one_epoch(model, dataset, optimizer, criterion, epoch, device)`` once per epoch, and
``@elastic_scheduler(config_path="config.toml")`` makes each call elastic: edit config.toml
while it trains (``active_gpus = [0]`` shrinks the job, ``[0, 1]`` grows it, ``[]`` pauses it)
and the job follows before the next epoch. The function gets the current generation's DDP
model, a loader over the dataset that deals each sample once per epoch whatever the resizes
(the DataLoader's batch size, ``os.cpu_count() // 2`` workers), the slot's device and the job's
epoch; ``RANK`` and ``WORLD_SIZE`` in ``os.environ`` are the current generation's. Rank 0 shows a
tqdm bar and validates after every epoch. ``--epochs N`` stops after N epochs (0: until
stopped, Ctrl-C). Data: Debian's dataset-fashion-mnist, or ``--data DIR``.

A call returns None when this process joined the job later (a grow, a resume) and the job has
already trained that epoch: the loop goes on to the job's next epoch without validating again.
"""
import argparse
import os

import torch
import torch.nn as nn
from tqdm import tqdm

from fmnist_data import DEFAULT_DIR, load
from gpurun import elastic_scheduler


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),   # 16 x 14 x 14
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))  # 32 x 7 x 7
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(32 * 7 * 7, 64), nn.ReLU(),
                                  nn.Linear(64, 10))

    def forward(self, x):
        return self.head(self.features(x))


@elastic_scheduler(config_path="config.toml")
def train_one_epoch(model, dataset, optimizer, criterion, epoch, device):
    rank = int(os.environ.get("RANK", "0"))
    model.train()
    batches = tqdm(dataset, desc=f"epoch {epoch}", ncols=150) if rank == 0 else dataset
    total_loss, right, seen = 0.0, 0, 0
    for x, y in batches:
        x, y = x.to(device), y.to(device)
        optimizer.zero_grad()
        out = model(x)
        loss = criterion(out, y)
        loss.backward()
        optimizer.step()
        total_loss += loss.item() * len(y)
        right += (out.argmax(1) == y).sum().item()
        seen += len(y)
        if rank == 0:
            batches.set_postfix(loss=f"{total_loss / seen:.4f}", acc=f"{right / seen:.3f}")
    print(f"epoch {epoch} RANK={os.environ.get('RANK')} WORLD_SIZE={os.environ.get('WORLD_SIZE')}"
          f" pid {os.getpid()}: {seen} samples, train loss {total_loss / max(seen, 1):.4f}",
          flush=True)
    return epoch, total_loss / max(seen, 1)


@torch.no_grad()
def validate(model, loader, device):
    model.eval()
    right = total = 0
    for x, y in loader:
        right += (model(x.to(device)).argmax(1).cpu() == y).sum().item()
        total += len(y)
    return right / total


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--epochs", type=int, default=0, help="stop after N epochs (0: until stopped)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--data", default=DEFAULT_DIR)
    p.add_argument("--limit", type=int, default=0, help="train on the first N images (0: all)")
    p.add_argument("--limit-val", type=int, default=0, help="validate on the first N (0: all)")
    args = p.parse_args()

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")
    torch.manual_seed(0)
    model = Net().to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    criterion = nn.CrossEntropyLoss()
    num_workers = os.cpu_count() // 2
    train_set = load(args.data, "train", args.limit)
    train_loader = torch.utils.data.DataLoader(train_set, batch_size=args.batch_size, shuffle=True,
                                               num_workers=num_workers)
    val_loader = torch.utils.data.DataLoader(load(args.data, "test", args.limit_val),
                                             batch_size=256, num_workers=num_workers)

    epoch = 0
    while True:
        result = train_one_epoch(model, train_loader, optimizer, criterion, epoch, device)
        if result is not None and int(os.environ.get("RANK", "0")) == 0:
            trained, loss = result
            acc = validate(model, val_loader, device)
            print(f"epoch {trained} RANK={os.environ.get('RANK')} "
                  f"WORLD_SIZE={os.environ.get('WORLD_SIZE')}: validation accuracy {acc:.4f}"
                  f" (train loss {loss:.4f})", flush=True)
        epoch += 1
        if epoch == args.epochs:
            break


if __name__ == "__main__":
    main()
