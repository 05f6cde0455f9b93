#!/usr/bin/env python3
"""ctest python_leave: how a process the runtime ends itself ends (gpurun/_exit.py).

Each case is a fresh interpreter whose program calls ``leave()`` inside a ``try``: its
``finally`` block and its ``atexit`` callback run and what it printed (stdout is a pipe, so
block-buffered) comes out; with the fast end (the default) a live object's ``__del__`` does not
run (the interpreter's teardown is skipped), with ``GPURUN_LEAVER_EXIT=normal`` it does; an
exception raised while the program unwinds gives status 1; a bad value is refused by name.
Needs no torch: _exit.py is loaded by its path."""
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
EXIT_PY = os.path.join(HERE, "..", "..", "worker_runtime", "python", "gpurun", "_exit.py")

PROGRAM = r"""
import atexit, importlib.util, sys
spec = importlib.util.spec_from_file_location("gpurun_exit", sys.argv[1])
ex = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ex)

class Alive:
    def __del__(self):
        print("del ran")

alive = Alive()
atexit.register(print, "program atexit ran")
print("before leave")
try:
    ex.leave()
finally:
    print("finally ran")
    if sys.argv[2] == "raise":
        raise RuntimeError("clean-up failed")
print("after leave (never)")
"""


def run(env_value, mode="plain"):
    env = dict(os.environ)
    env.pop("GPURUN_LEAVER_EXIT", None)
    env.pop("PYTHONUNBUFFERED", None)  # stdout a pipe, block-buffered: the flush must be ours
    if env_value is not None:
        env["GPURUN_LEAVER_EXIT"] = env_value
    p = subprocess.run([sys.executable, "-c", PROGRAM, EXIT_PY, mode], env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
    return p.returncode, p.stdout.splitlines(), p.stderr


rc, out, err = run(None)
assert rc == 0, (rc, out, err)
assert out == ["before leave", "finally ran", "program atexit ran"], (out, err)
print("python_leave: the fast end runs finally and atexit, flushes stdout, skips __del__")

rc, out, err = run("normal")
assert rc == 0, (rc, out, err)
assert out == ["before leave", "finally ran", "program atexit ran", "del ran"], (out, err)
print("python_leave: GPURUN_LEAVER_EXIT=normal is the interpreter's full exit")

rc, out, err = run(None, "raise")
assert rc == 1, (rc, out, err)
assert "RuntimeError: clean-up failed" in err, err
assert out == ["before leave", "finally ran", "program atexit ran"], (out, err)
print("python_leave: an exception while unwinding gives status 1")

rc, out, err = run("quick")
assert rc == 1 and "GPURUN_LEAVER_EXIT='quick'" in err and "finally ran" in out, (rc, out, err)
print("python_leave: a bad GPURUN_LEAVER_EXIT is refused by name")
