"""How fast a fresh process moves a /dev/shm snapshot's bytes into device memory, by method.

A standby told to go (docs/worker-runtime.md#standby) maps the pause snapshot, page-locks it
(cudaHostRegister) and copies it to its tensors; the page-locking of a 7.5 GB ViT-H snapshot
took 0.4-0.6 s on the H200 beside the CUDA context's start (docs/results.md, eighth day). Each
method runs in its own process (a fresh CUDA context, as a standby has), over one shared file:

  register  cudaHostRegister of the whole mapping, then one copy (what the runtime does)
  pageable  one copy from the unregistered mapping (the driver stages it)
  chunked   register CHUNK bytes at a time, each chunk's copy queued once it is registered
  staged    a ring of RING page-locked buffers of CHUNK bytes: the host copies the mapping
            into a free buffer (torch's threads), the device copies it out on a side stream

Prints ms per phase (context, register, copy, total) and GB/s of the copy; reads the GPU only.
python3 bench/h2d_probe.py [GiB=7.0] [reps=2] [CHUNK_MiB=256] [RING=4]
"""
import mmap, os, subprocess, sys, time

PATH = "/dev/shm/gpurun-h2d-probe"


def child(method, nbytes, chunk, ring):
    import torch
    t0 = time.monotonic()
    # as the runtime maps its snapshot file (worker_runtime/snapshot/mapped_file.cpp): shared,
    # read-write, page tables filled at once
    fd = os.open(PATH, os.O_RDWR)
    mm = mmap.mmap(fd, nbytes, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0),
                   prot=mmap.PROT_READ | mmap.PROT_WRITE)
    os.close(fd)
    src = torch.frombuffer(mm, dtype=torch.uint8)
    ptr = src.data_ptr()
    t_map = time.monotonic()
    torch.cuda.init()
    dst = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    t_ctx = time.monotonic()
    cudart = torch.cuda.cudart()
    reg_ms = 0.0
    regs = []
    if method == "register":
        r0 = time.monotonic()
        rc = cudart.cudaHostRegister(ptr, nbytes, 0)
        assert int(rc) == 0, rc
        regs.append(ptr)
        reg_ms = (time.monotonic() - r0) * 1e3
        c0 = time.monotonic()
        dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()
    elif method == "pageable":
        c0 = time.monotonic()
        dst.copy_(src)
        torch.cuda.synchronize()
    elif method == "chunked":
        c0 = time.monotonic()
        s = torch.cuda.Stream()
        for off in range(0, nbytes, chunk):
            n = min(chunk, nbytes - off)
            r0 = time.monotonic()
            rc = cudart.cudaHostRegister(ptr + off, n, 0)
            assert int(rc) == 0, rc
            regs.append(ptr + off)
            reg_ms += (time.monotonic() - r0) * 1e3
            with torch.cuda.stream(s):
                dst[off:off + n].copy_(src[off:off + n], non_blocking=True)
        s.synchronize()
    elif method == "staged":
        c0 = time.monotonic()
        bufs = [torch.empty(chunk, dtype=torch.uint8, pin_memory=True) for _ in range(ring)]
        reg_ms = (time.monotonic() - c0) * 1e3  # the ring's allocation
        s = torch.cuda.Stream()
        ev = [None] * ring
        for i, off in enumerate(range(0, nbytes, chunk)):
            n = min(chunk, nbytes - off)
            k = i % ring
            if ev[k] is not None:
                ev[k].synchronize()
            bufs[k][:n].copy_(src[off:off + n])
            with torch.cuda.stream(s):
                dst[off:off + n].copy_(bufs[k][:n], non_blocking=True)
                ev[k] = torch.cuda.Event()
                ev[k].record(s)
        s.synchronize()
    else:
        raise SystemExit(f"unknown method {method}")
    t_end = time.monotonic()
    copy_ms = (t_end - c0) * 1e3
    ok = bool(dst[:4096].cpu().equal(src[:4096])) and bool(dst[-4096:].cpu().equal(src[-4096:]))
    for p in regs:
        cudart.cudaHostUnregister(p)
    print(f"{method:9s} map {1e3 * (t_map - t0):6.0f}  context {1e3 * (t_ctx - t_map):6.0f}  "
          f"register {reg_ms:6.0f}  copy {copy_ms:6.0f} ({nbytes / copy_ms / 1e6:5.1f} GB/s)  "
          f"context+copy {1e3 * (t_end - t_map):6.0f} ms  bytes equal {ok}", flush=True)


def main():
    gib = float(sys.argv[1]) if len(sys.argv) > 1 else 7.0
    reps = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    chunk = (int(sys.argv[3]) if len(sys.argv) > 3 else 256) << 20
    ring = int(sys.argv[4]) if len(sys.argv) > 4 else 4
    nbytes = int(gib * (1 << 30)) // 4096 * 4096
    import numpy as np
    with open(PATH, "wb") as f:
        block = np.random.default_rng(0).integers(0, 256, 1 << 26, dtype=np.uint8).tobytes()
        left = nbytes
        while left:
            f.write(block[:min(left, len(block))])
            left -= min(left, len(block))
    try:
        for _ in range(reps):
            for m in ("register", "pageable", "chunked", "staged"):
                subprocess.run([sys.executable, __file__, "child", m, str(nbytes), str(chunk),
                                str(ring)], check=False)
    finally:
        os.unlink(PATH)


if __name__ == "__main__":
    if sys.argv[1:2] == ["child"]:
        child(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
    else:
        main()
