#!/usr/bin/env python3
"""Fashion-MNIST with a Vision Transformer, elastic under gpurun (the gpurun Python package).

    gpurun --nproc 2 --device cpu --config config.toml python3 examples/python/fmnist_vit.py
    gpurun --nproc 8 --config config.toml python3 examples/python/fmnist_vit.py --model b

Edit config.toml while it trains (active_gpus = [0] shrinks, [0, 1] grows, [] pauses) and
the job follows at the next epoch boundary. Rank 0 shows a tqdm bar (train loss and accuracy)
and the validation accuracy after every epoch. --epochs 0 trains until stopped.
Models (torchvision's VisionTransformer, 28x28 images, patches of 7): tiny (CPU), b (ViT-B
sized: 12 layers, width 768), h (ViT-H sized: 32 layers, width 1280).
Data: the IDX files of Debian's dataset-fashion-mnist, or --data DIR.
--timings PATH appends one JSON line per epoch from rank 0 (bench/python_gpu.sh): epoch,
world, generation, pid, samples (over all ranks), seconds (the training loop only: no
boundary, no evaluation; CUDA synchronised at both ends); with --checksums also
start_checksum / end_checksum, a hash of the model's and optimizer's state when the epoch's
training starts and ends (equal across a pause and resume: end of the last epoch before it,
start of the first after it), first_step_unix (s since 1970: when the epoch's first step's
loss was read back, bench/python_gpu.sh's "edit -> first step"). --bf16: forward and loss under torch.autocast(bfloat16).
"""
import argparse
import hashlib
import json
import os
import sys
import time

import torch
import torch.nn as nn
import torchvision

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "worker_runtime", "python"))
import gpurun  # noqa: E402
from fmnist_data import DEFAULT_DIR, load  # noqa: E402,F401 (load: bench/anchors)

try:
    from tqdm import tqdm
except ImportError:  # the bar is optional
    tqdm = None

MODELS = {  # layers, heads, width, mlp width
    "tiny": (2, 4, 64, 128),
    "b": (12, 12, 768, 3072),
    "h": (32, 16, 1280, 5120),
}


