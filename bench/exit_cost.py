"""How long a torch CUDA process takes to end after its work: a normal interpreter exit vs
os._exit, from the child's last print to the parent's waitpid (docs/results.md, H200,
2026-12-02: ~1.2 s vs ~0.15-0.19 s). Reads the GPU only.   python3 bench/exit_cost.py
"""
import os, subprocess, sys, time
if sys.argv[1:2] == ["child"]:
    import torch
    mode = sys.argv[2]
    x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(5):
        y = x @ x
    conv = torch.nn.Conv2d(3, 64, 7).cuda()
    z = conv(torch.randn(8, 3, 224, 224, device="cuda"))
    z.float().sum().backward()
    torch.optim.AdamW(conv.parameters(), fused=True).step()
    torch.cuda.synchronize()
    del x, y, z, conv
    torch.cuda.empty_cache()
    print(time.monotonic(), flush=True)
    if mode == "_exit":
        os._exit(0)
    sys.exit(0)
for mode in ["normal", "_exit", "normal", "_exit"]:
    p = subprocess.Popen([sys.executable, __file__, "child", mode], stdout=subprocess.PIPE, text=True)
    t = float(p.stdout.readline())
    p.wait()
    r = time.monotonic()
    print(f"torch process exit ({mode}): printed -> reaped {1e3 * (r - t):.0f} ms", flush=True)
