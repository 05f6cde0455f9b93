#!/usr/bin/env python3
"""Anchor for bench/store_bench: torch's own TCPStore server (libuv backend).

Usage (on a machine with torch):
    python3 bench/anchors/torch_store_server.py [PORT]      # default 29600
    build/bench/store_bench --port PORT --threads 8 --ops 20000 --rendezvous 2000,10000
then compare with the in-process gpurun store (store_bench without --port).
"""
import sys
import time

from torch.distributed import TCPStore

port = int(sys.argv[1]) if len(sys.argv) > 1 else 29600
store = TCPStore("127.0.0.1", port, is_master=True, use_libuv=True, wait_for_workers=False)
print(f"torch TCPStore (libuv) serving on 127.0.0.1:{port}; Ctrl-C to stop", flush=True)
try:
    while True:
        time.sleep(3600)
except KeyboardInterrupt:
    pass
