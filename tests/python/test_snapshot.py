#!/usr/bin/env python3
"""ctest python_snapshot: the Python package's state path through the C++ runtime's snapshot
format (libgpurun_worker.so's host side, torch copies around it) and its tensor-wise handoff.

Checks what a user would notice: a state written and read back is equal (model, AdamW moments,
scheduler, a state_dict's _metadata, the position), in the C++ format (magic, version 4);
nothing read aliases the shared mapping (a later pause cannot change the training state); a
corrupt, incomplete or truncated file is refused naming the file and what is wrong; a primary
path that cannot hold the file falls back to the second path; a file-size limit (ulimit -f)
below the snapshot makes the write fail with a message instead of killing the process with
SIGXFSZ; a prepared file is reused by the write; a joiner with a fresh optimizer receives the
whole state over a Gloo group. Usage: test_snapshot.py LIBGPURUN_WORKER_SO"""
import collections
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "..", "worker_runtime", "python"))
os.environ["GPURUN_WORKER_LIBRARY"] = os.path.abspath(sys.argv[1])
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from gpurun import _native, _snapshot  # noqa: E402

CPU = torch.device("cpu")


def make_state(seed):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16),
                                torch.nn.Linear(16, 3))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, 2)
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(5, 8)).sum().backward()
        opt.step()
        sched.step()
    state = {"position": {"epoch": 4, "step": 7, "sampler": {"epoch": 4, "cursor": 35}},
             "model": model.state_dict(), "optimizer": opt.state_dict(),
             "other.scheduler": sched.state_dict()}
    return state, (model, opt, sched)


def same(a, b, where="state"):
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape, where
        assert torch.equal(a, b), where
    elif isinstance(a, dict):
        assert type(a) is type(b) and list(a.keys()) == list(b.keys()), (where, a.keys(), b.keys())
        for k in a:
            same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{where}[{i}]")
    else:
        assert a == b, (where, a, b)


def io_at(primary, fallback=""):
    os.environ["GPURUN_SNAPSHOT_PATH"] = primary
    os.environ["GPURUN_SNAPSHOT_FALLBACK_PATH"] = fallback
    return _snapshot.SnapshotIo(CPU)


def expect_refused(io, text):
    try:
        io.read(verify=True)
    except _native.SnapshotError as e:
        assert text in str(e) and io.files and "snap" in str(e), str(e)
        return
    raise AssertionError(f"a snapshot with {text!r} was read")


# (7, below) The handoff: a joiner with a fresh optimizer (no moments yet) gets the whole state, over a
# Gloo group of two processes of this script (fresh interpreters: no fork of a torch process).
def handoff(rank, store_path, out_path):
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=2)
    s, (model, opt, sched) = make_state(11 if rank == 0 else 12)
    if rank == 1:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)  # fresh: empty state
    got, total = _snapshot.broadcast_state(s if rank == 0 else None, 0, CPU, load=rank == 1)
    if rank == 1:
        model.load_state_dict(got["model"])
        opt.load_state_dict(got["optimizer"])
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "total": total},
                   out_path)
    else:
        torch.save({"model": s["model"], "optimizer": s["optimizer"], "total": total},
                   out_path + ".root")
    dist.destroy_process_group()


if __name__ == "__main__" and len(sys.argv) > 2 and sys.argv[2] == "handoff":
    handoff(int(sys.argv[3]), sys.argv[4], sys.argv[5])
    sys.exit(0)


tmp = tempfile.mkdtemp(prefix="gpurun-pysnap-")
path = os.path.join(tmp, "state.snapshot")

# 1. Round trip, in the C++ runtime's format.
state, objs = make_state(1)
io = io_at(path)
st = io.write(state)
assert st["path"] == path and st["created"] and st["tensor_bytes"] > 0, st
with open(path, "rb") as f:
    head = f.read(128)
assert head[:8] == b"GPURUNSS" and struct.unpack("<I", head[8:12])[0] == 4, head[:12]
back, info = io.read(verify=True)
same(state, back)
assert hasattr(back["model"], "_metadata") and back["model"]._metadata == state["model"]._metadata
assert isinstance(back["model"], collections.OrderedDict)
# load_state_dict takes it: a fresh model and optimizer continue where the first left off
_, (m2, o2, s2) = make_state(2)
m2.load_state_dict(back["model"])
o2.load_state_dict(back["optimizer"])
s2.load_state_dict(back["other.scheduler"])
same(objs[0].state_dict(), m2.state_dict(), "model after load")
print("python_snapshot: round trip in the C++ format OK")

