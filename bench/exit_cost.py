"""How long a torch CUDA process takes to end after its work: a normal interpreter exit, the
package's leaver exit (gpurun/_exit.py: SystemExit, atexit callbacks, then os._exit) and a bare
os._exit, from the child's last print to the parent's waitpid (docs/results.md, H200,
2026-12-02: normal ~1.2 s vs os._exit ~0.15-0.19 s). Reads the GPU only.
python3 bench/exit_cost.py [device, default cuda]
"""
import os, subprocess, sys, time
if sys.argv[1:2] == ["child"]:
    import torch
    mode, dev = sys.argv[2], sys.argv[3]
    x = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    for _ in range(5):
        y = x @ x
    conv = torch.nn.Conv2d(3, 64, 7).to(dev)
    z = conv(torch.randn(8, 3, 224, 224, device=dev))
    z.float().sum().backward()
    torch.optim.AdamW(conv.parameters(), **({"fused": True} if dev == "cuda" else {})).step()
    if dev == "cuda":
        torch.cuda.synchronize()
    del x, y, z, conv
    if dev == "cuda":
        torch.cuda.empty_cache()
    print(time.monotonic(), flush=True)
    if mode == "_exit":
        os._exit(0)
    if mode == "leave":
        import importlib.util
        here = os.path.dirname(os.path.abspath(__file__))
        spec = importlib.util.spec_from_file_location(
            "gpurun_exit", os.path.join(here, "..", "worker_runtime", "python", "gpurun", "_exit.py"))
        ex = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(ex)
        ex.leave()
    sys.exit(0)
dev = sys.argv[1] if len(sys.argv) > 1 else "cuda"
for mode in ["normal", "leave", "_exit"] * 2:
    p = subprocess.Popen([sys.executable, __file__, "child", mode, dev], stdout=subprocess.PIPE,
                         text=True)
    t = float(p.stdout.readline())
    p.wait()
    r = time.monotonic()
    print(f"torch process exit ({mode}): printed -> reaped {1e3 * (r - t):.0f} ms", flush=True)
