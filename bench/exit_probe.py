"""bench: a process's exit -> reaped time on a GPU after CUDA init and a 7.5 GB /dev/shm mapping
registered with cudaHostRegister, by what it released itself before exiting (read-only: no GPU
setting is changed). Run: python3 bench/exit_probe.py main. Results: docs/results.md."""
import ctypes, mmap, os, subprocess, sys, time
import numpy as np
import torch

N = 7_500_000_000

def child(mode):
    torch.cuda.init()
    x = torch.empty(1 << 28, dtype=torch.uint8, device="cuda")  # 256 MiB on the GPU
    torch.cuda.synchronize()
    steps = {}
    if mode != "ctx":
        path = f"/dev/shm/gpurun-exitprobe-{os.getpid()}"
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        os.ftruncate(fd, N)
        m = mmap.mmap(fd, N)
        buf = np.frombuffer(m, dtype=np.uint8)
        buf[::4096] = 1
        ptr = ctypes.addressof(ctypes.c_char.from_buffer(m))
        cudart = torch.cuda.cudart()
        cudart.cudaHostRegister(ptr, N, 0)
        os.unlink(path)  # the data stays until the mapping goes
        if mode in ("unreg", "unreg_unmap"):
            t = time.perf_counter(); cudart.cudaHostUnregister(ptr); steps["unregister"] = time.perf_counter() - t
        if mode == "unreg_unmap":
            del buf
            t = time.perf_counter(); m.close(); steps["munmap"] = time.perf_counter() - t
        if mode == "free_first":
            del x
            torch.cuda.empty_cache(); torch.cuda.synchronize()
    print(" ".join(f"{k} {v:.3f}s" for k, v in steps.items()), flush=True)
    print(f"EXIT_AT {time.time():.6f}", flush=True)
    os._exit(0)

if sys.argv[1] == "child":
    child(sys.argv[2])
for mode in ["ctx", "reg", "unreg", "unreg_unmap", "ctx", "reg", "unreg", "unreg_unmap"]:
    p = subprocess.Popen([sys.executable, __file__, "child", mode], stdout=subprocess.PIPE, text=True)
    lines = [l.strip() for l in p.stdout]
    p.wait()
    done = time.time()
    t_exit = float([l for l in lines if l.startswith("EXIT_AT")][0].split()[1])
    print(f"{mode:12s} {' '.join(l for l in lines if not l.startswith('EXIT_AT'))} | exit -> reaped {done - t_exit:.3f}s", flush=True)
