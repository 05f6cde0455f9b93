"""Gloo's own rate on the link, a second anchor of bench/elastic_nodes.sh: torch.distributed's
gloo broadcast of BYTES bytes (one uint8 tensor) from rank 0 to rank 1, two processes on HOST
(default 127.0.0.1), as the worker runtime's state handoff broadcasts each state tensor. Rank 1
receives into a tensor written before the clock starts (torch.zeros: its pages are in, as a warm
joiner's receive buffers are, StateRegistry::reserve_receive, and as tcp_copy.py's are). The time runs from a barrier to rank 1's return from the broadcast. One JSON line
per repetition on stdout: {"bytes":…, "ms":…, "gb_s":…} (GB = 1e9 bytes).

python3 bench/gloo_copy.py BYTES [REPEAT=3] [HOST=127.0.0.1]
"""
import json
import multiprocessing as mp
import socket
import sys
import time


def rank_main(rank, port, host, n, repeat, q):
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://{host}:{port}", rank=rank, world_size=2)
    src = torch.full((n,), 0x5A, dtype=torch.uint8) if rank == 0 else None
    for _ in range(repeat):
        t = src if rank == 0 else torch.zeros(n, dtype=torch.uint8)
        dist.barrier()
        t0 = time.monotonic()
        dist.broadcast(t, 0)
        ms = (time.monotonic() - t0) * 1e3
        if rank == 1:
            if int(t[-1]) != 0x5A:
                raise SystemExit("gloo_copy: the last byte received is not the one sent")
            q.put({"bytes": n, "ms": round(ms, 1), "gb_s": round(n / ms / 1e6, 3)})
        del t
    dist.destroy_process_group()


def main():
    n = int(sys.argv[1])
    repeat = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    host = sys.argv[3] if len(sys.argv) > 3 else "127.0.0.1"
    with socket.socket() as s:  # a free port for the rendezvous
        s.bind((host, 0))
        port = s.getsockname()[1]
    q = mp.Queue()
    ps = [mp.Process(target=rank_main, args=(r, port, host, n, repeat, q)) for r in (0, 1)]
    for p in ps:
        p.start()
    for _ in range(repeat):
        print(json.dumps(q.get(timeout=600)), flush=True)
    for p in ps:
        p.join()
        if p.exitcode != 0:
            raise SystemExit(f"gloo_copy: rank process exited {p.exitcode}")


if __name__ == "__main__":
    main()
