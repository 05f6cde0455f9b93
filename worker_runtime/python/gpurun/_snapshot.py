"""The Python state's way through the C++ runtime's snapshot format and through a handoff:
tensors copied with torch straight into (or out of) the page-locked shared-memory mapping that
libgpurun_worker.so manages (``_native.Snapshots``: paths, files, the crash-safe commit, the
XXH64 payload hash), and broadcast tensor by tensor in a handoff; everything else of the state
(param groups, scheduler, the sampler position, any ``state_dict()`` leaf) is a small pickled
skeleton in the manifest.

Manifest (UTF-8 JSON, ASCII): ``{"format": "gpurun-python-state", "version": 1, "tensors":
[[dtype, shape, device_type], ...], "skeleton": base64(pickle)}``; tensor i's bytes (its
``numel() * element_size()`` bytes, C order) are at the offset the format's layout rule gives
(``_native.plan``). docs/python.md#snapshots.
"""
import base64
import copy
import ctypes
import io
import json
import os
import pickle
import sys
import time

import torch
import torch.distributed as dist

from . import _native

FORMAT, VERSION = "gpurun-python-state", 1

# State tensors on the host of at most this many bytes travel inside the skeleton in a handoff
# (a CPU "step" count per parameter would otherwise be one broadcast each).
_INLINE_BYTES = 64 << 10


class _Ref:
    """Tensor ``i`` of the flattened state, in the pickled skeleton."""
    __slots__ = ("i",)

    def __init__(self, i):
        self.i = i

    def __reduce__(self):
        return (_Ref, (self.i,))


def flatten(state, keep=lambda t: True):
    """``state`` (nested dicts, lists, tuples; any leaves) -> ``(skeleton, tensors)``: every
    dense tensor for which ``keep(t)`` holds is replaced by a ``_Ref`` to its index in
    ``tensors`` (others stay in the skeleton). Dict subclasses (OrderedDict) and their
    attributes (a state_dict's ``_metadata``) are kept."""
    tensors = []

    def walk(o):
        if isinstance(o, torch.Tensor):
            if o.layout == torch.strided and not o.is_meta and keep(o):
                tensors.append(o.detach())
                return _Ref(len(tensors) - 1)
            return o
        if isinstance(o, dict):
            try:
                out = type(o)()
            except TypeError:  # a dict subclass that needs arguments: a plain dict then
                out = {}
            for k, v in o.items():
                out[k] = walk(v)
            if hasattr(o, "_metadata"):
                out._metadata = o._metadata
            return out
        if isinstance(o, list):
            return [walk(v) for v in o]
        if isinstance(o, tuple) and not hasattr(o, "_fields"):
            return tuple(walk(v) for v in o)
        return o
    return walk(state), tensors


def unflatten(skeleton, tensors):
    """The inverse of ``flatten``: each ``_Ref`` replaced by its tensor."""
    def walk(o):
        if isinstance(o, _Ref):
            return tensors[o.i]
        if isinstance(o, dict):
            for k in list(o.keys()):
                o[k] = walk(o[k])
            return o
        if isinstance(o, list):
            return [walk(v) for v in o]
        if isinstance(o, tuple) and not hasattr(o, "_fields"):
            return tuple(walk(v) for v in o)
        return o
    return walk(skeleton)


def _dtype(name):
    t = getattr(torch, name.rsplit(".", 1)[-1], None)
    if not isinstance(t, torch.dtype):
        raise _native.SnapshotError(f"the snapshot names an unknown dtype '{name}'")
    return t


def _nbytes(t):
    return t.numel() * t.element_size()


def manifest_of(state):
    """``(manifest bytes, tensors, sizes)`` of ``state`` for a snapshot."""
    skeleton, tensors = flatten(state)
    tensors = [t if t.is_contiguous() else t.contiguous() for t in tensors]
    meta = [[str(t.dtype), list(t.shape), t.device.type] for t in tensors]
    blob = base64.b64encode(pickle.dumps(skeleton, protocol=4)).decode("ascii")
    manifest = json.dumps({"format": FORMAT, "version": VERSION, "tensors": meta,
                           "skeleton": blob}).encode("ascii")
    return manifest, tensors, [_nbytes(t) for t in tensors]


def _large_pool_bytes(device):
    """Bytes the CUDA caching allocator holds in its large pool on ``device`` (segments for
    blocks over 1 MiB, in use or cached): the part of its memory one reserved segment serves."""
    return int(torch.cuda.memory_stats(device).get("reserved_bytes.large_pool.current", 0))


def _host_bytes(base, n):
    """The ``n`` bytes at address ``base`` as a uint8 CPU tensor (no copy; the caller keeps the
    mapping alive while it is used)."""
    return torch.frombuffer((ctypes.c_uint8 * n).from_address(base), dtype=torch.uint8)


