#!/usr/bin/env python3
"""A small elastic Python trainer for tests/python/run_elastic.sh: gpurun.Runtime with a tracked
model + optimizer + LR scheduler, gpurun's loader, a sleep per epoch so that config edits land
between boundaries.

    gpurun --config config.toml --nproc 2 --device cpu python3 elastic_train.py OUT EPOCHS SLEEP_S

Each process appends to OUT/log.<slot>.<pid> one JSON line per epoch: epoch, rank, world,
generation, the indices it trained, the state checksum at the start of the epoch, and
(rank 0) the epoch's mean loss over all ranks. SLOW_LOAD=S: loading a received state takes S
seconds more in slot SLOW_LOAD_SLOT (default 2: the grow's joiner; the start's broadcast to
slot 1 is not slowed) (the process writes OUT/loading.<slot> with its pid first). STALL_RENDEZVOUS=G:
slot G's second process-group set-up (its first resize) writes OUT/rendezvous.<slot> (its pid)
and stalls (until killed) inside torch's init_process_group, after gpurun's arrival wait: the other
ranks wait in torch's own rendezvous for its address. OUT/fast, once it exists: no more sleep
per epoch. STOP_FIRST_INIT=G: slot G's first init_process_group writes OUT/rendezvous.<slot> and
stops itself (SIGSTOP). STALL_WRAP=G: slot G's first DDP construction writes OUT/wrap.<slot> and stalls until killed.
"""
import hashlib
import json
import os
import random
import signal
import sys
import threading
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils.data import TensorDataset

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "worker_runtime", "python"))
import gpurun  # noqa: E402

out, epochs, sleep_s = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
torch.manual_seed(0)
x = torch.randn(240, 8)
y = (x @ torch.randn(8, 1)).squeeze(1)
data = TensorDataset(x, y, torch.arange(240))
WORKERS = int(os.environ.get("WORKERS", "0"))  # DataLoader worker processes of rt.loader


class WithPid(torch.utils.data.Dataset):  # each sample says which process read it
    def __len__(self):
        return len(data)

    def __getitem__(self, i):
        return (*data[i], os.getpid())

if os.environ.get("STOP_FIRST_INIT") is not None and \
        os.environ.get("GPURUN_SLOT") == os.environ["STOP_FIRST_INIT"]:
    # STOP_FIRST_INIT=G: slot G's process, in its first init_process_group (a joiner's: the
    # grow's, after gpurun's arrival wait), writes OUT/rendezvous.<slot> (its pid) and stops
    # itself (SIGSTOP): the other ranks wait for it in torch's own rendezvous.
    real_first_init = dist.init_process_group

    def stopped_init(*args, **kwargs):
        dist.init_process_group = real_first_init
        with open(os.path.join(out, f"rendezvous.{os.environ['GPURUN_SLOT']}"), "w") as f:
            f.write(str(os.getpid()))
        os.kill(os.getpid(), signal.SIGSTOP)
        return real_first_init(*args, **kwargs)

    dist.init_process_group = stopped_init

if os.environ.get("STALL_WRAP") is not None:
    # STALL_WRAP=G: slot G's process, in its first DDP construction (a joiner's: inside the
    # resize, after the new group was made), writes OUT/wrap.<slot> (its pid) and stalls until
    # killed:
    # the other ranks wait in DDP's own broadcast for it.
    real_ddp_init = torch.nn.parallel.DistributedDataParallel.__init__

    def stalled_ddp_init(self, *args, **kwargs):
        if os.environ.get("GPURUN_SLOT") == os.environ["STALL_WRAP"] and not stalled_ddp_init.done:
            stalled_ddp_init.done = True
            with open(os.path.join(out, f"wrap.{os.environ['GPURUN_SLOT']}"), "w") as f:
                f.write(str(os.getpid()))
            threading.Event().wait()  # until the test's SIGKILL (or gpurun's at the end)
        real_ddp_init(self, *args, **kwargs)

    stalled_ddp_init.done = False
    torch.nn.parallel.DistributedDataParallel.__init__ = stalled_ddp_init

