#!/usr/bin/env python3
"""The Python package's side of bench/elastic_nodes.sh (TRAINER=python): the MLP of
tests/worker_runtime/elastic_trainer (16 -> WIDTH, DEPTH-1 x WIDTH -> WIDTH, WIDTH -> 4) with
AdamW, tracked by gpurun.Runtime (the loop form: ``rt.epochs``, ``rt.loader``, a plain backward
and optimizer step), on random data; a boundary every step comes from the job's
``[boundary] every = 1``.

    gpurun ... python3 elastic_py_trainer.py OUT --width W --depth D --micro M --samples S --epochs E

The Python runtime writes no trace, so this program writes, under GPURUN_TRACE_DIR, the lines
of the C++ runtime's trace that bench/elastic_nodes.sh reads (gpu<slot>.jsonl, compact JSON,
wall-clock ms): "start" once, "first_step" when a step of a new generation is done, "boundary"
after every step done (wait_ms 0: the time the step was done stands for its report; kind
"continue" except a generation's first step), "comm_failure" when a step failed (a peer died;
``rt.step_failed``), and "load" (what, ms) for each load_state_dict of the model and the
optimizer (a joiner's received state: the part of the resize's `state` phase after the
broadcast). OUT/stop holding E: the job ends at the start of epoch E.
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.nn as nn
from torch.utils.data import TensorDataset

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "worker_runtime", "python"))
import gpurun  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("out")
for k, v in (("width", 4096), ("depth", 6), ("micro", 16), ("samples", 256), ("epochs", 100000)):
    ap.add_argument(f"--{k}", type=int, default=v)
a = ap.parse_args()
slot = int(os.environ.get("GPURUN_SLOT", "0"))
trace_dir = os.environ.get("GPURUN_TRACE_DIR")
trace = None
if trace_dir:
    os.makedirs(trace_dir, exist_ok=True)
    trace = open(os.path.join(trace_dir, f"gpu{slot}.jsonl"), "a")


def emit(event, **kw):
    if trace is None:
        return
    trace.write(json.dumps({"event": event, "pid": os.getpid(), **kw,
                            "t_ms": time.time() * 1e3}, separators=(",", ":")) + "\n")
    trace.flush()


emit("start", generation=-1)
torch.manual_seed(0)
layers = [nn.Linear(16, a.width), nn.ReLU()]
for _ in range(a.depth - 1):
    layers += [nn.Linear(a.width, a.width), nn.ReLU()]
net = nn.Sequential(*layers, nn.Linear(a.width, 4))
opt = torch.optim.AdamW(net.parameters(), lr=1e-4)
x = torch.randn(a.samples, 16)
data = TensorDataset(x, torch.randn(a.samples, 4))


def timed_load(what, load):
    def run(sd):
        t0 = time.perf_counter()
        load(sd)
        emit("load", what=what, ms=(time.perf_counter() - t0) * 1e3)
    return run


net.load_state_dict = timed_load("model", net.load_state_dict)
opt.load_state_dict = timed_load("optimizer", opt.load_state_dict)
rt = gpurun.Runtime()
rt.track(model=net, optimizer=opt)
loader = rt.loader(data, batch_size=a.micro, seed=1)
stop_path = os.path.join(a.out, "stop")
last_gen = None
for epoch in rt.epochs(a.epochs):
    if os.path.exists(stop_path):
        with open(stop_path) as f:
            s = f.read().strip()
        if s and epoch >= int(s):
            break
    for xb, yb in loader:
        opt.zero_grad()
        nn.functional.mse_loss(rt.model(xb), yb).backward()
        opt.step()
        g = rt.generation
        if rt.step_failed:  # a peer died in this step: it runs again in the next generation
            emit("comm_failure", generation=g)
            continue
        if g != last_gen:
            emit("first_step", generation=g)
        emit("boundary", generation=g, epoch=epoch, wait_ms=0,
             kind="continue" if g == last_gen else "first")
        last_gen = g
print(f"elastic_py_trainer slot {slot}: done at epoch {rt.epoch}, world {rt.world_size}", flush=True)