def _views(host, offsets, metas):
    out = []
    for off, (dtype, shape, _dev) in zip(offsets, metas):
        dt = _dtype(dtype)
        n = 1
        for d in shape:
            n *= d
        nbytes = n * torch.empty((), dtype=dt).element_size()
        out.append(host[off:off + nbytes].view(dt).view(shape))
    return out


class SnapshotIo:
    """One process's pause snapshots: write (release or hold pause), read (resume), prepare
    (the file made, mapped and page-locked on a background thread while training runs)."""

    def __init__(self, device):
        # GPURUN_RESERVE_AHEAD ("1", default; "0": off): a resume grows the caching allocator
        # to the writer's device memory before its first step (read()).
        v = os.environ.get("GPURUN_RESERVE_AHEAD", "1") or "1"
        if v not in ("0", "1"):
            raise ValueError(f"environment variable GPURUN_RESERVE_AHEAD='{v}' must be 0 or 1")
        self.reserve_ahead = v == "1"
        self.device = device
        self.files = _native.Snapshots()
        self.last = {}  # stats of the last call (seconds, bytes)
        if self.files and device.type == "cuda":
            _install_cuda_pinner()

    def plan_prepare(self, state):
        """The arguments of ``prepare`` for ``state`` as it is now (after the optimizer's first
        step, so that its moments exist): cheap, on the training thread."""
        manifest, tensors, sizes = manifest_of(state)
        on_device = any(t.device.type != "cpu" for t in tensors)
        return len(manifest), sizes, on_device

    def prepare(self, manifest_bytes, sizes, on_device):
        """Blocks (run it on a thread): the snapshot file made, mapped and page-locked (CUDA)
        or mlock-ed (CPU) for that state. Returns the stats; "error" says why there is no
        file, "lock_error" why it is not locked."""
        return self.files.prepare(manifest_bytes, sizes, on_device,
                                  lock_host_memory=not on_device)

    def write(self, state):
        """Writes ``state`` into the run's snapshot file: every tensor copied with torch into
        the mapping (device tensors: asynchronous copies into page-locked memory, one
        synchronise), hashed and committed by the library. Blocks. Returns the stats."""
        manifest, tensors, sizes = manifest_of(state)
        on_device = any(t.device.type != "cpu" for t in tensors)
        end = _native.plan(len(manifest), sizes)[1]

        def fill(base, offsets):
            host = _host_bytes(base, end)
            devices = set()
            for t, off, n in zip(tensors, offsets, sizes):
                if n == 0:
                    continue
                dst = host[off:off + n].view(t.dtype).view(t.shape)
                if t.device.type == "cuda":
                    devices.add(t.device)
                    dst.copy_(t, non_blocking=True)
                else:
                    dst.copy_(t)
            for d in devices:
                torch.cuda.synchronize(d)
        # This process's device memory (state, gradients, cached activations): the resume
        # reserves as much ahead of its first step (_reserve).
        reserved = _large_pool_bytes(self.device) if self.device.type == "cuda" else 0
        self.last = self.files.write(manifest, sizes, on_device, fill, reserved)
        return self.last

    def read(self, verify=True):
        """The state of the run's snapshot, checked (header; payload checksum when
        ``verify``): tensors on their device of the snapshot (CUDA ones on ``self.device``),
        copied out of the mapping so that nothing aliases it. Returns ``(state, stats)``;
        raises SnapshotError naming the file and what is wrong."""
        on_device = self.device.type == "cuda"
        info = self.files.read(verify, on_device)
        manifest = info["manifest"]
        try:
            m = json.loads(manifest)
            ok = m.get("format") == FORMAT and m.get("version") == VERSION
        except ValueError:
            ok = False
        if not ok:
            raise _native.SnapshotError(
                f"the pause snapshot '{info['path']}' does not hold a Python state of this "
                f"package (format {FORMAT} {VERSION}): was it written by the C++ runtime?")
        metas = m["tensors"]
        sizes = []
        for dtype, shape, _dev in metas:
            n = 1
            for d in shape:
                n *= d
            sizes.append(n * torch.empty((), dtype=_dtype(dtype)).element_size())
        offsets, end = _native.plan(len(manifest), sizes)
        if end != info["data_end"] or len(metas) != info["tensor_count"]:
            raise _native.SnapshotError(
                f"the pause snapshot '{info['path']}' is corrupt: its manifest describes "
                f"{len(metas)} tensors ending at byte {end}, its header {info['tensor_count']} "
                f"ending at byte {info['data_end']}")
        host = _host_bytes(self.files.data(), end)
        views = _views(host, offsets, metas)
        tensors = []
        for v, (_dt, _shape, dev) in zip(views, metas):
            if dev == "cpu" or not on_device:
                tensors.append(v.clone())
            else:
                tensors.append(v.to(self.device, non_blocking=True))
        if on_device:
            self._reserve(info)  # the state's tensors are allocated: the rest of the writer's
            torch.cuda.synchronize(self.device)
        skeleton = pickle.loads(base64.b64decode(m["skeleton"]))  # this job's own bytes
        info["tensor_bytes"] = sum(sizes)
        self.last = info
        return unflatten(skeleton, tensors), info

    def _reserve(self, info):
        """Grows the CUDA caching allocator's large pool on ``self.device`` towards the writer's
        (the header's ``device_reserved_bytes``), once the state's tensors are allocated, by
        what the library's rule says: one
        allocation on the current stream (the one training runs on), freed at once, so that
        the first step's gradients and activations come from the cache (the C++ runtime's
        StateRegistry::read_snapshot does the same). Records ``reserved_ahead_bytes``,
        ``reserve_s`` and ``reserve_note`` in ``info``. Never raises: an allocation that fails
        is only noted (training allocates as it would have)."""
        hint = int(info.get("device_reserved_bytes", 0))
        info["reserved_ahead_bytes"], info["reserve_s"], info["reserve_note"] = 0, 0.0, ""
        if not (self.reserve_ahead and hint > 0):
            return
        t0 = time.perf_counter()
        try:
            free, _total = torch.cuda.mem_get_info(self.device)
            n, note = self.files.plan_reserve(hint, _large_pool_bytes(self.device), free)
            if n > 0:
                stream = torch.cuda.current_stream(self.device)
                ptr = torch.cuda.caching_allocator_alloc(n, self.device, stream)
                torch.cuda.caching_allocator_delete(ptr)  # the segment stays cached for stream
            info["reserved_ahead_bytes"], info["reserve_note"] = n, note
        except Exception as e:  # noqa: BLE001 - only an optimisation: the first step allocates
            info["reserve_note"] = f"{type(e).__name__}: {e}"
        info["reserve_s"] = time.perf_counter() - t0

    def leave_to_exit(self):
        self.files.leave_to_exit()


