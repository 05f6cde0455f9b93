"""ctypes binding of gpurun's worker protocol engine: ``libgpurun_worker.so``, built with the
launcher and named to every worker by gpurun in ``GPURUN_WORKER_LIBRARY`` (so the package needs
no compiler and cannot drift from the launcher's protocol). C interface:
launcher/protocol/capi/gpurun_worker.h; the engine: docs/control-protocol.md#worker-engine.

Events and actions are dicts (the engine's JSON). Errors: ``ProtocolError`` (a bad value or an
executor bug), ``StoreError`` (the store connection), ``Abandoned`` (gpurun abandoned the
generation's set-up: a participant died). A static run never loads the library.
"""
import ctypes
import json
import os

ABI = 1


class ProtocolError(RuntimeError):
    """A control-protocol value that does not parse, or an event out of place."""


class StoreError(RuntimeError):
    """gpurun's store connection failed."""


class Abandoned(RuntimeError):
    """gpurun abandoned a generation's set-up (a participant died before it was set up)."""


_KINDS = {1: ProtocolError, 2: StoreError, 3: Abandoned, 4: ProtocolError, 5: RuntimeError}
_lib = None


def load(path=None):
    """The library at ``path`` (default: $GPURUN_WORKER_LIBRARY), loaded once per process.
    Raises RuntimeError naming the path when it is missing or of another ABI."""
    global _lib
    if _lib is not None:
        return _lib
    path = path or os.environ.get("GPURUN_WORKER_LIBRARY", "")
    if not path:
        raise RuntimeError(
            "GPURUN_WORKER_LIBRARY is not set: an elastic run (gpurun --config) needs the "
            "worker engine library of the gpurun that started it (libgpurun_worker.so, next to "
            "the gpurun binary); this gpurun does not name one (is it older than the package?)")
    try:
        lib = ctypes.CDLL(path)
    except OSError as e:
        raise RuntimeError(f"cannot load gpurun's worker engine library '{path}': {e}") from e
    c = ctypes
    sig = {
        "gpurun_worker_abi": (c.c_int, []),
        "gpurun_last_error": (c.c_char_p, []),
        "gpurun_last_error_kind": (c.c_int, []),
        "gpurun_free": (None, [c.c_void_p]),
        "gpurun_worker_open": (c.c_void_p, []),
        "gpurun_worker_close": (None, [c.c_void_p]),
        "gpurun_worker_on": (c.c_void_p, [c.c_void_p, c.c_char_p]),
        "gpurun_worker_info": (c.c_void_p, [c.c_void_p]),
        "gpurun_worker_wait_arrivals": (c.c_int, [c.c_void_p, c.c_char_p, c.c_int, c.c_int,
                                                  c.c_char_p, c.c_int64]),
        "gpurun_worker_put_slot_data": (c.c_int, [c.c_void_p, c.c_char_p, c.c_char_p,
                                                  c.c_size_t]),
        "gpurun_worker_get_slot_data": (c.c_void_p, [c.c_void_p, c.c_char_p,
                                                     c.POINTER(c.c_size_t)]),
        "gpurun_progress_open": (c.c_void_p, []),
        "gpurun_progress_step": (None, [c.c_void_p, c.c_uint64]),
        "gpurun_progress_close": (None, [c.c_void_p]),
        "gpurun_engine_new": (c.c_void_p, [c.c_char_p]),
        "gpurun_engine_free": (None, [c.c_void_p]),
        "gpurun_engine_on": (c.c_void_p, [c.c_void_p, c.c_char_p]),
    }
    for name, (res, args) in sig.items():
        f = getattr(lib, name)
        f.restype, f.argtypes = res, args
    if lib.gpurun_worker_abi() != ABI:
        raise RuntimeError(f"gpurun's worker engine library '{path}' has ABI "
                           f"{lib.gpurun_worker_abi()}, this package speaks {ABI}: use the "
                           "package of the same gpurun")
    _lib = lib
    return lib


def _raise(lib):
    kind = lib.gpurun_last_error_kind()
    text = (lib.gpurun_last_error() or b"").decode(errors="replace")
    raise _KINDS.get(kind, RuntimeError)(text)


def _take(lib, ptr):
    """The malloc'd UTF-8 string at ptr as str (freed), or raises the library's error."""
    if not ptr:
        _raise(lib)
    try:
        return ctypes.string_at(ptr).decode()
    finally:
        lib.gpurun_free(ptr)


class Session:
    """One worker's session with gpurun (WorkerSession): the engine plus its store I/O.
    ``on(event)`` blocks while the engine waits on the store (a decision, a wake) and returns
    the executor's actions, in order; the last may need an outcome (the next event)."""

    def __init__(self, lib=None):
        self._lib = lib or load()
        self._h = self._lib.gpurun_worker_open()
        if not self._h:
            if self._lib.gpurun_last_error_kind():
                _raise(self._lib)
            raise RuntimeError("gpurun_worker_open: this process is not elastic "
                               "(GPURUN_ELASTIC is not 1)")

    def on(self, event):
        return json.loads(_take(self._lib, self._lib.gpurun_worker_on(
            self._h, json.dumps(event).encode())))

    def info(self):
        return json.loads(_take(self._lib, self._lib.gpurun_worker_info(self._h)))

    def wait_arrivals(self, prefix, rank, size, abort_key, timeout_s):
        if self._lib.gpurun_worker_wait_arrivals(self._h, prefix.encode(), rank, size,
                                                 abort_key.encode(), int(timeout_s * 1000)):
            _raise(self._lib)

    def put_slot_data(self, name, data):
        if self._lib.gpurun_worker_put_slot_data(self._h, name.encode(), data, len(data)):
            _raise(self._lib)

    def get_slot_data(self, name):
        n = ctypes.c_size_t(0)
        p = self._lib.gpurun_worker_get_slot_data(self._h, name.encode(), ctypes.byref(n))
        if not p:
            if self._lib.gpurun_last_error_kind():
                _raise(self._lib)
            return None
        try:
            return ctypes.string_at(p, n.value)
        finally:
            self._lib.gpurun_free(p)


class Progress:
    """This slot's step-progress line for gpurun's power-limit profiler (GPURUN_PROGRESS_FILE):
    ``step(n)`` after the n-th optimizer step; a no-op when gpurun gave none."""

    def __init__(self, lib=None):
        self._lib = lib or load()
        self._h = self._lib.gpurun_progress_open()

    def step(self, global_step):
        if self._h:
            self._lib.gpurun_progress_step(self._h, global_step)


class Engine:
    """The pure engine (no store): every action of an event, store ones included (tests)."""

    def __init__(self, options, lib=None):
        self._lib = lib or load()
        self._h = self._lib.gpurun_engine_new(json.dumps(options).encode())
        if not self._h:
            _raise(self._lib)

    def on(self, event):
        return json.loads(_take(self._lib, self._lib.gpurun_engine_on(
            self._h, json.dumps(event).encode())))

    def __del__(self):
        if getattr(self, "_h", None):
            self._lib.gpurun_engine_free(self._h)
            self._h = None
