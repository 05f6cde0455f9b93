#!/usr/bin/env python3
"""Test worker for tests/slurm: an all-reduce-like sum over gpurun's store (no torch needed).

Every worker ADDs RANK+1 to one key and 1 to a counter on the store at MASTER_ADDR:MASTER_PORT
(raw TCPStore frames, like tests/supervisor/workers/store_client.py), waits until the counter
reaches WORLD_SIZE, then prints one line:
  sum_worker: rank R of W local L group G node N master A:P sum S slurm_vars V
S must be W*(W+1)/2 on every rank; N is SLURMD_NODENAME (the slurmd that started gpurun);
V lists the SLURM_* variables the worker sees (gpurun keeps only job-level ones).
"""
import os
import socket
import struct
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "common"))
from wait_for import wait_for  # noqa: E402

MAGIC = 0x3C85F7CE
ADD, PING = 0x04, 0x0D


def recvn(s, n):
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise RuntimeError("store closed the connection")
        buf += chunk
    return buf


def blob(b):
    return struct.pack("<Q", len(b)) + b


def add(s, key, value):
    s.sendall(bytes([ADD]) + blob(key) + struct.pack("<q", value))
    return struct.unpack("<q", recvn(s, 8))[0]


rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
prefix = b"/slurm-test/" + os.environ.get("SLURM_JOB_ID", "nojob").encode()
start = time.monotonic()  # 30 s for the whole: connecting and every worker's arrival
errors = []


def connected():  # node 0's store may come up a moment after this node's workers start
    try:
        return socket.create_connection((addr.strip("[]"), port), 5)
    except OSError as e:
        errors[:] = [e]
        return None


try:
    s = wait_for(f"node 0's store at {addr}:{port}", connected, 30, every=0.2)
except TimeoutError as e:
    sys.exit(f"sum_worker: rank {rank}: {e} (last error: {errors[-1] if errors else '-'})")
s.sendall(b"\x00" + struct.pack("<I", MAGIC))
s.sendall(bytes([PING]) + struct.pack("<I", 7))
assert struct.unpack("<I", recvn(s, 4))[0] == 7, "bad PING echo"
add(s, prefix + b"/sum", rank + 1)
add(s, prefix + b"/count", 1)
try:
    wait_for(f"all {world} workers", lambda: add(s, prefix + b"/count", 0) >= world,
             max(0.0, 30 - (time.monotonic() - start)))
except TimeoutError:
    sys.exit(f"sum_worker: rank {rank}: not all {world} workers arrived within 30 s")
total = add(s, prefix + b"/sum", 0)
slurm_vars = ",".join(sorted(k for k in os.environ if k.startswith("SLURM_"))) or "-"
print(f"sum_worker: rank {rank} of {world} local {os.environ['LOCAL_RANK']} "
      f"group {os.environ['GROUP_RANK']} node {os.environ.get('SLURMD_NODENAME', '?')} "
      f"master {addr}:{port} sum {total} slurm_vars {slurm_vars}", flush=True)
