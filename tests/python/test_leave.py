#!/usr/bin/env python3
"""ctest python_leave: how a process the runtime ends itself ends (gpurun/_exit.py).

Each case is a fresh interpreter whose program calls ``leave()`` inside a ``try``: its
``finally`` block and its ``atexit`` callback run and what it printed (stdout is a pipe, so
block-buffered) comes out, and so does a line written to a file it left open (after
``_exit.freeze_and_flush_at_exit()``, as the package's Runtime() calls it); with the fast end (the default) a live object's ``__del__`` does not
run (the interpreter's teardown is skipped), with ``GPURUN_LEAVER_EXIT=normal`` it does; an
exception raised while the program unwinds gives status 1; a bad value is refused by name.
Needs no torch: _exit.py is loaded by its path."""
import os
import subprocess
import sys
import tempfile

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
left_open = open(sys.argv[3], "w")  # never closed: buffered until the end flushes it
left_open.write("written before the leave\n")
if sys.argv[4] == "freeze":  # as Runtime() does: the file object in the permanent generation
    ex.freeze_and_flush_at_exit()
elif sys.argv[4] == "nofreeze":
    pass
elif sys.argv[4] == "rawfreeze":  # the program's own, never unfrozen
    import gc; gc.freeze()
elif sys.argv[4] == "wrapout":  # a stdout that is no file object (as progress-bar libraries set)
    class Wrapped:
        def __init__(self, out):
            self.out, self.held = out, []
        def write(self, s):
            self.held.append(s)
        def flush(self):
            self.out.write("".join(self.held)); self.held = []; self.out.flush()
    sys.stdout = Wrapped(sys.stdout)
atexit.register(print, "program atexit ran")
print("before leave")
if sys.argv[2] == "thread":  # a leave on another thread: the main thread's exit decides
    import threading
    t = threading.Thread(target=ex.leave); t.start(); t.join()
    sys.exit(2)
if sys.argv[2] == "lastvalue":  # an earlier error already printed (e.g. by an interactive shell)
    sys.last_value = sys.last_exc = ValueError("printed long ago")
if sys.argv[2] == "cfile":  # a C library's own buffered stdio file
    import ctypes
    libc = ctypes.CDLL(None)
    libc.fopen.restype = ctypes.c_void_p
    cf = libc.fopen((sys.argv[3] + ".c").encode(), b"w")
    libc.fputs(b"c line\n", ctypes.c_void_p(cf))
if sys.argv[2] == "pipe":  # a daemon thread blocked writing into a pipe nobody reads
    import os, threading, time
    pipe = open(os.pipe()[1], "wb")
    started = threading.Event()
    def feed():
        started.set()
        pipe.write(b"x" * (1 << 20))  # blocks holding the file's lock: its flush would wait
    threading.Thread(target=feed, daemon=True).start()
    started.wait(); time.sleep(0.2)
try:
    ex.leave()
finally:
    print("finally ran")
    if sys.argv[2] == "raise":
        raise RuntimeError("clean-up failed")
    if sys.argv[2] == "kbint":
        raise KeyboardInterrupt
print("after leave (never)")
"""


def run(env_value, mode="plain", how="freeze"):
    env = dict(os.environ)
    env.pop("GPURUN_LEAVER_EXIT", None)
    env.pop("PYTHONUNBUFFERED", None)  # stdout a pipe, block-buffered: the flush must be ours
    if env_value is not None:
        env["GPURUN_LEAVER_EXIT"] = env_value
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "left_open.txt")
        p = subprocess.run([sys.executable, "-c", PROGRAM, EXIT_PY, mode, path, how],
                           env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=20)
        with open(path) as f:
            assert f.read() == "written before the leave\n", (env_value, mode, "file lost")
        if mode == "cfile":
            with open(path + ".c") as f:
                assert f.read() == "c line\n", (env_value, "the C stdio file lost")
    return p.returncode, p.stdout.splitlines(), p.stderr


rc, out, err = run(None)
assert rc == 0, (rc, out, err)
assert out == ["before leave", "finally ran", "program atexit ran"], (out, err)
print("python_leave: the fast end runs finally and atexit, flushes stdout and a file left open, "
      "skips __del__")

for how in ("rawfreeze", "wrapout"):
    rc, out, err = run(None, how=how)
    assert rc == 0 and out == ["before leave", "finally ran", "program atexit ran"], (how, out, err)
print("python_leave: the fast end also flushes after the program's own gc.freeze() and through "
      "a sys.stdout that is no file object")

rc, out, err = run("normal")  # frozen objects stay unfinalized; the file left open is flushed
assert rc == 0 and out == ["before leave", "finally ran", "program atexit ran"], (out, err)
rc, out, err = run("normal", how="nofreeze")
assert rc == 0, (rc, out, err)
assert out == ["before leave", "finally ran", "program atexit ran", "del ran"], (out, err)
print("python_leave: GPURUN_LEAVER_EXIT=normal is the interpreter's full exit (a file left open "
      "before the freeze flushed at its end)")

rc, out, err = run(None, "raise")
assert rc == 1, (rc, out, err)
assert "RuntimeError: clean-up failed" in err, err
assert out == ["before leave", "finally ran", "program atexit ran"], (out, err)
print("python_leave: an exception while unwinding gives status 1")

rc, out, err = run(None, "kbint")
assert rc == -2, (rc, out, err)  # killed by SIGINT, as Python ends on an uncaught Ctrl-C
rc, out, err = run(None, "lastvalue")
assert rc == 0, (rc, out, err)
print("python_leave: a KeyboardInterrupt while unwinding ends by SIGINT; an exception printed "
      "before the leave does not count")

rc, out, err = run(None, "thread")
assert rc == 2 and out == ["before leave", "program atexit ran"], (rc, out, err)
print("python_leave: a leave on another thread ends nothing: the main thread's exit status stands")

rc, out, err = run(None, "pipe")
assert rc == 0, (rc, out, err)
print("python_leave: a pipe with a blocked writer is not flushed (the end does not hang)")

rc, out, err = run(None, "cfile")
assert rc == 0, (rc, out, err)
print("python_leave: C stdio files are flushed too")

rc, out, err = run("quick")
assert rc == 1 and "GPURUN_LEAVER_EXIT='quick'" in err and "finally ran" in out, (rc, out, err)
print("python_leave: a bad GPURUN_LEAVER_EXIT is refused by name")
