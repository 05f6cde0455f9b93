#!/usr/bin/env python3
"""Where a fresh CUDA process's first training step goes (read-only probe, one GPU).

Each variant runs in a fresh process (python3 bench/first_step_probe.py VARIANT ...): import
torch, build examples/python/fmnist_vit.py's ViT on the meta device and materialise it empty
on cuda:0 (as a joiner does), then, in order:
  preload  (variants *preload*) dlopen cuDNN's and cuBLAS's libraries before any CUDA call
           (no context: what a standby could do while it waits)
  context  torch.cuda.set_device + a 1-element tensor, synchronised
  warm     (variants warm*) the gpurun package's _WarmUp, joined
  reserve  (variant reserve) one torch.empty of --reserve-gib, freed (the caching allocator
           keeps the segment)
  step1..3 AdamW training steps of --batch random 28x28 images, each ended by loss.item()
Prints one JSON line per process (ms for each phase); `all` runs every variant --reps times
and prints a table (medians) and, for variant prof, the first step's top torch.profiler rows
by self CPU time. Never sets anything on the GPU.

  python3 bench/first_step_probe.py all --model h --batch 128 --reps 2
"""
import argparse
import ctypes
import glob
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
VARIANTS = ("bare", "warm", "preload", "warm_preload", "reserve", "prof")


def preload():
    """dlopen every cuDNN / cuBLAS library beside torch's (no CUDA call). Returns the names."""
    import torch
    roots = [os.path.join(os.path.dirname(torch.__file__), "lib")]
    try:
        import nvidia
        roots += [os.path.join(p, sub, "lib") for p in nvidia.__path__
                  for sub in ("cudnn", "cublas")]
    except ImportError:
        pass
    names = []
    for root in roots:
        for pattern in ("libcudnn*.so*", "libcublas*.so*"):
            for path in sorted(glob.glob(os.path.join(root, pattern))):
                try:
                    ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
                    names.append(os.path.basename(path))
                except OSError:
                    pass
    return names


def one(a):
    t = {}
    t0 = time.perf_counter()
    import torch
    sys.path.insert(0, os.path.join(HERE, "..", "examples", "python"))
    sys.path.insert(0, os.path.join(HERE, "..", "worker_runtime", "python"))
    import fmnist_vit  # noqa: E402
    t["import"] = (time.perf_counter() - t0) * 1e3
    with torch.device("meta"):
        net = fmnist_vit.ViT(a.model)
    if "preload" in a.variant:
        t1 = time.perf_counter()
        t["preloaded"] = len(preload())
        t["preload"] = (time.perf_counter() - t1) * 1e3
    t1 = time.perf_counter()
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    torch.zeros(1, device=dev)
    torch.cuda.synchronize()
    t["context"] = (time.perf_counter() - t1) * 1e3
    net = net.to_empty(device=dev)
    with torch.no_grad():
        for p in net.parameters():
            p.normal_(0, 0.02)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-4)
    torch.cuda.synchronize()
    if a.variant.startswith("warm") or a.variant == "prof":
        from gpurun.runtime import _WarmUp
        t1 = time.perf_counter()
        _WarmUp(dev, 0).finish()
        t["warm"] = (time.perf_counter() - t1) * 1e3
    if a.variant == "reserve":
        t1 = time.perf_counter()
        x = torch.empty(int(a.reserve_gib * 2**30), dtype=torch.uint8, device=dev)
        del x
        t["reserve"] = (time.perf_counter() - t1) * 1e3
    x = torch.randn(a.batch, 1, 28, 28, device=dev)
    y = torch.randint(0, 10, (a.batch,), device=dev)
    torch.cuda.synchronize()

    def step():
        opt.zero_grad()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=a.bf16):
            loss = torch.nn.functional.cross_entropy(net(x), y)
        loss.backward()
        opt.step()
        return loss.item()

    for i in (1, 2, 3):
        t1 = time.perf_counter()
        if a.variant == "prof" and i == 1:
            from torch.profiler import ProfilerActivity, profile
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                step()
            t[f"step{i}"] = (time.perf_counter() - t1) * 1e3
            rows = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:25]
            t["top"] = [(e.key, round(e.self_cpu_time_total / 1e3, 1), e.count) for e in rows]
        else:
            step()
            t[f"step{i}"] = (time.perf_counter() - t1) * 1e3
    t["reserved_mib"] = torch.cuda.memory_reserved(dev) >> 20
    t["segments"] = torch.cuda.memory_stats(dev).get("segment.all.current", 0)
    print(json.dumps({k: (round(v, 1) if isinstance(v, float) else v) for k, v in t.items()}))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("variant", choices=VARIANTS + ("all",))
    p.add_argument("--model", default="h")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--bf16", action="store_true")
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--reserve-gib", type=float, default=12)
    a = p.parse_args()
    if a.variant != "all":
        return one(a)
    results = {v: [] for v in VARIANTS}
    for _ in range(a.reps):
        for v in VARIANTS:
            cmd = [sys.executable, os.path.abspath(__file__), v, "--model", a.model, "--batch",
                   str(a.batch), "--reserve-gib", str(a.reserve_gib)] + (["--bf16"] if a.bf16 else [])
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
            line = next((l for l in out.stdout.splitlines() if l.startswith("{")), None)
            if line is None:
                print(f"{v}: failed: {out.stderr[-800:]}", flush=True)
                continue
            results[v].append(json.loads(line))
            print(v, line, flush=True)
    keys = ("preload", "context", "warm", "reserve", "step1", "step2", "step3")
    print("| variant | " + " | ".join(keys) + " |\n|---|" + "---|" * len(keys))
    for v, rs in results.items():
        cells = [f"{statistics.median(r[k] for r in rs):.0f}" if rs and k in rs[0] else "-"
                 for k in keys]
        print(f"| {v} | " + " | ".join(cells) + " |")
    for r in results["prof"][:1]:
        print("prof, step 1, top by self CPU ms:")
        for key, ms, n in r["top"]:
            print(f"  {ms:8.1f} ms  x{n:<5} {key}")


if __name__ == "__main__":
    main()
