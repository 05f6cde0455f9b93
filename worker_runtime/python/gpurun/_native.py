"""ctypes binding of gpurun's worker protocol engine: ``libgpurun_worker.so``, built with the
launcher and named to every worker by gpurun in ``GPURUN_WORKER_LIBRARY`` (so the package needs
no compiler and cannot drift from the launcher's protocol); without the variable, the copy an
installed wheel holds in ``gpurun/_bin/`` (scripts/wheel.sh, docs/python.md#wheel). C interface:
worker_runtime/capi/gpurun_worker.h; the engine: docs/control-protocol.md#worker-engine.

Events and actions are dicts (the engine's JSON). Errors: ``ProtocolError`` (a bad value or an
executor bug), ``StoreError`` (the store connection), ``Abandoned`` (gpurun abandoned the
generation's set-up: a participant died), ``SnapshotError`` (a pause snapshot refused or not
written). A static run never loads the library. The snapshot host side (paths, files, commit,
XXH64) is ``Snapshots``; the torch copies around it are in ``_snapshot.py``.
"""
import ctypes
import json
import os

ABI = 7  # gpurun_worker.h GPURUN_WORKER_ABI (7: energy questions)


class ProtocolError(RuntimeError):
    """A control-protocol value that does not parse, or an event out of place."""


class StoreError(RuntimeError):
    """gpurun's store connection failed."""


class Abandoned(RuntimeError):
    """gpurun abandoned a generation's set-up (a participant died before it was set up)."""


class SnapshotError(RuntimeError):
    """A pause snapshot refused (incomplete, corrupt, another format: the message names the
    file and what is wrong) or not written (every path failed)."""


_KINDS = {1: ProtocolError, 2: StoreError, 3: Abandoned, 4: ProtocolError, 5: RuntimeError,
          6: SnapshotError}

# gpurun_snapshot_fill_fn: (ctx, base, offsets, n) -> 0 when every copy has landed
FILL_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                           ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t)
_HOST_REGISTER = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint)
_HOST_UNREGISTER = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)
_HOST_LAST_ERROR = ctypes.CFUNCTYPE(ctypes.c_int)
_lib = None


def _not_the_library(path, why):
    """The error for a GPURUN_WORKER_LIBRARY that is not gpurun's worker library: which path,
    what is wrong with it, and what to do."""
    return RuntimeError(
        f"GPURUN_WORKER_LIBRARY='{path}' {why}: it must name the worker engine library "
        "(libgpurun_worker.so, next to the gpurun binary) of the gpurun that started this "
        "process, which sets it; unset it in your environment or name that file")


