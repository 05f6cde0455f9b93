"""How a process the runtime ends itself ends: a release-mode leaver, a warm joiner that is not
needed, a rank told to exit while parked (docs/python.md, "a leaver in release mode").

A torch CUDA process's normal interpreter exit takes about 1 s after its work is done, against
0.15-0.19 s for ``os._exit`` (bench/exit_cost.py on an H200, 2026-12-02: 1,155-1,207 ms vs
146-188 ms): Python's module teardown and the C++ static destructors (CUDA's, NCCL's, torch's
caching allocator) free what the kernel and the driver free anyway when the process is gone.
A leaver's GPU is given back only when its process is gone, so the release-mode pause waits for
all of it. ``leave`` keeps what a program can see of an exit and skips the rest:

1. ``SystemExit`` unwinds the program as ``sys.exit`` does: its ``finally`` blocks and ``with``
   blocks run;
2. as the first ``atexit`` callback (it is registered last), every other ``atexit`` callback runs
   in the interpreter's order (``logging.shutdown``, multiprocessing's end of its children, the
   program's own);
3. ``sys.stdout`` and ``sys.stderr`` are flushed, then every file object still open for writing
   (found through the garbage collector, after ``gc.unfreeze()``; ~30 ms for 117k objects on
   the CPU machine), and the process ends with ``os._exit``: status 0, or 1 when an exception
   escaped the program while it unwound (the interpreter printed it and set
   ``sys.last_value``).

Not run: ``__del__`` of objects still alive, and the ``close()`` of files left open (flushed,
not closed: a gzip file left open lacks its trailer, as after a crash).
``GPURUN_LEAVER_EXIT=normal`` makes it the interpreter's full exit (``sys.exit``).
"""
import _io
import atexit
import gc
import os
import sys

# The environment variable that turns the fast end off ("normal": sys.exit only).
ENV = "GPURUN_LEAVER_EXIT"


def fast_exit_enabled(environ=os.environ):
    """Whether ``leave`` ends the process with ``os._exit`` after the clean-up above; raises
    ValueError for a value other than ``fast`` or ``normal`` (naming the variable)."""
    v = environ.get(ENV, "fast")
    if v not in ("fast", "normal"):
        raise ValueError(f"{ENV}={v!r}: expected 'fast' (the default) or 'normal'")
    return v == "fast"


def freeze_until_exit():
    """``gc.freeze()`` now (what is alive goes to the collector's permanent generation: never
    scanned again, so a later ``gc.collect()`` is cheap) and ``gc.unfreeze()`` as an ``atexit``
    callback. Without the second, CPython's end does not finalize the frozen objects: a file the
    program opened before and left open lost its buffered writes at a normal exit, and their
    ``__del__`` did not run (ctest python_leave). Non-blocking; returns None."""
    gc.freeze()
    atexit.register(gc.unfreeze)


def leave():
    """Ends the process with exit status 0 (raises ``SystemExit(0)``; never returns). See the
    module's docstring for what runs before the end."""
    if fast_exit_enabled():
        atexit.register(_end_now)
    sys.exit(0)


def _end_now():
    atexit.unregister(_end_now)
    code = 0
    try:
        atexit._run_exitfuncs()  # the others, in order; each one's exception is printed
    finally:
        # An exception that escaped the program (not a SystemExit) was printed by the interpreter,
        # which sets sys.last_value (and, from Python 3.12, sys.last_exc) before atexit runs.
        if any(getattr(sys, n, None) is not None for n in ("last_exc", "last_value")):
            code = 1
        _flush_open_files()
        os._exit(code)


def _flush_open_files():
    """Flushes ``sys.stdout`` and ``sys.stderr`` (whatever objects they are: a wrapper may write
    into a file), then every open, writable file object the garbage collector knows (a text
    file's flush goes on into its buffer's). Errors are ignored: a broken pipe or a closed stream has
    nothing more to say."""
    for f in (sys.stdout, sys.stderr):
        try:
            f.flush()
        except Exception:
            pass
    gc.unfreeze()  # a program's own gc.freeze(): its files are not listed otherwise
    for f in [o for o in gc.get_objects() if isinstance(o, _io._IOBase)]:
        try:
            if not f.closed and f.writable():
                f.flush()
        except Exception:
            pass