def load_skeleton(data):
    """The (skeleton, metas) pair broadcast_state's root pickled (``data``: bytes). It holds
    gpurun's ``_Ref`` placeholders for the tensors sent apart: torch >= 2.6 loads only plain
    tensors by default (``weights_only=True``), which refused every handoff of a CUDA or big
    tensor; the blob is the job's own root rank's, as torch.distributed's object collectives
    unpickle theirs. Raises what torch.load raises."""
    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=False)


def _sent_apart(t):
    """Whether broadcast_state sends tensor ``t`` by a broadcast of its own (a device tensor,
    or a host one over 64 KiB) rather than inside the pickled skeleton."""
    return t.device.type != "cpu" or _nbytes(t) > _INLINE_BYTES


def _fields_after_step(optimizer, group):
    """How many tensors of its parameter's shape one parameter's state holds after a step of
    torch's ``optimizer`` (its step() in torch/optim/{adam,adamw,sgd,rmsprop}.py; Adagrad makes
    its state in its constructor); 0 for any other optimizer (nothing is reserved for it)."""
    name = type(optimizer).__name__
    if name in ("Adam", "AdamW"):
        return 3 if group.get("amsgrad") else 2
    if name == "SGD":
        return 1 if group.get("momentum", 0) else 0
    if name == "RMSprop":
        return 1 + (group.get("momentum", 0) > 0) + bool(group.get("centered"))
    return 0


def reserve_receive(state, optimizer):
    """A CPU warm joiner's receive buffers, written before it is ready (off the job's path), so
    that a handoff receives into memory already there instead of faulting fresh pages in with
    every peer waiting (0.4-0.5 s per GB on the CPU machine; StateRegistry::reserve_receive is
    the C++ runtime's): one zero tensor like each tensor broadcast_state would send of
    ``state`` (this rank's ``_state()``: its model's), plus, per parameter of ``optimizer``
    without state, the ones its step would create (_fields_after_step). Returns the list
    (broadcast_state takes matching ones; the rest are freed with it)."""
    _, tensors = flatten(state, keep=lambda t: t.device.type == "cpu" and _sent_apart(t))
    out = [torch.zeros_like(t, memory_format=torch.contiguous_format) for t in tensors]
    if optimizer is not None:
        for group in optimizer.param_groups:
            k = _fields_after_step(optimizer, group)
            for p in group["params"]:
                if k and not optimizer.state.get(p) and p.device.type == "cpu" and _sent_apart(p):
                    out.extend(torch.zeros_like(p, memory_format=torch.contiguous_format)
                               for _ in range(k))
    return out


