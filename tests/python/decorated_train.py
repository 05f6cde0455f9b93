#!/usr/bin/env python3
"""The decorator form (gpurun.elastic) for tests/python/run_failure.sh and run_nodes.sh; FORM=loop:
the same epoch body in the loop form (``for epoch in rt.epochs(n)``, a plain backward and
optimizer step; docs/python.md#use), whose peer failures the runtime recovers from at the
loader's next step (docs/python.md#failures). Slot DIE_SLOT ends
itself (os._exit(1), as a crash would) before step DIE_STEP of epoch DIE_EPOCH; the others
must go on without it. DIE_AFTER_UPDATE=1 (decorator form): every rank all-reduces its loss
after each optimizer step (the program's own collective), and slot DIE_SLOT dies after that
step's update, before the all-reduce: the survivors' all-reduce fails after their update, and
the step must count once (docs/python.md#failures). DIE_HOW=raise: it raises ValueError
instead (the program's own error: the job fails, unless DROP_ON_ERROR=1). STEP_SLEEP (s) sleeps after each step (until OUT/fast exists).
HOLD_AT_WORLD=W: slot 0, at step 2 of the first epoch it trains at world W, writes OUT/held
before that step's forward and waits (30 s at most) for OUT/go: the others wait for it in the
step's all-reduce, so a node killed meanwhile fails that all-reduce (not a boundary).
HOLD_AT_WORLD=W1,W2,...: the same at the last world of the list, once slot 0 has trained at the
ones before it in that order (6,4: world 4 after world 6).

    gpurun --config config.toml --nproc 3 --device cpu python3 decorated_train.py OUT EPOCHS

Each process appends to OUT/steps.<slot>.<pid> one JSON line per optimizer step taken
(epoch, rank, world, indices), to OUT/epochs.<slot>.<pid> the state checksum at the start
of each epoch and (the loop form) to OUT/failed.<slot>.<pid> a line per step it saw fail
(``rt.step_failed``: no update; the step runs again).
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

out, epochs = sys.argv[1], int(sys.argv[2])
die = tuple(int(os.environ.get(k, "-1")) for k in ("DIE_SLOT", "DIE_EPOCH", "DIE_STEP"))
step_sleep = float(os.environ.get("STEP_SLEEP", "0"))
torch.manual_seed(0)
x = torch.randn(240, 8)
data = TensorDataset(x, x.sum(1), torch.arange(240))
net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
slot = int(os.environ.get("GPURUN_SLOT", "0"))
steps_log = open(os.path.join(out, f"steps.{slot}.{os.getpid()}"), "a")
epochs_log = open(os.path.join(out, f"epochs.{slot}.{os.getpid()}"), "a")
hold_worlds = [int(w) for w in os.environ.get("HOLD_AT_WORLD", "").split(",") if w]


def hold(rt):
    """HOLD_AT_WORLD: slot 0 waits before a step's forward until the test killed a node."""
    if not hold_worlds or slot != 0 or rt.world_size != hold_worlds[0]:
        return
    if len(hold_worlds) > 1:  # a world on the way to the one to hold at
        hold_worlds.pop(0)
        return
    if rt.step != 2:
        return
    hold_worlds.clear()
    open(os.path.join(out, "held"), "w").close()
    for _ in range(300):
        if os.path.exists(os.path.join(out, "go")):
            break
        time.sleep(0.1)


drop_on_error = os.environ.get("DROP_ON_ERROR") == "1"
after_update = os.environ.get("DIE_AFTER_UPDATE") == "1"
loader_kwargs = {"num_workers": int(os.environ.get("WORKERS", "0"))}


def train_one_epoch(loader, epoch, rt):
    if rt.step == 0:
        epochs_log.write(json.dumps({"epoch": epoch, "checksum": rt.checksum()}) + "\n")
        epochs_log.flush()
    for xb, yb, ib in loader:
        if (slot, epoch, rt.step) == die and not after_update:
            if os.environ.get("DIE_HOW") == "raise":  # the program's own error
                raise ValueError(f"slot {slot} found a bad batch at epoch {epoch}")
            if os.environ.get("DIE_HOW") == "exit2":  # the program ends itself with status 2
                sys.exit(2)
            os._exit(1)
        hold(rt)
        opt.zero_grad()
        loss = nn.functional.mse_loss(rt.model(xb).squeeze(1), yb)
        loss.backward()
        opt.step()
        if rt.step_failed:  # the loop form: a peer died in this step; it runs again
            with open(os.path.join(out, f"failed.{slot}.{os.getpid()}"), "a") as f:
                f.write(json.dumps({"epoch": epoch, "step": rt.step, "world": rt.world_size,
                                    "seen": ib.tolist()}) + "\n")
            continue
        steps_log.write(json.dumps({"epoch": epoch, "step": rt.step, "rank": rt.rank,
                                    "world": rt.world_size, "seen": ib.tolist()}) + "\n")
        steps_log.flush()
        if after_update:  # the program's own collective after the update (decorator form)
            if (slot, epoch, rt.step) == die:
                os._exit(1)  # the step's update happened on every rank, and it is logged
            torch.distributed.all_reduce(loss.detach())
        # OUT/fast (written by a test once its last resize happened): no more sleep per step;
        # only the pace changes, every rank still trains every step.
        if not os.path.exists(os.path.join(out, "fast")):
            time.sleep(step_sleep)


if os.environ.get("FORM", "decorator") == "loop":
    rt = gpurun.Runtime(drop_on_error=drop_on_error)
    rt.track(model=net, optimizer=opt)
    loader = rt.loader(data, batch_size=8, seed=2, **loader_kwargs)
    for epoch in rt.epochs(epochs):
        train_one_epoch(loader, epoch, rt)
else:
    rt = gpurun.elastic(model=net, optimizer=opt, dataset=data, batch_size=8, seed=2,
                        drop_on_error=drop_on_error,
                        loader_kwargs=loader_kwargs)(train_one_epoch)(epochs=epochs)
print(f"decorated_train slot {slot}: done, world {rt.world_size}", flush=True)
