#!/usr/bin/env python3
"""Anchor for bench/vit_step_bench.cpp: the same ViT trained under PyTorch DDP.

    python3 -m torch.distributed.run --nproc-per-node 1 --master-port P \\
        bench/anchors/ddp_vit.py --model h --micro 32 --steps 20 --warmup 5 --json ddp.json

The model mirrors examples/fashion_mnist/models.cpp layer for layer (same presets, same
parameter order, same init kinds; the printed parameter count must equal vit_step_bench's).
The loop mirrors vit_step_bench: a pool of random images and labels on the GPU, one
micro-batch per optimizer step gathered from it with index_select, forward and loss under
torch.autocast("cuda", dtype=torch.bfloat16), backward (DDP's bucketed all-reduce, 25 MiB
buckets like the runtime's), AdamW (torch's default implementation on CUDA: foreach;
--no-foreach for the per-parameter loop LibTorch has). The clock starts after --warmup steps
and stops after --steps more, with torch.cuda.synchronize() at both ends.
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
from torch.nn.parallel import DistributedDataParallel as DDP

# name: (img_size, patch, embed, depth, heads, mlp), as vit_preset() in models.hpp; 1 channel.
PRESETS = {
    "tiny": (28, 7, 64, 4, 4, 128),
    "small": (28, 4, 192, 6, 3, 768),
    "b": (224, 16, 768, 12, 12, 3072),
    "h": (224, 16, 1280, 32, 16, 5120),
}
IN_CHANNELS = 1
NUM_CLASSES = 10


def xavier_linear(n_in, n_out):
    linear = nn.Linear(n_in, n_out)
    nn.init.xavier_uniform_(linear.weight)
    nn.init.zeros_(linear.bias)
    return linear


class Block(nn.Module):
    """x += proj(MHSA(norm1(x))); x += fc2(GELU(fc1(norm2(x)))). x: [B, T, E]."""

    def __init__(self, embed, heads, mlp):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(embed)
        self.qkv = xavier_linear(embed, 3 * embed)
        self.proj = xavier_linear(embed, embed)
        self.norm2 = nn.LayerNorm(embed)
        self.fc1 = xavier_linear(embed, mlp)
        self.fc2 = xavier_linear(mlp, embed)

    def forward(self, x):
        b, t, e = x.shape
        qkv = self.qkv(self.norm1(x)).reshape(b, t, 3, self.heads, e // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)
        heads = F.scaled_dot_product_attention(q, k, v)  # [B, H, T, D]
        x = x + self.proj(heads.transpose(1, 2).reshape(b, t, e))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class ViT(nn.Module):
    """Pre-norm ViT: conv patch embedding, class token, learned positions, blocks, norm, head."""

    def __init__(self, img_size, patch, embed, depth, heads, mlp):
        super().__init__()
        self.img_size = img_size
        grid = img_size // patch
        self.patch_embed = nn.Conv2d(IN_CHANNELS, embed, patch, stride=patch)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed))
        self.pos_embed = nn.Parameter(torch.zeros(1, grid * grid + 1, embed))
        nn.init.normal_(self.cls_token, 0.0, 0.02)
        nn.init.normal_(self.pos_embed, 0.0, 0.02)
        self.blocks = nn.ModuleList(Block(embed, heads, mlp) for _ in range(depth))
        self.norm = nn.LayerNorm(embed)
        self.head = xavier_linear(embed, NUM_CLASSES)

    def forward(self, images):  # [B, 1, S, S] -> [B, classes]
        b = images.shape[0]
        x = self.patch_embed(images).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(b, -1, -1), x], 1) + self.pos_embed
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x)[:, 0])


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="h", choices=sorted(PRESETS))
    p.add_argument("--micro", type=int, default=32)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--weight-decay", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-foreach", action="store_true")
    p.add_argument("--fused", action="store_true", help="torch.optim.AdamW(fused=True)")
    p.add_argument("--json")
    a = p.parse_args()

    local_rank = int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local_rank)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    torch.backends.cuda.matmul.allow_tf32 = True  # as vit_step_bench (setAllowTF32CuBLAS)
    torch.manual_seed(a.seed)

    model = ViT(*PRESETS[a.model]).to(device)
    params = sum(t.numel() for t in model.parameters())
    ddp = DDP(model, device_ids=[local_rank])
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=a.weight_decay,
                            foreach=False if a.no_foreach else None,
                            fused=True if a.fused else None)
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        print(f"ddp_vit.py: model {a.model}, parameters: {params}, input "
              f"{IN_CHANNELS}x{model.img_size}x{model.img_size}, {device}, bf16 autocast, "
              f"torch {torch.__version__}", flush=True)

    steps_total = a.warmup + a.steps
    rows = min(8 * a.micro, a.micro * steps_total)
    pool_x = torch.randn(rows, IN_CHANNELS, model.img_size, model.img_size, device=device)
    pool_y = torch.randint(NUM_CLASSES, (rows,), device=device)

    t0 = None
    for s in range(steps_total):
        if s == a.warmup:
            torch.cuda.synchronize(device)
            t0 = time.perf_counter()
        idx = torch.tensor([(s * a.micro + i) % rows for i in range(a.micro)],
                           dtype=torch.long).to(device)
        x, y = pool_x.index_select(0, idx), pool_y.index_select(0, idx)
        opt.zero_grad()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(ddp(x), y)
        loss.backward()
        opt.step()
    torch.cuda.synchronize(device)
    seconds = time.perf_counter() - t0
    images = a.steps * a.micro * world
    loss_last = loss.item()
    if rank == 0:
        ips, step_ms = images / seconds, seconds * 1e3 / a.steps
        print(f"ddp_vit.py: model {a.model}, world {world}, micro {a.micro}: {a.steps} steps in "
              f"{seconds:.3f} s = {step_ms:.1f} ms/step, {ips:.1f} images/s "
              f"(last loss {loss_last:.4f})", flush=True)
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"bench": "vit_step", "mode": "ddp", "model": a.model,
                           "parameters": params, "img_size": model.img_size, "world": world,
                           "micro": a.micro, "warmup": a.warmup, "steps": a.steps,
                           "seconds": seconds, "step_ms": step_ms, "images_per_s": ips,
                           "loss_last": loss_last if math.isfinite(loss_last) else None,
                           "foreach": not a.no_foreach and not a.fused,
                           "fused": a.fused, "torch": torch.__version__}, f)
                f.write("\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
