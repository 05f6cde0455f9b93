#!/usr/bin/env python3
"""Packs gpurun's platform wheel from files already built (scripts/wheel.sh builds them, then
calls this; docs/python.md#wheel). Standard library only: no setuptools, wheel or network.

    wheel_pack.py --gpurun F --worker-lib F --simulated-nvml F --package DIR --out DIR

The wheel, ``gpurun-<version>-py3-none-linux_<machine>.whl`` (py3-none: the Python package is
pure Python and the native files do not link libpython; linux_<machine>: no manylinux
promise, the binaries need the system libraries docs/python.md#wheel lists), holds:

* ``gpurun/``: the Python package (its ``*.py`` files);
* ``gpurun/_bin/``: the launcher ``gpurun``, ``libgpurun_worker.so`` (found beside the binary
  by gpurun, and by ``import gpurun`` without GPURUN_WORKER_LIBRARY: gpurun/_native.py) and
  ``libgpurun_simulated_nvml.so`` (``--simulate-gpus``, also found beside the binary), with
  their debug sections stripped (``strip --strip-debug``: 16 -> ~4 MB for gpurun);
* ``gpurun-<version>.data/scripts/gpurun``: a ``#!python`` script (pip points it at the
  environment's python and puts it in its bin/) that execs ``gpurun/_bin/gpurun``: a wheel's
  console entry point can only call Python, and a native file in scripts/ would not find its
  libraries in site-packages;
* ``gpurun-<version>.dist-info/``: METADATA (no Requires-Dist: torch is the user's), WHEEL,
  RECORD (sha256 and size of every file: what ``pip uninstall`` removes).

The versions of ``gpurun --version``, the package's ``__version__`` and its pyproject.toml must
agree, and the worker library's ABI must be the package's (``_native.ABI``): a wheel of a stale
build is refused, naming both values.
"""
import argparse
import base64
import ctypes
import hashlib
import os
import re
import subprocess
import sys
import tempfile
import zipfile

# The command pip installs as <env>/bin/gpurun. It finds the package on sys.path without
# importing it (importing gpurun would import torch: ~2 s for `gpurun status`) and execs the
# native binary in place (same pid: signals, `kill -9 gpurun` and the workers' parent-death
# signal behave as with the binary itself). Python ignores SIGPIPE and SIGXFSZ at start-up and an
# ignored signal stays ignored across exec: restored first, so that gpurun starts with the
# dispositions the shell gave (its workers' gpurun resets itself).
LAUNCHER = '''#!python
"""gpurun (installed from the gpurun wheel): runs the native launcher gpurun/_bin/gpurun."""
import os
import signal
import sys

for name in ("SIGPIPE", "SIGXFSZ"):
    if hasattr(signal, name):
        signal.signal(getattr(signal, name), signal.SIG_DFL)
for entry in sys.path:
    exe = os.path.join(entry or os.curdir, "gpurun", "_bin", "gpurun")
    if os.access(exe, os.X_OK):
        try:
            os.execv(exe, [sys.argv[0]] + sys.argv[1:])
        except OSError as e:
            sys.exit(f"gpurun: cannot run {exe}: {e.strerror}")
sys.exit("gpurun: no gpurun/_bin/gpurun on this Python's path (" + sys.executable + "): the "
         "gpurun wheel is not installed for it; reinstall it (pip install --force-reinstall "
         "gpurun-*.whl)")
'''

ELF_MACHINES = {62: "x86_64", 183: "aarch64", 21: "ppc64le"}


def fail(msg):
    sys.exit(f"wheel_pack: {msg}")


def elf_machine(path):
    """The machine of an ELF file (its e_machine), as a wheel platform suffix."""
    with open(path, "rb") as f:
        head = f.read(20)
    if head[:4] != b"\x7fELF":
        fail(f"{path} is not an ELF file")
    code = int.from_bytes(head[18:20], "little")
    if code not in ELF_MACHINES:
        fail(f"{path}: ELF machine {code} has no wheel tag here")
    return ELF_MACHINES[code]


def versions(args):
    """The version gpurun, the package and its pyproject.toml agree on."""
    out = subprocess.run([args.gpurun, "--version"], capture_output=True, text=True, check=True)
    m = re.fullmatch(r"gpurun (\S+)\s*", out.stdout)
    if not m:
        fail(f"'{args.gpurun} --version' said {out.stdout!r}, not 'gpurun <version>'")
    found = {f"{args.gpurun} --version": m.group(1)}
    init = os.path.join(args.package, "__init__.py")
    m = re.search(r'^__version__ = "([^"]+)"', open(init).read(), re.M)
    found[init] = m.group(1) if m else "none"
    pyproject = os.path.join(os.path.dirname(args.package), "pyproject.toml")
    if os.path.exists(pyproject):
        m = re.search(r'^version = "([^"]+)"', open(pyproject).read(), re.M)
        found[pyproject] = m.group(1) if m else "none"
    if len(set(found.values())) != 1:
        fail("the versions differ: " + ", ".join(f"{k}: {v}" for k, v in found.items()))
    return found[f"{args.gpurun} --version"]