# 1b. The writer's device memory (a hint for the reader's reservation ahead of its first step):
# a CPU state's is 0 (bytes 112..119); what a writer passes comes back from the read; the rule
# of how much to reserve is the library's (the C++ table test's cases, through the C API).
assert struct.unpack("<Q", head[112:120])[0] == 0 and info["device_reserved_bytes"] == 0, info
GiB = 1 << 30
empty_manifest, _, empty_sizes = _snapshot.manifest_of({})
io.files.write(empty_manifest, empty_sizes, False, lambda base, offsets: None, 29 * GiB)
assert io.files.read(True, False)["device_reserved_bytes"] == 29 * GiB
# A hint of 2^63 or more (only a corrupt header: it is outside the checksum) reads as the
# largest int64, a huge hint as the C++ runtime sees it, never a negative one.
io.files.write(empty_manifest, empty_sizes, False, lambda base, offsets: None, 2**64 - 1)
assert io.files.read(True, False)["device_reserved_bytes"] == 2**63 - 1
for hint, reserved, free, want, note in (
        (0, 0, 80 * GiB, 0, ""),
        (29 * GiB, 8 * GiB, 70 * GiB, 21 * GiB, ""),
        (29 * GiB, 8 * GiB, 5 * GiB, 4 * GiB, "5368709120 bytes free on the device")):
    got = io.files.plan_reserve(hint, reserved, free)
    assert got[0] == want and (note in got[1] if note else got[1] == ""), (hint, free, got)
os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "max_split_size_mb:512"
try:
    got = io.files.plan_reserve(29 * GiB, 8 * GiB, 70 * GiB)
    assert got[0] == 0 and "max_split_size_mb" in got[1], got
finally:
    del os.environ["PYTORCH_CUDA_ALLOC_CONF"]
io.write(state)  # the state of 1. again, for what follows


class _FakeCuda:
    """torch.cuda for a CUDA SnapshotIo on this CPU machine (an empty state: no tensor moves)."""
    def __init__(self, reserved):
        self.reserved, self.calls = reserved, []

    def memory_stats(self, device):  # the small pool is not the hint's
        return {"reserved_bytes.large_pool.current": self.reserved,
                "reserved_bytes.all.current": self.reserved + GiB}

    def mem_get_info(self, device):
        return 70 * GiB, 80 * GiB

    def current_stream(self, device):
        return "training-stream"

    def caching_allocator_alloc(self, n, device, stream):
        self.calls.append((n, stream))
        return 99

    def caching_allocator_delete(self, ptr):
        self.calls.append(("delete", ptr))

    def synchronize(self, device):
        pass


# A CUDA process's write records what its allocator holds; its resume's read reserves what is
# missing of it before the copies (one allocation on the current stream, freed at once).
cuda_io = _snapshot.SnapshotIo.__new__(_snapshot.SnapshotIo)
cuda_io.device, cuda_io.files, cuda_io.last = torch.device("cuda", 0), io.files, {}
cuda_io.reserve_ahead = True
real_cuda = _snapshot.torch.cuda
try:
    _snapshot.torch.cuda = _FakeCuda(reserved=29 * GiB)
    cuda_io.write({})
    _snapshot.torch.cuda = fake = _FakeCuda(reserved=2 * GiB)
    got, info = cuda_io.read(verify=True)
    assert got == {} and info["device_reserved_bytes"] == 29 * GiB, info
    assert fake.calls == [(27 * GiB, "training-stream"), ("delete", 99)], fake.calls
    assert info["reserved_ahead_bytes"] == 27 * GiB and info["reserve_note"] == "", info
finally:
    _snapshot.torch.cuda = real_cuda
io.write(state)
print("python_snapshot: the writer's device memory travels in the header OK")

# 2. Nothing read aliases the mapping: the next pause's write leaves the loaded state alone.
kept = {k: v.clone() for k, v in back["model"].items()}
other, _ = make_state(3)
st2 = io.write(other)
assert not st2["created"] and not st2["mapped"], st2  # the kept file, written in place
for k, v in back["model"].items():
    assert torch.equal(v, kept[k]), f"{k} changed with the next snapshot: it aliased the file"
print("python_snapshot: no alias of the mapping OK")

