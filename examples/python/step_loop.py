#!/usr/bin/env python3
"""A step loop in nanoGPT's shape, elastic under gpurun: a small causal transformer language
model trained for ``--max-iters`` iterations on random batches (no dataset, no epochs), with
gradient accumulation, AdamW, a warm-up + cosine learning rate from the iteration number and
an evaluation on rank 0 every ``--eval-interval`` iterations that keeps ``best_val_loss``.

    PYTHONPATH=worker_runtime/python \\
      gpurun --nproc 2 --device cpu --config config.toml python3 examples/python/step_loop.py

Edit config.toml while it trains (``active_gpus = [0]`` shrinks the job, ``[0, 1]`` grows it,
``[]`` pauses it, ``[1]`` makes slot 1 rank 0) and the job follows at the next boundary (every
``--every`` iterations). What makes it elastic, against the same loop under torchrun:

* ``for it in rt.iterations(max_iters, every=..., grad_accum=...)``: ``it`` is the job's
  iteration (part of the handed-over state: a joiner resumes at the same ``it``);
* ``for micro in rt.micro_steps()``: this rank's share of the iteration's ``grad_accum``
  micro-batches, so the global batch stays ``grad_accum * batch_size`` whatever the world
  size; ``micro.generator`` draws the micro-batch (seeded by the iteration and the
  micro-step's index only: the same batch whichever rank draws it); ``micro.weight`` scales
  the loss;
* ``rt.track(stats={...})``: ``best_val_loss`` (computed on rank 0 only) is handed over at each
  resize, so it survives when another slot becomes rank 0.

The data: a fixed synthetic token stream (each token the previous one plus 1, 2 or 3, modulo
the vocabulary; its best loss is ln 3 = 1.0986), made from a seed on every rank.
``--log PATH``: rank 0 appends one JSON line per iteration (it, loss: the mean over the
iteration's micro-batches on all ranks, world, lr) and per evaluation (eval, train, val,
best_before, best, slot). ``--sleep S``: sleep S seconds after each iteration (demos and tests:
time to edit config.toml) until the file ``--sleep-until`` names exists.
"""
import argparse
import json
import math
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import gpurun