def check_abi(args):
    """The worker library speaks the package's ABI (gpurun/_native.py ABI = N)."""
    m = re.search(r"^ABI = (\d+)", open(os.path.join(args.package, "_native.py")).read(), re.M)
    lib = ctypes.CDLL(os.path.abspath(args.worker_lib))
    lib.gpurun_worker_abi.restype = ctypes.c_int
    if not m or lib.gpurun_worker_abi() != int(m.group(1)):
        fail(f"{args.worker_lib} has ABI {lib.gpurun_worker_abi()}, the package "
             f"{args.package} speaks {m.group(1) if m else 'none'}: rebuild (scripts/wheel.sh)")


def stripped(path, tmp):
    """The bytes of `path` without its debug sections."""
    out = os.path.join(tmp, os.path.basename(path))
    subprocess.run(["strip", "--strip-debug", "-o", out, path], check=True)
    with open(out, "rb") as f:
        return f.read()


def metadata(version):
    return f"""Metadata-Version: 2.1
Name: gpurun
Version: {version}
Summary: A torchrun replacement (native launcher) with elastic training for Python
Requires-Python: >=3.8
Description-Content-Type: text/markdown

# gpurun

The `gpurun` launcher (the native executable: `gpurun --nproc 8 python3 train.py` where you
typed `torchrun --nproc-per-node 8 train.py`) and the `gpurun` Python package (`import gpurun`:
elastic training under `gpurun --config`), with the worker library they share.

torch (>= 1.13) is needed at run time but not declared: pip would otherwise replace the torch
you have (Debian's python3-torch, a CUDA build of your choice, your own) with a download from
PyPI. Install the wheel into an environment that sees your torch
(`python3 -m venv --system-site-packages env`).

The native files need glibc >= 2.34, libstdc++ of GCC >= 12 and libfmt 9 (Debian 12,
Ubuntu 24.04: libfmt9). Docs: docs/python.md#wheel in the gpurun repository.
"""


def wheel_file(tag):
    return (f"Wheel-Version: 1.0\nGenerator: gpurun scripts/wheel_pack.py\n"
            f"Root-Is-Purelib: false\nTag: {tag}\n")


def record_line(name, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpurun", required=True)
    ap.add_argument("--worker-lib", required=True)
    ap.add_argument("--simulated-nvml", required=True)
    ap.add_argument("--package", required=True, help="worker_runtime/python/gpurun")
    ap.add_argument("--out", required=True, help="the folder the wheel is written to")
    args = ap.parse_args()
    for f in (args.gpurun, args.worker_lib, args.simulated_nvml):
        if not os.path.isfile(f):
            fail(f"{f} does not exist: build it first (scripts/wheel.sh builds it)")
    version = versions(args)
    check_abi(args)
    machine = elf_machine(args.gpurun)
    for f in (args.worker_lib, args.simulated_nvml):
        if elf_machine(f) != machine:
            fail(f"{f} is built for {elf_machine(f)}, {args.gpurun} for {machine}")
    tag = f"py3-none-linux_{machine}"
    dist = f"gpurun-{version}"

    files = []  # (name in the wheel, bytes, mode)
    for name in sorted(os.listdir(args.package)):
        if name.endswith(".py"):
            with open(os.path.join(args.package, name), "rb") as f:
                files.append((f"gpurun/{name}", f.read(), 0o644))
    with tempfile.TemporaryDirectory() as tmp:
        for f in (args.gpurun, args.worker_lib, args.simulated_nvml):
            files.append((f"gpurun/_bin/{os.path.basename(f)}", stripped(f, tmp), 0o755))
    files.append((f"{dist}.data/scripts/gpurun", LAUNCHER.encode(), 0o755))
    info = f"{dist}.dist-info"
    files.append((f"{info}/METADATA", metadata(version).encode(), 0o644))
    files.append((f"{info}/WHEEL", wheel_file(tag).encode(), 0o644))
    record = "\n".join([record_line(n, d) for n, d, _ in files] + [f"{info}/RECORD,,", ""])
    files.append((f"{info}/RECORD", record.encode(), 0o644))

    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"{dist}-{tag}.whl")
    part = path + ".part"
    with zipfile.ZipFile(part, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data, mode in files:
            zi = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))  # reproducible
            zi.external_attr = (0o100000 | mode) << 16
            zi.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(zi, data)
    os.replace(part, path)
    print(f"wheel_pack: {path} ({os.path.getsize(path) / 2**20:.1f} MiB, {len(files)} files)")


if __name__ == "__main__":
    main()