# 3. Corrupt, incomplete, truncated: refused, naming the file.
io.write(state)
data = bytearray(open(path, "rb").read())
fresh = lambda: io_at(path)  # noqa: E731 - a new process's view (no kept mapping)
bad = bytearray(data)
data_end = struct.unpack("<Q", bytes(data[40:48]))[0]
bad[data_end - 5] ^= 0x10  # a byte of the last tensor
open(path, "wb").write(bad)
expect_refused(fresh(), "payload checksum")
bad = bytearray(data)
bad[120:128] = b"\0" * 8  # the commit word: a writer that died before committing
open(path, "wb").write(bad)
expect_refused(fresh(), "incomplete")
open(path, "wb").write(data[:len(data) // 2])
expect_refused(fresh(), "truncated")
open(path, "wb").write(data)
same(state, fresh().read()[0])
print("python_snapshot: corrupt / incomplete / truncated refused OK")

# 4. Fallback: a primary path that cannot hold the file.
fb = os.path.join(tmp, "fallback.snapshot")
io = io_at(os.path.join(tmp, "no-such-dir", "state.snapshot"), fb)
st = io.write(state)
assert st["path"] == fb and len(st["failed_attempts"]) == 1, st
same(state, io.read()[0])
print("python_snapshot: fallback path OK")

# 5. A file-size limit below the snapshot: an error naming it, not SIGXFSZ.
child = subprocess.run([sys.executable, "-c", f"""
import os, resource, sys
sys.path.insert(0, {os.path.join(here, '..', '..', 'worker_runtime', 'python')!r})
import torch
from gpurun import _snapshot
os.environ["GPURUN_SNAPSHOT_PATH"] = {os.path.join(tmp, 'limited.snapshot')!r}
os.environ["GPURUN_SNAPSHOT_FALLBACK_PATH"] = ""
state = {{"w": torch.zeros(1 << 20)}}
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
try:
    _snapshot.SnapshotIo(torch.device("cpu")).write(state)
except Exception as e:
    print("refused:", e)
    sys.exit(7)
"""], capture_output=True, text=True, timeout=120)
assert child.returncode == 7, (child.returncode, -signal.SIGXFSZ, child.stdout, child.stderr)
assert "RLIMIT_FSIZE" in child.stdout and "ulimit -f" in child.stdout, child.stdout
print("python_snapshot: file-size limit refused, process alive OK")

# 6. A prepared file is what the write uses.
p6 = os.path.join(tmp, "prepared.snapshot")
io = io_at(p6)
prep = io.prepare(*io.plan_prepare(state))
assert prep["error"] == "" and prep["created"] and os.path.exists(p6), prep
st = io.write(state)
assert st["path"] == p6 and not st["created"] and not st["mapped"], st
print("python_snapshot: prepared file reused OK")

# 6b. A joiner's premap: the committed snapshot mapped ahead, unchanged; the read reuses it.
io = io_at(p6)
pm = io.files.premap(False)
assert pm["done"] and pm["mapped"] and pm["path"] == p6, pm
back, info = io.read(verify=True)
assert not info["mapped"], info  # mapped by the premap, not again by the read
same(state, back)
assert not io_at(os.path.join(tmp, "none.snapshot")).files.premap(False)["done"]
print("python_snapshot: premap OK")

# 6c. A standby's two calls: mapped while it waits (premap(False), no CUDA), page-locked after
# its go (premap(True)): the same mapping while the file is unchanged; a new one, and the new
# file's state, when another file was put at the path meanwhile.
io = io_at(p6)
assert io.files.premap(False)["done"]
first = io.files.data()
assert first and io.files.premap(True)["done"] and io.files.data() == first
stale = io_at(p6)
assert stale.files.premap(False)["done"]
old_mapping = stale.files.data()
shutil.copyfile(p6, p6 + ".new")
os.replace(p6 + ".new", p6)  # same bytes, another file (inode)
assert stale.files.premap(True)["done"]
assert stale.files.data() not in (0, old_mapping), "the replaced file's mapping was kept"
back, info = stale.read(verify=True)
assert not info["mapped"], info
same(state, back)
print("python_snapshot: a standby's early mapping reused, or remapped when replaced OK")



# 7. The handoff (handoff() above), rank 0 and rank 1 as two processes.
out = os.path.join(tmp, "handoff.pt")
env = dict(os.environ, GLOO_SOCKET_IFNAME="lo")
procs = [subprocess.Popen([sys.executable, __file__, sys.argv[1], "handoff", str(r),
                           os.path.join(tmp, "pg"), out], env=env) for r in (0, 1)]
codes = [p.wait(timeout=90) for p in procs]
assert codes == [0, 0], codes
a, b = torch.load(out + ".root"), torch.load(out)
same(a["model"], b["model"], "model after handoff")
same(a["optimizer"], b["optimizer"], "optimizer after handoff")
assert a["total"] == b["total"] > 0, (a["total"], b["total"])
print("python_snapshot: handoff to a fresh optimizer OK")
print("python_snapshot: OK")
shutil.rmtree(tmp, ignore_errors=True)
