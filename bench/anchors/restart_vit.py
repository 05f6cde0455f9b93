#!/usr/bin/env python3
"""Anchor for bench/python_gpu.sh's pause and resume: what a torchrun user does instead, on the
same model and data (examples/python/fmnist_vit.py's ViT and loader): at the pause, save a
checkpoint (model and optimizer state dicts, torch.save) and end the job; to resume, launch
again, build the model, load the checkpoint and train on.

    torchrun --standalone --nproc_per_node 1 bench/anchors/restart_vit.py --model h \\
        --batch 128 --save ckpt.pt --steps 5 --json save.json        # train, save, exit
    torchrun --standalone --nproc_per_node 1 bench/anchors/restart_vit.py --model h \\
        --batch 128 --resume ckpt.pt --steps 1 --json resume.json    # load, one step, exit

--json gets one line (rank 0): with --save {"save_ms", "saved_unix"} (torch.save's wall
time; s since 1970 when it returned), with --resume {"start_unix" (this process's first
line), "load_ms" (torch.load + load_state_dict), "first_step_unix" (the first step's loss
read back)}. The caller adds the process exit and the launch (bench/python_gpu.sh).
"""
import time

START_UNIX = time.time()

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "examples", "python"))
from fmnist_vit import MODELS, ViT, load  # noqa: E402


def die_with_parent():
    """torchrun starts its workers in a session of their own: a bench killed under a time limit
    (SIGKILL: no trap runs) took torchrun with it and left this worker holding its GPU for the
    runs after (2026-12-05, 518 MiB). Linux: SIGKILL when the parent (torchrun's agent) ends."""
    try:
        import ctypes
        import signal
        ppid = os.getppid()
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
        if os.getppid() != ppid:  # the parent ended before the prctl
            os._exit(1)
    except (OSError, AttributeError):
        pass  # not Linux: the caller's timeouts are all there is


def main():
    die_with_parent()
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", choices=sorted(MODELS), default="tiny")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--limit-train", type=int, default=4096)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--bf16", action="store_true")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--save", metavar="PATH")
    g.add_argument("--resume", metavar="PATH")
    p.add_argument("--json", required=True)
    a = p.parse_args()

    local = int(os.environ.get("LOCAL_RANK", 0))
    dev = torch.device("cuda", local) if torch.cuda.is_available() else torch.device("cpu")
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    dist.init_process_group("nccl" if dev.type == "cuda" else "gloo")
    train = load(a.data, "train", a.limit_train)
    torch.manual_seed(0)
    net = ViT(a.model).to(dev)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    out = {}
    if a.resume:
        t0 = time.perf_counter()
        ck = torch.load(a.resume, map_location=dev)
        net.load_state_dict(ck["model"])
        opt.load_state_dict(ck["optimizer"])
        del ck
        out.update(start_unix=START_UNIX, load_ms=(time.perf_counter() - t0) * 1e3)
    model = nn.parallel.DistributedDataParallel(
        net, device_ids=[local] if dev.type == "cuda" else None)
    sampler = torch.utils.data.distributed.DistributedSampler(train, seed=1)
    loader = torch.utils.data.DataLoader(train, batch_size=a.batch, sampler=sampler)
    for i, (x, y) in enumerate(loader):
        if i == a.steps:
            break
        x, y = x.to(dev), y.to(dev)
        opt.zero_grad()
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=a.bf16):
            loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        loss.item()
        if i == 0 and a.resume:
            out["first_step_unix"] = time.time()
    if a.save and dist.get_rank() == 0:
        t0 = time.perf_counter()
        torch.save({"model": net.state_dict(), "optimizer": opt.state_dict()}, a.save)
        out.update(save_ms=(time.perf_counter() - t0) * 1e3, saved_unix=time.time())
    if dist.get_rank() == 0:
        with open(a.json, "w") as f:
            f.write(json.dumps(out) + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