def _take_reserved(reserve, shape, dtype, device):
    """One tensor of ``reserve`` of this shape and dtype on the CPU (removed from it), else a new
    uninitialised one on ``device``."""
    if reserve and device.type == "cpu":
        for i, t in enumerate(reserve):
            if t.dtype == dtype and list(t.shape) == list(shape):
                return reserve.pop(i)
    return torch.empty(shape, dtype=dtype, device=device)


def broadcast_state(state, root, device, load, reserve=None):
    """Sends the root's ``state`` to every rank of the current process group, tensor by tensor
    on ``device`` (the backend's device: CUDA for NCCL); the skeleton and small host tensors
    (<= 64 KiB) as one pickled blob first. Every rank calls it; ``state`` matters only on the
    root. Returns ``(state or None, bytes)``: the received state on a rank with ``load`` (its
    tensors on their device of the root: CUDA ones on ``device`` when it is CUDA), None
    elsewhere. ``reserve``: reserve_receive()'s buffers: a receiver takes matching ones instead
    of new tensors (they are removed from the list). Blocks; raises what the collectives
    raise."""
    is_root = dist.get_rank() == root
    if is_root:
        skeleton, tensors = flatten(
            state, keep=_sent_apart)
        metas = [[str(t.dtype), list(t.shape), t.device.type] for t in tensors]
        buf = io.BytesIO()
        torch.save((skeleton, metas), buf)  # small: no big tensor is in it
        blob = torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)
        n = torch.tensor([blob.numel()], dtype=torch.int64)
    else:
        n = torch.zeros(1, dtype=torch.int64)
    n = n.to(device)
    dist.broadcast(n, root)
    if not is_root:
        blob = torch.empty(int(n.item()), dtype=torch.uint8)
    blob = blob.to(device)
    dist.broadcast(blob, root)
    total = int(n.item())
    if not is_root:
        skeleton, metas = load_skeleton(blob.cpu().numpy().tobytes())
        tensors = None
    received = []
    for i, (dtype, shape, dev) in enumerate(metas):
        if is_root:
            t = tensors[i].contiguous().to(device)
        else:
            t = _take_reserved(reserve, shape, _dtype(dtype), device)
        if t.numel():
            dist.broadcast(t, root)
        total += _nbytes(t)
        if load and not is_root:
            received.append(t if (dev != "cpu" and device.type != "cpu") else t.cpu())
        del t
    if load and not is_root:
        return unflatten(skeleton, received), total
    return None, total


def load_optimizer_owned(optimizer, state_dict):
    """``optimizer.load_state_dict(state_dict)`` for a state whose tensors belong to nobody else
    (a handoff's, just received): the optimizer keeps them instead of copying them. torch 1.13's
    ``Optimizer.load_state_dict`` deep-copies its argument (AdamW's two moments of a 1 GB state:
    0.3-2.2 s on the CPU machine, docs/results.md#the-python-packages-handoff-2026-12-06-evening);
    torch >= 2.0 copies the dict only, and is called as is. Raises what load_state_dict raises."""
    module = sys.modules.get(type(optimizer).load_state_dict.__module__)
    real = getattr(module, "deepcopy", None)
    if real is not copy.deepcopy:  # torch >= 2.0 (a shallow copy), or an optimizer of its own
        return optimizer.load_state_dict(state_dict)
    keep = {}

    def collect(x):
        if isinstance(x, torch.Tensor):
            keep[id(x)] = x
        elif isinstance(x, dict):
            for v in x.values():
                collect(v)
        elif isinstance(x, (list, tuple)):
            for v in x:
                collect(v)

    collect(state_dict)

    def deepcopy_keeping_tensors(x, memo=None):
        return real(x, dict(keep) if memo is None else memo)

    module.deepcopy = deepcopy_keeping_tensors
    try:
        return optimizer.load_state_dict(state_dict)
    finally:
        module.deepcopy = real


_pinner_installed = False


def _install_cuda_pinner():
    """Gives libgpurun_worker.so the process's own libcudart functions (the one torch loaded),
    so that snapshot mappings are page-locked with cudaHostRegister; without them copies are
    pageable (slower, still correct)."""
    global _pinner_installed
    if _pinner_installed:
        return
    _pinner_installed = True
    torch.cuda.init()
    path = None
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                if "libcudart" in line:
                    path = line.split()[-1]
                    break
    except OSError:
        pass
    if path is None:
        return
    try:
        rt = ctypes.CDLL(path)
        reg, unreg, err = rt.cudaHostRegister, rt.cudaHostUnregister, rt.cudaGetLastError
    except (OSError, AttributeError):
        return
    _native.set_pinner(reg, unreg, err)
