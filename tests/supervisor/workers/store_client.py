#!/usr/bin/env python3
"""Talks to gpurun's store with raw TCPStore frames (no torch needed).

Rank 1 SETs a key, writes its pid to OUT_DIR/rank1.done and exits. Rank 0 WAITs for
the key on one connection, waits for rank 1 to be gone, then reads the key on a fresh
connection: the store is reachable at MASTER_ADDR:MASTER_PORT and outlives a worker.
"""
import os
import socket
import struct
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "common"))
from wait_for import wait_for  # noqa: E402

MAGIC = 0x3C85F7CE
rank = int(os.environ["RANK"])
out_dir = os.environ["OUT_DIR"]
key = b"/gpurun-test/" + os.environ["TORCHELASTIC_RUN_ID"].encode()


def recvn(s, n):
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise RuntimeError("store closed the connection")
        buf += chunk
    return buf


def connect():
    s = socket.create_connection((os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])), 10)
    s.sendall(b"\x00" + struct.pack("<I", MAGIC))
    nonce = os.getpid() & 0xFFFFFFFF
    s.sendall(b"\x0d" + struct.pack("<I", nonce))
    if struct.unpack("<I", recvn(s, 4))[0] != nonce:
        raise RuntimeError("bad PING echo")
    return s


def blob(b):
    return struct.pack("<Q", len(b)) + b


s = connect()
if rank == 1:
    s.sendall(b"\x01" + blob(key) + blob(b"value-from-rank-1"))
    s.sendall(b"\x0d" + struct.pack("<I", 7))  # a round trip makes sure SET was processed
    assert struct.unpack("<I", recvn(s, 4))[0] == 7
    s.close()
    with open(os.path.join(out_dir, "rank1.tmp"), "w") as f:
        f.write(str(os.getpid()))
    os.rename(os.path.join(out_dir, "rank1.tmp"), os.path.join(out_dir, "rank1.done"))
    sys.exit(0)

s.sendall(b"\x06" + struct.pack("<Q", 1) + blob(key))  # WAIT [key]
if recvn(s, 1) != b"\x00":
    raise RuntimeError("WAIT did not answer STOP_WAITING")


def rank1_gone():
    """Rank 1 wrote its pid and has exited (no /proc entry, or a zombie)."""
    try:
        pid = int(open(os.path.join(out_dir, "rank1.done")).read())
        stat = open(f"/proc/{pid}/stat").read()
    except FileNotFoundError:
        return os.path.exists(os.path.join(out_dir, "rank1.done"))
    return stat[stat.rindex(")") + 2] == "Z"


wait_for("rank 1 to write OUT_DIR/rank1.done and exit", rank1_gone, 20)
s2 = connect()
s2.sendall(b"\x03" + blob(key))  # GET
n = struct.unpack("<Q", recvn(s2, 8))[0]
value = recvn(s2, n)
with open(os.path.join(out_dir, "rank0.result"), "w") as f:
    f.write(value.decode())
sys.exit(0 if value == b"value-from-rank-1" else 1)