class ViT(nn.Module):
    def __init__(self, size):
        super().__init__()
        layers, heads, width, mlp = MODELS[size]
        self.vit = torchvision.models.VisionTransformer(
            image_size=28, patch_size=7, num_layers=layers, num_heads=heads, hidden_dim=width,
            mlp_dim=mlp, num_classes=10)

    def forward(self, x):  # grey images: the patch embedding takes 3 channels
        return self.vit(x.expand(-1, 3, -1, -1))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", choices=sorted(MODELS), default="tiny")
    p.add_argument("--epochs", type=int, default=5, help="0: until stopped")
    p.add_argument("--batch", type=int, default=64, help="per rank")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--data", default=DEFAULT_DIR)
    p.add_argument("--limit-train", type=int, default=0)
    p.add_argument("--limit-val", type=int, default=2000)
    p.add_argument("--no-bar", action="store_true")
    p.add_argument("--timings", metavar="PATH", help="append one JSON line per epoch (rank 0)")
    p.add_argument("--checksums", action="store_true",
                   help="with --timings: the state's hash at each epoch's start and end")
    p.add_argument("--bf16", action="store_true", help="autocast the forward to bfloat16")
    a = p.parse_args()
    if a.checksums and not a.timings:
        p.error("--checksums needs --timings PATH (the checksums are written there)")

    train, val = load(a.data, "train", a.limit_train), load(a.data, "val", a.limit_val)
    rt = gpurun.Runtime()
    torch.manual_seed(0)
    with rt.skip_init():  # a joiner's random init would be overwritten by the handoff
        net = ViT(a.model)
    rt.track(model=net)  # on rt.device (a skipped init: empty storage there)
    opt = torch.optim.AdamW(net.parameters(), lr=a.lr)
    rt.track(optimizer=opt)
    loader = rt.loader(train, batch_size=a.batch, seed=1)
    epochs = a.epochs if a.epochs > 0 else sys.maxsize
    for epoch in rt.epochs(epochs):
        net.train()
        bar = None
        if rt.rank == 0 and tqdm and not a.no_bar:
            bar = tqdm(total=loader.steps_left(), desc=f"epoch {epoch} (world {rt.world_size})",
                       unit="step", dynamic_ncols=True)
        total = torch.zeros(3)
        record = a.timings and rt.rank == 0
        line = {"epoch": epoch, "world": rt.world_size, "generation": rt.generation,
                "pid": os.getpid()}
        if record and a.checksums:
            line["start_checksum"] = state_checksum(net, opt)
        sync(rt.device)
        begin = time.perf_counter()
        for x, y in loader:
            x, y = x.to(rt.device), y.to(rt.device)
            opt.zero_grad()
            with torch.autocast(rt.device.type, dtype=torch.bfloat16, enabled=a.bf16):
                out = rt.model(x)
                loss = nn.functional.cross_entropy(out, y)
            loss.backward()
            opt.step()
            if rt.step_failed:  # a peer died in this step: no update, its batch comes again
                continue
            total += torch.tensor([loss.item() * len(y), (out.argmax(1) == y).sum().item(), len(y)])
            if "first_step_unix" not in line:  # .item() waited for the step's loss
                line["first_step_unix"] = time.time()
            if bar:
                bar.set_postfix(loss=f"{total[0] / total[2]:.4f}", acc=f"{total[1] / total[2]:.3f}")
                bar.update(1)
        sync(rt.device)
        line["seconds"] = time.perf_counter() - begin
        if bar:
            bar.close()
        if torch.distributed.is_initialized():  # NCCL reduces CUDA tensors only
            total = total.to(rt.device)
            torch.distributed.all_reduce(total)
            total = total.cpu()
        if record:
            line["samples"] = int(total[2])
            if a.checksums:
                line["end_checksum"] = state_checksum(net, opt)
            with open(a.timings, "a") as f:
                f.write(json.dumps(line) + "\n")
        acc = evaluate(net, val, rt.device) if rt.rank == 0 else float("nan")
        if rt.rank == 0:
            print(f"epoch {epoch} world {rt.world_size} generation {rt.generation}: "
                  f"train loss {total[0] / total[2]:.4f} acc {total[1] / total[2]:.4f} "
                  f"val acc {acc:.4f}", flush=True)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.no_grad()
def state_checksum(net, opt):
    """A 64-bit hash (hex str) of the model's and optimizer's state dicts: every tensor's bytes
    weighted by their position and summed on the tensor's own device (cheap for ViT-H on a
    GPU), hashed with the names, shapes, dtypes and the non-tensor values by BLAKE2b."""
    h = hashlib.blake2b(digest_size=8)

    def feed(name, v):
        if isinstance(v, torch.Tensor):
            b = v.detach().reshape(-1).contiguous().view(torch.uint8).long()
            w = torch.arange(b.numel(), dtype=torch.int64, device=b.device)
            w.mul_(-7046029254386353131).add_(1442695040888963407).bitwise_or_(1)
            h.update(f"{name}:{v.dtype}:{tuple(v.shape)}:{int((b * w).sum())};".encode())
        elif isinstance(v, dict):
            for k in sorted(v, key=str):
                feed(f"{name}.{k}", v[k])
        elif isinstance(v, (list, tuple)):
            for i, x in enumerate(v):
                feed(f"{name}[{i}]", x)
        else:
            h.update(f"{name}={v!r};".encode())

    feed("model", net.state_dict())
    feed("optimizer", opt.state_dict())
    return h.hexdigest()


@torch.no_grad()
def evaluate(net, val, device):
    net.eval()
    right = 0
    for i in range(0, len(val), 256):
        x, y = val[i:i + 256]
        right += (net(x.to(device)).argmax(1).cpu() == y).sum().item()
    return right / len(val)


if __name__ == "__main__":
    main()
