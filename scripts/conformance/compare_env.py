#!/usr/bin/env python3
"""Compare the worker environments torchrun and gpurun give, rank by rank.

Prints every variable torchrun sets that gpurun lacks (a failure) and every value
that differs; values expected to differ (ports, run ids, paths) are listed, not failed.
"""
import os
import sys

EXPECTED_TO_DIFFER = {"MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE", "_"}
IGNORED = {"TORCHELASTIC_SIGNALS_TO_HANDLE"}  # torchrun sets it in its own env, workers inherit it


def load(path):
    return dict(l.rstrip("\n").split("=", 1) for l in open(path) if "=" in l)


def main(a_dir, b_dir):
    failures = 0
    for name in sorted(os.listdir(a_dir)):
        a, b = load(os.path.join(a_dir, name)), load(os.path.join(b_dir, name))
        torch_keys = {k for k in a if k.startswith(("TORCHELASTIC", "RANK", "LOCAL_", "WORLD", "GROUP_", "ROLE_", "MASTER_", "OMP_", "TORCH_NCCL"))}
        print(f"{name}: torchrun sets {len(torch_keys)} launcher variables")
        for k in sorted(torch_keys - IGNORED):
            if k not in b:
                print(f"  MISSING in gpurun: {k}={a[k]}")
                failures += 1
            elif a[k] != b[k]:
                tag = "differs (expected)" if k in EXPECTED_TO_DIFFER else "DIFFERS"
                print(f"  {tag}: {k}: torchrun={a[k]!r} gpurun={b[k]!r}")
                failures += k not in EXPECTED_TO_DIFFER
        extra = sorted(k for k in b if k.startswith("GPURUN_"))
        print(f"  gpurun adds: {', '.join(extra)}")
    print("env match: " + ("OK" if failures == 0 else f"{failures} problem(s)"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
