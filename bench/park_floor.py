#!/usr/bin/env python3
"""The floor under a hold-mode park: what one process keeps on its GPU (nvidia-smi, MiB) with
an idle torch CUDA context, and after it trained a ViT step (cuBLAS/cuBLASLt GEMMs, cuDNN
convolution, fused attention, fused AdamW) and then freed everything torch can free (every
tensor, torch.cuda.empty_cache(), the cuBLAS/cuBLASLt workspaces), and the same again with the
step's gradients all-reduced by DDP over a one-rank NCCL group that is then destroyed (what a
parked gpurun worker has been through). The difference is what a parked worker cannot give
back without destroying its CUDA context: kernel images loaded on first use (NCCL's among
them), library handles. Compare with the hold-mode rows of bench/resize_latency.sh and
bench/python_gpu.sh.

    python3 bench/park_floor.py [--embed 1280 --depth 32]    # GPU machine; reads only

Prints one JSON line: {"idle_mib": ..., "after_training_freed_mib": ..., "peak_mib": ...,
"after_nccl_training_freed_mib": ..., "nccl_destroy_ms": ...}.
Each measurement runs in a fresh process (a context once used cannot be made idle again).
"""
import argparse
import json
import os
import subprocess
import sys


def used_mib(pid):
    out = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
        capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        p, mib = (x.strip() for x in line.split(","))
        if p == str(pid):
            return int(mib)
    return None


def child(mode, embed, depth):
    import torch
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    if mode == "idle":
        return {"idle_mib": used_mib(os.getpid())}
    heads = max(1, embed // 64)
    layer = torch.nn.TransformerEncoderLayer(embed, heads, 4 * embed, batch_first=True,
                                             norm_first=True, dropout=0.0)
    model = torch.nn.Sequential(*[layer for _ in range(1)]).cuda()  # one block, run depth times
    patch = torch.nn.Conv2d(1, embed, 16, 16).cuda()
    opt = torch.optim.AdamW(list(model.parameters()) + list(patch.parameters()), fused=True)
    net = model
    if mode == "trained_nccl":
        import tempfile
        import torch.distributed as dist
        store = dist.FileStore(tempfile.mktemp(prefix="park_floor_"), 1)
        dist.init_process_group("nccl", store=store, rank=0, world_size=1)
        net = torch.nn.parallel.DistributedDataParallel(model, device_ids=[0])
    x = torch.randn(8, 1, 224, 224, device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        h = patch(x).flatten(2).transpose(1, 2)
        for _ in range(depth):
            h = net(h)
        loss = h.float().square().mean()
    loss.backward()
    opt.step()
    torch.cuda.synchronize()
    peak = used_mib(os.getpid())
    out = {}
    if mode == "trained_nccl":
        import time
        del net
        t0 = time.perf_counter()
        dist.destroy_process_group()
        out["nccl_destroy_ms"] = round((time.perf_counter() - t0) * 1e3, 1)
    del x, h, loss, opt, model, patch, layer
    torch.cuda.synchronize()
    torch._C._cuda_clearCublasWorkspaces()
    torch.cuda.empty_cache()
    torch.cuda.synchronize()
    key = "after_nccl_training_freed_mib" if mode == "trained_nccl" else "after_training_freed_mib"
    out.update({key: used_mib(os.getpid()),
                ("peak_nccl_mib" if mode == "trained_nccl" else "peak_mib"): peak})
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--embed", type=int, default=1280)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--child", choices=["idle", "trained", "trained_nccl"])
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.child, a.embed, a.depth)))
        return
    out = {}
    for mode in ("idle", "trained", "trained_nccl"):
        r = subprocess.run([sys.executable, __file__, "--child", mode, "--embed", str(a.embed),
                            "--depth", str(a.depth)], capture_output=True, text=True)
        if r.returncode != 0:
            out[mode + "_error"] = r.stderr.strip().splitlines()[-1:]
            continue
        out.update(json.loads(r.stdout.strip().splitlines()[-1]))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
