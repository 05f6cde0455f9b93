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
3. ``sys.stdout`` and ``sys.stderr`` are flushed, then every regular file still open for
   writing (found through the garbage collector, the frozen generation included; ~30-50 ms for
   120-145k objects on the CPU machine; pipes and sockets are not flushed: a blocked writer
   would hang the end), then C's stdio streams (``fflush(NULL)``), and the process ends with
   ``os._exit``: status 0; 1 when an exception escaped the program while it unwound (the
   interpreter printed it and set ``sys.last_value`` anew); killed by SIGINT, as Python ends,
   when that exception was a KeyboardInterrupt.

Only on the main thread, once; a program that catches the leave's ``SystemExit`` and exits
otherwise still ends with status 0 (gpurun counts no leaver's status as a failure). Not run:
``__del__`` of objects still alive and the ``close()`` of files left open (flushed, not closed:
a gzip file left open lacks its trailer, a ``NamedTemporaryFile`` stays), C++ streams' buffers
and C atexit handlers, as after a kill.
``GPURUN_LEAVER_EXIT=normal`` makes it the interpreter's full exit (``sys.exit``).
"""
import _io
import atexit
import ctypes
import gc
import os
import signal
import stat
import sys
import threading

# The environment variable that turns the fast end off ("normal": sys.exit only).
ENV = "GPURUN_LEAVER_EXIT"


def fast_exit_enabled(environ=os.environ):
    """Whether ``leave`` ends the process with ``os._exit`` after the clean-up above; raises
    ValueError for a value other than ``fast`` or ``normal`` (naming the variable)."""
    v = environ.get(ENV, "fast")
    if v not in ("fast", "normal"):
        raise ValueError(f"{ENV}={v!r}: expected 'fast' (the default) or 'normal'")
    return v == "fast"


def freeze_and_flush_at_exit():
    """``gc.freeze()`` now (what is alive goes to the collector's permanent generation: never
    scanned again, so a later ``gc.collect()`` is cheap), and at the interpreter's end a flush of
    the files left open (an ``atexit`` callback). CPython's end finalizes nothing frozen: without
    the flush a file the program opened before and left open lost its buffered writes at a
    normal exit (ctest python_leave). The objects stay frozen (unfreezing them at the end ran
    their finalizers: +0.35 s per exit with torch loaded, as before the freeze). Returns None."""
    gc.freeze()
    atexit.register(_flush_open_files)


_last_at_leave = None


def leave():
    """Ends the process with exit status 0 (raises ``SystemExit(0)``; never returns). See the
    module's docstring for what runs before the end."""
    global _last_at_leave
    if fast_exit_enabled() and threading.current_thread() is threading.main_thread():
        atexit.unregister(_end_now)  # once
        _last_at_leave = _last_exception()
        atexit.register(_end_now)
    sys.exit(0)


def _last_exception():
    """What the interpreter last printed as uncaught (3.12: sys.last_exc; before: last_value)."""
    return getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)


def _end_now():
    atexit.unregister(_end_now)
    atexit.unregister(_flush_open_files)  # freeze_and_flush_at_exit's: done once, below
    code = 0
    try:
        atexit._run_exitfuncs()  # the others, in order; each one's exception is printed
    finally:
        # An exception that escaped the program while it unwound (not a SystemExit) was printed
        # by the interpreter, which set it as the last one before atexit ran.
        last = _last_exception()
        escaped = last is not None and last is not _last_at_leave
        if escaped:
            code = 1
        _flush_open_files()
        if escaped and isinstance(last, KeyboardInterrupt):  # as Python ends on one: by SIGINT
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        os._exit(code)


def program_error_text(kind, value, limit=4000):
    """The text gpurun is told for an exception that ends the program (its ``program_error``
    event): ``"ValueError: bad batch"``; the name alone for one without a message
    (``"KeyboardInterrupt"``, never ``"KeyboardInterrupt: "``). A message of several lines (a
    DataLoader worker's error carries its traceback) keeps its lines; over ``limit``
    characters its start and its end (the real error) are kept, the middle elided with a
    count. gpurun bounds what it shows (docs/errors.md, "Multi-line errors")."""
    name = getattr(kind, "__name__", str(kind))
    try:
        message = str(value).strip()
    except Exception:  # noqa: BLE001 - a __str__ that raises: the name is still the news
        message = ""
    if not message:
        return name
    text = f"{name}: {message}"
    if len(text) <= limit:
        return text
    head = limit // 4
    tail = limit - head
    return f"{text[:head]}\n[... {len(text) - head - tail} characters elided ...]\n{text[-tail:]}"


def _flush_open_files():
    """Flushes ``sys.stdout`` and ``sys.stderr`` (whatever objects they are: a wrapper may write
    into a file), then every open, writable file object on a regular file that the garbage
    collector knows, the frozen ones included (a text file's flush goes on into its buffer's),
    then C's stdio streams. Errors are ignored: a broken pipe or a closed stream has nothing
    more to say."""
    for f in (sys.stdout, sys.stderr):
        try:
            f.flush()
        except Exception:
            pass
    gc.unfreeze()  # listed only when unfrozen; frozen again below (nothing else changes)
    try:
        # type(), not isinstance(): isinstance reads an object's __class__, and some objects
        # warn on any attribute read (torch 1.13's torch.distributed.reduce_op does).
        files = [o for o in gc.get_objects() if issubclass(type(o), _io._IOBase)]
    finally:
        gc.freeze()
    for f in files:
        try:
            if not f.closed and f.writable() and stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                f.flush()
        except Exception:
            pass
    try:
        ctypes.CDLL(None).fflush(None)
    except Exception:
        pass