# BACKEND=gloo: the process group's backend (a CUDA node beside CPU nodes trains over gloo);
# DEVICE_MODEL=1: the model and batches on rt.device (cuda:<local slot> under --device cuda).
rt = gpurun.Runtime(backend=os.environ.get("BACKEND") or None)
DEV = rt.device if os.environ.get("DEVICE_MODEL") == "1" else torch.device("cpu")
with open(os.path.join(out, f"pid.{rt.slot}"), "w") as f:  # this slot's latest process
    f.write(str(os.getpid()))
if os.environ.get("STALL_RENDEZVOUS") == str(rt.slot):
    real_init, inits = dist.init_process_group, []

    def stalled_init(*args, **kwargs):
        inits.append(1)
        if len(inits) == 2:
            with open(os.path.join(out, f"rendezvous.{rt.slot}"), "w") as f:
                f.write(str(os.getpid()))
            threading.Event().wait()  # until the test's SIGKILL (or gpurun's at the end)
        return real_init(*args, **kwargs)

    dist.init_process_group = stalled_init
torch.manual_seed(100 + rt.slot)  # a different init per slot: the start broadcast equalises it
net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1)).to(DEV)
opt = torch.optim.AdamW(net.parameters(), lr=0.01)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.9)
rt.track(model=net, optimizer=opt, scheduler=sched)
if os.environ.get("SLOW_LOAD"):  # every rank tracks the same names; one slot's load is slow
    class Slow:
        def state_dict(self):
            return {}

        def load_state_dict(self, _):
            if str(rt.slot) != os.environ.get("SLOW_LOAD_SLOT", "2"):
                return
            with open(os.path.join(out, f"loading.{rt.slot}"), "w") as f:
                f.write(str(os.getpid()))
            time.sleep(float(os.environ["SLOW_LOAD"]))

    rt.track(slow=Slow())
loader = rt.loader(WithPid(), batch_size=8, seed=4, num_workers=WORKERS)
log = open(os.path.join(out, f"log.{rt.slot}.{os.getpid()}"), "a")
def rng_hash():  # torch's CPU generator and Python's random (hash() differs per process)
    h = hashlib.sha256(torch.get_rng_state().numpy().tobytes())
    h.update(repr(random.getstate()).encode())
    return h.hexdigest()[:16]


random.seed(200 + rt.slot)
for epoch in rt.epochs(epochs):
    start_sum = rt.checksum()
    rng_start = rng_hash()
    draw = torch.rand(1).item()  # each process's own RNG stream: ranks must differ
    random.random()
    seen, total, readers = [], torch.zeros(2), set()
    for xb, yb, ib, pb in loader:
        readers |= set(pb.tolist())
        opt.zero_grad()
        xb, yb = xb.to(DEV), yb.to(DEV)
        loss = nn.functional.mse_loss(rt.model(xb).squeeze(1), yb)
        loss.backward()
        opt.step()
        seen += ib.tolist()
        total += torch.tensor([loss.item() * len(xb), len(xb)])
    if dist.is_initialized():
        dist.all_reduce(total)
    sched.step()
    log.write(json.dumps({"epoch": epoch, "rank": rt.rank, "world": rt.world_size,
                          "generation": rt.generation, "seen": seen, "start_checksum": start_sum, "rng": draw,
                          "rng_start": rng_start, "rng_end": rng_hash(), "pid": os.getpid(),
                          "readers": sorted(readers), "checkpoint": rt.checkpoint_requested,
                          "loss": total[0].item() / total[1].item()}) + "\n")
    log.flush()
    # OUT/fast (written by a test once what it waits for happened): the remaining epochs go by
    # without their sleep. Only the pace changes, so every rank still trains every epoch.
    time.sleep(0.02 if os.path.exists(os.path.join(out, "fast")) else sleep_s)
if rt.stop_requested:  # gpurun asked for a stop (SIGTERM): the loop ended at a boundary
    r = rt.stop_reason  # gpurun.StopReason: the code, and gpurun's detail of the stop
    log.write(json.dumps({"stop": True, "epoch": rt.epoch, "pid": os.getpid(), "reason": str(r),
                          "signal": r.signal, "cause": r.cause, "text": r.text}) + "\n")
    log.flush()
print(f"elastic_train slot {rt.slot}: done", flush=True)
