#!/usr/bin/env python3
"""What a boundary every EVERY iterations costs the step iterator (gpurun.Runtime.iterations,
docs/python.md#the-step-iterator): a small GPT-shaped causal language model (nanoGPT's shape:
token + position embeddings, pre-norm transformer blocks, random token batches, gradient
accumulation, AdamW, bf16 autocast on CUDA) trained for ITERS iterations with a boundary every
EVERY iterations; every iteration ends with a device synchronisation and its wall time is
recorded. Run it twice under the same gpurun --config — EVERY = 25 and EVERY > ITERS (no
boundary) — and compare the mean iteration time (bench/python_steps_gpu.sh does, A B A B).

    gpurun --nproc 1 --config config.toml python3 bench/step_boundary.py OUT.json EVERY ITERS

Writes OUT.json: every, iters, the iteration times after WARM iterations (s), their mean and
median, the iterations that ended at a boundary and their mean, and this process's boundary
count. Model size: LAYERS, EMBD, HEADS, BLOCK, MICRO (micro-batch sequences), ACCUM (micro-
steps per iteration) from the environment (defaults: 6, 384, 6, 256, 12, 4; nanoGPT's
Shakespeare-char preset with 4 micro-steps)."""
import json
import os
import statistics
import sys
import time

import torch
import torch.nn as nn

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "worker_runtime", "python"))
import gpurun  # noqa: E402

out, every, iters = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
env = lambda k, d: int(os.environ.get(k, d))  # noqa: E731
LAYERS, EMBD, HEADS = env("LAYERS", 6), env("EMBD", 384), env("HEADS", 6)
BLOCK, MICRO, ACCUM, VOCAB, WARM = env("BLOCK", 256), env("MICRO", 12), env("ACCUM", 4), 65, 20


class Gpt(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok, self.pos = nn.Embedding(VOCAB, EMBD), nn.Embedding(BLOCK, EMBD)
        layer = nn.TransformerEncoderLayer(EMBD, HEADS, 4 * EMBD, dropout=0.0,
                                           batch_first=True, norm_first=True, activation="gelu")
        self.blocks = nn.TransformerEncoder(layer, LAYERS)
        self.norm, self.head = nn.LayerNorm(EMBD), nn.Linear(EMBD, VOCAB, bias=False)
        self.register_buffer("mask", torch.triu(torch.full((BLOCK, BLOCK), float("-inf")), 1))

    def forward(self, x, y):
        h = self.tok(x) + self.pos(torch.arange(x.shape[1], device=x.device))
        h = self.head(self.norm(self.blocks(h, mask=self.mask)))
        return nn.functional.cross_entropy(h.flatten(0, 1), y.flatten())


rt = gpurun.Runtime()
dev = rt.device
torch.manual_seed(1337)
net = Gpt()
opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
rt.track(model=net, optimizer=opt, stats={"best_val_loss": 1e9})
model = rt.model
data = torch.randint(VOCAB, (1_000_000,), dtype=torch.int64)  # the "dataset": random tokens
amp = (torch.autocast("cuda", dtype=torch.bfloat16) if dev.type == "cuda"
       else torch.autocast("cpu", enabled=False))
sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
times, at_boundary = [], []
t = time.perf_counter()
for it in rt.iterations(iters, every=every, grad_accum=ACCUM):
    for micro in rt.micro_steps():
        ix = torch.randint(len(data) - BLOCK - 1, (MICRO,), generator=micro.generator)
        x = torch.stack([data[i:i + BLOCK] for i in ix]).to(dev, non_blocking=True)
        y = torch.stack([data[i + 1:i + 1 + BLOCK] for i in ix]).to(dev, non_blocking=True)
        with amp:
            loss = model(x, y)
        (loss * micro.weight).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    sync()
    now = time.perf_counter()
    if it >= WARM:
        times.append(now - t)
        # the boundary after iteration it runs when the next one is asked for: it is in the
        # time of iteration it + 1, measured from here
        if it > WARM and it % every == 0:
            at_boundary.append(now - t)
    t = now
res = {"every": every, "iters": iters, "device": str(dev),
       "gpu": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
       "mean_s": statistics.mean(times), "median_s": statistics.median(times),
       "boundary_iterations": len(at_boundary),
       "boundary_iteration_mean_s": statistics.mean(at_boundary) if at_boundary else None,
       "model": dict(layers=LAYERS, embd=EMBD, heads=HEADS, block=BLOCK, micro=MICRO,
                     accum=ACCUM), "times_s": times}
with open(out, "w") as f:
    json.dump(res, f)
print(f"step_boundary: every {every}: {res['mean_s'] * 1e3:.2f} ms/iteration (median "
      f"{res['median_s'] * 1e3:.2f}), {len(at_boundary)} boundary iterations", flush=True)
