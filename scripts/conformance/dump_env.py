#!/usr/bin/env python3
"""Worker that writes its launcher-given environment to DIR/rank<RANK>.env (sorted KEY=VALUE)."""
import os
import sys

d = sys.argv[1]
os.makedirs(d, exist_ok=True)
with open(os.path.join(d, f"rank{os.environ['RANK']}.env"), "w") as f:
    for k in sorted(os.environ):
        f.write(f"{k}={os.environ[k]}\n")
