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
deadline = time.time() + 30
while True:  # node 0's store may come up a moment after this node's workers start
    try:
        s = socket.create_connection((addr.strip("[]"), port), 5)
        break
    except OSError:
        if time.time() > deadline:
            raise
        time.sleep(0.2)
s.sendall(b"\x00" + struct.pack("<I", MAGIC))
s.sendall(bytes([PING]) + struct.pack("<I", 7))
assert struct.unpack("<I", recvn(s, 4))[0] == 7, "bad PING echo"
add(s, prefix + b"/sum", rank + 1)
add(s, prefix + b"/count", 1)
while add(s, prefix + b"/count", 0) < world:
    if time.time() > deadline:
        sys.exit(f"sum_worker: rank {rank}: not all {world} workers arrived within 30 s")
    time.sleep(0.05)
total = add(s, prefix + b"/sum", 0)
slurm_vars = ",".join(sorted(k for k in os.environ if k.startswith("SLURM_"))) or "-"
print(f"sum_worker: rank {rank} of {world} local {os.environ['LOCAL_RANK']} "
      f"group {os.environ['GROUP_RANK']} node {os.environ.get('SLURMD_NODENAME', '?')} "
      f"master {addr}:{port} sum {total} slurm_vars {slurm_vars}", flush=True)