def bundled_library():
    """The ``libgpurun_worker.so`` an installed wheel holds beside its ``gpurun`` binary
    (``<package>/_bin/``), or "" (a source tree, ``PYTHONPATH=worker_runtime/python``)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bin", "libgpurun_worker.so")
    return path if os.path.isfile(path) else ""


def load(path=None):
    """The library at ``path`` (default: $GPURUN_WORKER_LIBRARY, which gpurun sets to the one
    next to its binary; unset or empty: the wheel's copy, ``bundled_library()``), loaded once
    per process. Raises RuntimeError naming the path and what is wrong when it is missing, not
    a loadable library, not gpurun's worker library (no ``gpurun_worker_abi``), of another ABI
    or lacking one of the functions this package calls."""
    global _lib
    if _lib is not None:
        return _lib
    path = path or os.environ.get("GPURUN_WORKER_LIBRARY", "") or bundled_library()
    if not path:
        raise RuntimeError(
            "GPURUN_WORKER_LIBRARY is not set: an elastic run (gpurun --config) needs the "
            "worker engine library of the gpurun that started it (libgpurun_worker.so, next to "
            "the gpurun binary); this gpurun does not name one (is it older than the package?), "
            f"and this package ({os.path.dirname(os.path.abspath(__file__))}) holds no copy in "
            "_bin/ (a source tree: only an installed wheel has one)")
    if not os.path.exists(path):
        raise _not_the_library(path, "does not exist")
    if os.path.isdir(path):
        raise _not_the_library(path, "is a directory")
    try:
        lib = ctypes.CDLL(path)
    except OSError as e:  # not a shared library, another architecture, a missing dependency
        if path == bundled_library():  # the wheel's own copy: a library missing on this system
            raise RuntimeError(
                f"gpurun's worker library '{path}' (this wheel's copy) cannot be loaded ({e}): "
                "install what it needs (Debian/Ubuntu: libfmt9; docs/python.md#wheel) or build "
                "gpurun from source") from e
        raise _not_the_library(path, f"cannot be loaded ({e})") from e
    try:
        lib.gpurun_worker_abi
    except AttributeError:
        raise _not_the_library(path, "is a shared library but not gpurun's worker library (it "
                                     "has no gpurun_worker_abi function)") from None
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
        "gpurun_worker_install_term_handler": (c.c_int, []),
        "gpurun_worker_wait_arrivals": (c.c_int, [c.c_void_p, c.c_char_p, c.c_int, c.c_int,
                                                  c.c_char_p, c.c_int64]),
        "gpurun_worker_put_slot_data": (c.c_int, [c.c_void_p, c.c_char_p, c.c_char_p,
                                                  c.c_size_t]),
        "gpurun_worker_get_slot_data": (c.c_void_p, [c.c_void_p, c.c_char_p,
                                                     c.POINTER(c.c_size_t)]),
        "gpurun_worker_energy_ask": (c.c_void_p, [c.c_void_p, c.c_char_p, c.c_int64]),
        "gpurun_progress_open": (c.c_void_p, []),
        "gpurun_progress_step": (None, [c.c_void_p, c.c_uint64]),
        "gpurun_progress_close": (None, [c.c_void_p]),
        "gpurun_position_text": (c.c_void_p, [c.c_int64, c.c_int64]),
        "gpurun_preload_cuda_libraries": (c.c_void_p, []),
        "gpurun_engine_new": (c.c_void_p, [c.c_char_p]),
        "gpurun_engine_free": (None, [c.c_void_p]),
        "gpurun_engine_on": (c.c_void_p, [c.c_void_p, c.c_char_p]),
        "gpurun_snapshot_set_pinner": (None, [c.c_void_p, c.c_void_p, c.c_void_p]),
        "gpurun_snapshot_plan": (c.c_uint64, [c.c_uint64, c.POINTER(c.c_uint64), c.c_size_t,
                                              c.POINTER(c.c_uint64)]),
        "gpurun_snapshot_file_bytes": (c.c_uint64, [c.c_uint64, c.c_uint64]),
        "gpurun_snapshots_open": (c.c_void_p, [c.c_char_p, c.c_char_p]),
        "gpurun_snapshots_close": (None, [c.c_void_p]),
        "gpurun_snapshots_leave_to_exit": (None, [c.c_void_p]),
        "gpurun_snapshots_data": (c.c_void_p, [c.c_void_p]),
        "gpurun_snapshots_prepare": (c.c_void_p, [c.c_void_p, c.c_uint64, c.POINTER(c.c_uint64),
                                                  c.c_size_t, c.c_int, c.c_int]),
        "gpurun_snapshots_write": (c.c_void_p, [c.c_void_p, c.c_char_p, c.c_size_t,
                                                c.POINTER(c.c_uint64), c.c_size_t, c.c_int,
                                                c.c_uint64, FILL_FN, c.c_void_p]),
        "gpurun_snapshots_read": (c.c_void_p, [c.c_void_p, c.c_int, c.c_int]),
        "gpurun_snapshot_plan_reserve": (c.c_void_p, [c.c_uint64, c.c_uint64, c.c_uint64]),
        "gpurun_snapshots_premap": (c.c_void_p, [c.c_void_p, c.c_int]),
    }
    # The ABI first: a library of another gpurun may lack functions named below.
    lib.gpurun_worker_abi.restype, lib.gpurun_worker_abi.argtypes = ctypes.c_int, []
    if lib.gpurun_worker_abi() != ABI:
        raise RuntimeError(f"gpurun's worker engine library '{path}' has ABI "
                           f"{lib.gpurun_worker_abi()}, this package speaks {ABI}: use the "
                           "package of the same gpurun")
    for name, (res, args) in sig.items():
        try:
            f = getattr(lib, name)
        except AttributeError:
            raise _not_the_library(path, f"has ABI {ABI} but no {name} function (a build of "
                                         "another gpurun?)") from None
        f.restype, f.argtypes = res, args
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


def position_text(epoch, step):
    """gpurun's words for a position training resumes at (control::position_text): (E, 0)
    "after epoch E", (E, S) "in epoch E+1 after step S"."""
    lib = load()
    return _take(lib, lib.gpurun_position_text(int(epoch), int(step)))


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

    def energy_ask(self, question, timeout_s):
        """An energy question to gpurun (WorkerSession::energy_ask): its answer (dict; {} for
        a "begin"). Blocks up to ``timeout_s``; raises StoreError without an answer."""
        text = _take(self._lib, self._lib.gpurun_worker_energy_ask(
            self._h, json.dumps(question).encode(), int(timeout_s * 1000)))
        return json.loads(text) if text else {}

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


def _u64s(values):
    return (ctypes.c_uint64 * max(1, len(values)))(*values)


def install_term_handler(lib=None):
    """Slurm's SIGTERM (docs/cli.md#preemption): under Slurm and gpurun, installs the library's
    SIGTERM handler unless the program has one: a SIGTERM not from gpurun (slurmstepd sends it
    to every process of the step) only counts, so this worker reaches gpurun's stop at its next
    boundary instead of dying with its state; gpurun's own SIGTERM still ends it. Returns True
    when installed. Never blocks."""
    return bool((lib or load()).gpurun_worker_install_term_handler())


def preload_cuda_libraries(lib=None):
    """A standby, before it waits for its go: opens cuDNN's and cuBLAS's lazily opened
    libraries beside the loaded ones (dlopen only: no CUDA call, the GPU stays untouched), so
    that the first step after the go does not. Blocks (tens of ms). Returns a dict: loaded (int),
    failed (list of "path: why"), seconds (float)."""
    lib = lib or load()
    return json.loads(_take(lib, lib.gpurun_preload_cuda_libraries()))


def plan(manifest_bytes, sizes, lib=None):
    """The snapshot format's layout rule: each tensor's file offset (bytes) after a manifest of
    ``manifest_bytes`` bytes, and data_end. Returns ``(offsets, data_end)``."""
    lib = lib or load()
    out = _u64s([0] * len(sizes))
    end = lib.gpurun_snapshot_plan(manifest_bytes, _u64s(sizes), len(sizes), out)
    return list(out)[:len(sizes)], end


def set_pinner(register, unregister, last_error, lib=None):
    """Page-locks snapshot mappings with these ctypes functions of the process's libcudart
    (cudaHostRegister, cudaHostUnregister, cudaGetLastError); None: no page-locking."""
    lib = lib or load()
    if register is None:
        lib.gpurun_snapshot_set_pinner(None, None, None)
        return
    cast = lambda f: ctypes.cast(f, ctypes.c_void_p)  # noqa: E731 - raw C function pointers
    lib.gpurun_snapshot_set_pinner(cast(register), cast(unregister), cast(last_error))


class Snapshots:
    """The run's pause snapshot files (GPURUN_SNAPSHOT_PATH, then
    GPURUN_SNAPSHOT_FALLBACK_PATH): the C++ runtime's host side through the C interface. Each
    call blocks (ctypes releases the GIL); stats dicts hold seconds and bytes (gpurun_worker.h).
    ``prepare`` may run on another thread; the other calls then wait for it."""

    def __init__(self, primary=None, fallback=None, lib=None):
        self._lib = lib or load()
        enc = lambda p: None if p is None else p.encode()  # noqa: E731
        self._h = self._lib.gpurun_snapshots_open(enc(primary), enc(fallback))
        if not self._h and self._lib.gpurun_last_error_kind():
            _raise(self._lib)

    def __bool__(self):
        return bool(self._h)

    def data(self):
        """The address (int) of the kept mapping's byte 0, or 0 when none is mapped."""
        return self._lib.gpurun_snapshots_data(self._h) or 0

    def prepare(self, manifest_bytes, sizes, on_device, lock_host_memory):
        return json.loads(_take(self._lib, self._lib.gpurun_snapshots_prepare(
            self._h, manifest_bytes, _u64s(sizes), len(sizes), int(on_device),
            int(lock_host_memory))))

    def premap(self, on_device):
        """Maps (and page-locks) the committed snapshot a resume will read; blocks."""
        return json.loads(_take(self._lib, self._lib.gpurun_snapshots_premap(
            self._h, int(on_device))))

    def write(self, manifest, sizes, on_device, fill, device_reserved_bytes=0):
        """Writes a snapshot of ``manifest`` (bytes) and tensors of ``sizes`` bytes; ``fill(base,
        offsets)`` copies tensor i to address base + offsets[i] and returns once they landed.
        ``device_reserved_bytes``: what this process's CUDA caching allocator holds in its large
        pool (0: none),
        recorded in the header for the reader (``plan_reserve``). Returns the stats; raises
        SnapshotError when no path could hold it, or what ``fill`` raised (no file remains then
        either)."""
        failure = []

        def cb(_ctx, base, offsets, n):
            try:
                fill(base, [offsets[i] for i in range(n)])
                return 0
            except BaseException as e:  # noqa: BLE001 - re-raised below, after the C call
                failure.append(e)
                return 1
        fn = FILL_FN(cb)
        ptr = self._lib.gpurun_snapshots_write(self._h, manifest, len(manifest), _u64s(sizes),
                                               len(sizes), int(on_device),
                                               int(device_reserved_bytes), fn, None)
        if not ptr and failure:
            raise failure[0]  # the copy's own error (the library removed the file)
        return json.loads(_take(self._lib, ptr))

    def read(self, verify, on_device):
        return json.loads(_take(self._lib, self._lib.gpurun_snapshots_read(
            self._h, int(verify), int(on_device))))

    def plan_reserve(self, hint, reserved_now, free_now):
        """Bytes (int) a resume reserves ahead of its first step and why not all that is
        missing (str, "" when all): the library's rule (snapshot::plan_device_reserve) from the
        writer's ``device_reserved_bytes`` (hint), the caching allocator's reserved bytes and
        the device's free bytes; PYTORCH_ALLOC_CONF, PYTORCH_CUDA_ALLOC_CONF and
        PYTORCH_NO_CUDA_MEMORY_CACHING are read from the environment."""
        out = json.loads(_take(self._lib, self._lib.gpurun_snapshot_plan_reserve(
            int(hint), int(reserved_now), int(free_now))))
        return out["bytes"], out["note"]

    def leave_to_exit(self):
        if self._h:
            self._lib.gpurun_snapshots_leave_to_exit(self._h)

    def close(self):
        if self._h:
            self._lib.gpurun_snapshots_close(self._h)
            self._h = None


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