class CausalSelfAttention(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2)
                   for z in self.qkv(x).chunk(3, dim=2))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(c // self.heads)
        future = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        scores = scores.masked_fill(future, float("-inf"))
        y = F.softmax(scores, dim=-1) @ v
        return self.out(y.transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attn = CausalSelfAttention(width, heads)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class TinyLM(nn.Module):
    def __init__(self, vocab, context, width, heads, layers):
        super().__init__()
        self.tokens = nn.Embedding(vocab, width)
        self.positions = nn.Embedding(context, width)
        self.blocks = nn.Sequential(*(Block(width, heads) for _ in range(layers)))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)

    def forward(self, idx, targets):
        pos = torch.arange(idx.shape[1], device=idx.device)
        h = self.norm(self.blocks(self.tokens(idx) + self.positions(pos)))
        logits = self.head(h)
        return logits, F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def token_stream(n, vocab, seed):
    """n tokens: each the previous one plus 1, 2 or 3 (uniform), modulo vocab."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, 4, (n,), generator=g).cumsum(0) % vocab


def get_batch(data, batch_size, context, generator, device):
    ix = torch.randint(len(data) - context - 1, (batch_size,), generator=generator)
    x = torch.stack([data[i:i + context] for i in ix.tolist()])
    y = torch.stack([data[i + 1:i + 1 + context] for i in ix.tolist()])
    return x.to(device), y.to(device)


def get_lr(it, a):
    if it < a.warmup_iters:
        return a.lr * (it + 1) / (a.warmup_iters + 1)
    progress = (it - a.warmup_iters) / max(1, a.max_iters - a.warmup_iters)
    return a.min_lr + 0.5 * (1 + math.cos(math.pi * min(1.0, progress))) * (a.lr - a.min_lr)


@torch.no_grad()
def estimate_loss(model, splits, a, device):
    """Mean loss over --eval-iters fixed batches of each split (the same batches every time)."""
    model.eval()
    out = {}
    for name, data in splits.items():
        g = torch.Generator().manual_seed(1000)
        out[name] = sum(model(*get_batch(data, a.batch_size, a.context, g, device))[1].item()
                        for _ in range(a.eval_iters)) / a.eval_iters
    model.train()
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--max-iters", type=int, default=200)
    p.add_argument("--every", type=int, default=25, help="a boundary every N iterations")
    p.add_argument("--grad-accum", type=int, default=8, help="micro-batches per iteration (all ranks)")
    p.add_argument("--batch-size", type=int, default=8, help="sequences per micro-batch")
    p.add_argument("--context", type=int, default=32)
    p.add_argument("--vocab", type=int, default=32)
    p.add_argument("--width", type=int, default=48)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--min-lr", type=float, default=3e-4)
    p.add_argument("--warmup-iters", type=int, default=10)
    p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument("--eval-interval", type=int, default=10)
    p.add_argument("--eval-iters", type=int, default=4)
    p.add_argument("--log", metavar="PATH", help="rank 0 appends JSON lines (iterations, evaluations)")
    p.add_argument("--sleep", type=float, default=0.0)
    p.add_argument("--sleep-until", metavar="PATH", default="")
    a = p.parse_args()

    rt = gpurun.Runtime()
    device = rt.device
    data = token_stream(50_000, a.vocab, seed=7)
    splits = {"train": data[:45_000], "val": data[45_000:]}

    torch.manual_seed(1337)
    raw_model = TinyLM(a.vocab, a.context, a.width, a.heads, a.layers)
    rt.track(model=raw_model)  # on rt.device
    optimizer = torch.optim.AdamW(raw_model.parameters(), lr=a.lr, betas=(0.9, 0.95),
                                  weight_decay=0.1)
    stats = {"best_val_loss": 1e9}
    rt.track(optimizer=optimizer, stats=stats)
    model = rt.model  # this generation's DDP model, whatever the resizes

    for it in rt.iterations(a.max_iters, every=a.every, grad_accum=a.grad_accum, seed=1):
        lr = get_lr(it, a)
        for group in optimizer.param_groups:
            group["lr"] = lr
        if it % a.eval_interval == 0 and rt.rank == 0:
            losses = estimate_loss(raw_model, splits, a, device)
            best_before = stats["best_val_loss"]
            stats["best_val_loss"] = min(best_before, losses["val"])
            print(f"iter {it}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}, "
                  f"best val loss {stats['best_val_loss']:.4f}", flush=True)
            write(a.log, {"eval": it, "train": losses["train"], "val": losses["val"],
                          "best_before": best_before, "best": stats["best_val_loss"],
                          "slot": rt.slot})
        loss_sum = torch.zeros((), device=device)
        for micro in rt.micro_steps():
            x, y = get_batch(splits["train"], a.batch_size, a.context, micro.generator, device)
            _, loss = model(x, y)
            (loss * micro.weight).backward()
            loss_sum += loss.detach()
        if a.grad_clip:
            torch.nn.utils.clip_grad_norm_(raw_model.parameters(), a.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if rt.step_failed:  # a peer died in this iteration: no update, it runs again (the
            continue        # program's own all-reduce below would raise on the broken group)
        if rt.world_size > 1:
            dist.all_reduce(loss_sum)  # the mean over the iteration's micro-batches, all ranks
        if rt.rank == 0:
            loss = loss_sum.item() / a.grad_accum
            print(f"iter {it}: loss {loss:.4f}, lr {lr:.2e}, world {rt.world_size}", flush=True)
            write(a.log, {"it": it, "loss": loss, "world": rt.world_size, "lr": lr})
        if a.sleep and not os.path.exists(a.sleep_until):
            time.sleep(a.sleep)
    if rt.rank == 0:
        print(f"done: {a.max_iters} iterations, best val loss {stats['best_val_loss']:.4f}",
              flush=True)


def write(path, line):
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(line) + "\n")


if __name__ == "__main__":
    main()
