#!/usr/bin/env python3
"""ctest python_units: the Python elastic sampler deals what the C++ one deals; track() calls add up.

The golden permutation is the C++ test's (tests/worker_runtime/elastic_sampler_test.cpp,
"the same indices on every platform"); a property check: any sequence of world sizes between
steps trains every sample exactly once per epoch."""
import copy
import os
import random
import sys

# These are CPU checks: pin the runtime's device as `gpurun --device cpu` does for its workers
# (on a machine with a GPU, Runtime() outside gpurun would otherwise pick cuda:0 and move the
# tracked models there, away from the CPU tensors the checks feed them).
os.environ["GPURUN_DEVICE"] = "cpu"
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "worker_runtime", "python"))
from gpurun._sampler import ElasticSampler  # noqa: E402

s = ElasticSampler(10, seed=7)
s.set_epoch(1)
assert s.window(10, 0, 1) == [3, 0, 5, 6, 1, 7, 2, 9, 4, 8], s.window(10, 0, 1)
assert ElasticSampler(10, shuffle=False).window(10, 1, 3) == [1, 4, 7]

rng = random.Random(1)
for trial in range(200):
    n = rng.randint(1, 300)
    s = ElasticSampler(n, seed=trial)
    for epoch in range(2):
        s.set_epoch(epoch)
        seen = []
        while s.remaining():
            world = rng.randint(1, 5)
            count = min(rng.randint(1, 4) * world, s.remaining())
            for r in range(world):
                seen += s.window(count, r, world)
            s.advance(count)
        assert sorted(seen) == list(range(n)), (trial, epoch)
# The state is (epoch, cursor): a joiner that loads it continues the same permutation.
a = ElasticSampler(50, seed=3)
a.set_epoch(4)
a.advance(20)
b = ElasticSampler(50, seed=3)
b.load_state_dict(a.state_dict())
assert b.window(30, 0, 1) == a.window(30, 0, 1)
print("python_units: sampler OK")

# Runtime.track() calls add up: a second call with other objects keeps the optimizer.
import torch  # noqa: E402
import gpurun  # noqa: E402

rt = gpurun.Runtime()
net = torch.nn.Linear(2, 1)
opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
net(torch.ones(1, 2)).sum().backward()
opt.step()
before = rt.track(model=net, optimizer=opt).checksum()


class Extra:
    def state_dict(self):
        return {"n": 1}

    def load_state_dict(self, s):
        pass


rt.track(extra=Extra())
assert "optimizer" in rt._state() and "other.extra" in rt._state(), sorted(rt._state())
assert rt.checksum() != before  # the extra object counts too
print("python_units: track() calls add up")

# The per-tensor word sums (checksum()) are the C++ runtime's S and P: checked against a
# direct computation in Python integers modulo 2^64, for dtypes with padding and wrapping.
import numpy as np  # noqa: E402
from gpurun._checksum import _word_sums  # noqa: E402


def direct(t):
    raw = t.contiguous().numpy().tobytes()
    raw += b"\0" * (-len(raw) % 4)
    w = np.frombuffer(raw, dtype="<i4").astype(object)
    s = sum(w) % 2**64
    p = sum((i + 1) * int(x) for i, x in enumerate(w)) % 2**64
    return [x - 2**64 if x >= 2**63 else x for x in (int(s), int(p))]


torch.manual_seed(0)
cases = [torch.randn(37), torch.randn(3, dtype=torch.float16), torch.tensor([True, False, True]),
         torch.full((50,), 2**31 - 1, dtype=torch.int32), torch.empty(0),
         torch.randint(-2**62, 2**62, (9,), dtype=torch.int64), torch.randn(4, 6).t()]
for t in cases:
    assert _word_sums(t).tolist() == direct(t), (t.dtype, _word_sums(t).tolist(), direct(t))
w = net.weight.detach() if hasattr(net, "weight") else next(net.parameters()).detach()
c0 = rt.checksum()
with torch.no_grad():
    flat = w.view(-1)
    a, b = flat[0].item(), flat[1].item()
    flat[0], flat[1] = b, a  # two elements swapped: P changes even where S does not
assert rt.checksum() != c0
print("python_units: checksum sums equal the direct ones; swapped elements change it")

# _word_sums_many (checksum()'s sums, taken in chunks as the C++ runtime's
# StateChecksum::tensor_sums() takes them) equals _word_sums per tensor: every dtype, odd sizes
# (padding), 0-d, empty, non-contiguous and misaligned views, sums that wrap, and chunks small
# enough that tensors are cut into pieces spanning several chunks.
from gpurun._checksum import (_CHUNK_WORDS, _CPU_CHUNK_WORDS, _state_digest,  # noqa: E402
                              _word_sums_many)

gen = torch.Generator().manual_seed(5)


def rand_of(dtype, shape):
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=gen).bool()
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=gen, dtype=torch.float64) * 1e4).to(dtype)
    info = torch.iinfo(dtype)
    return torch.randint(info.min, info.max, shape, dtype=dtype, generator=gen)


def check_many(tensors, chunk_words, refs=None):
    # Both ways of taking CPU tensors' sums: the plain loop (the default) and the chunked
    # prefix sums a GPU takes (a CPU joiner compares its checksum with a GPU source's).
    refs = refs if refs is not None else [_word_sums(t).tolist() for t in tensors]
    for cpu_loop in (True, False):
        got = _word_sums_many(tensors, chunk_words, cpu_loop=cpu_loop)  # None: the default
        assert len(got) == len(tensors), (len(got), len(tensors))
        for j, (t, g, r) in enumerate(zip(tensors, got, refs)):
            assert g == r, (chunk_words, cpu_loop, j, t.dtype, tuple(t.shape), t.stride(), g, r)
            assert all(type(x) is int and -2**63 <= x < 2**63 for x in g), g


dtypes = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
          torch.bool, torch.int32, torch.int64]
mixed = []
for dt in dtypes:
    mixed += [rand_of(dt, (n,)) for n in (1, 3, 5, 1001)]
    mixed += [rand_of(dt, ()), rand_of(dt, (0,)), rand_of(dt, (3, 0)),
              rand_of(dt, (5, 7)).t(), rand_of(dt, (4, 6))[:, 1::2], rand_of(dt, (3, 5))]
assert not all(t.is_contiguous() for t in mixed)
for cw in (1, 7, 64, None):
    check_many(mixed, cw)
    check_many(mixed[::-1], cw)
    for dt in dtypes:  # one dtype at a time: all its pieces share chunks
        check_many([t for t in mixed if t.dtype == dt], cw)
assert _word_sums_many([]) == [] and _word_sums_many([torch.empty(0)], 7) == [[0, 0]]
# Contiguous views starting inside a word (.view(torch.int32) refuses them; _word_sums too):
# the bytes of a copy.
base = rand_of(torch.uint8, (40,))
odd = [base[1:9], base[2:5], rand_of(torch.float16, (9,))[1:], rand_of(torch.int8, (6,))[3:],
       rand_of(torch.bool, (12,))[1:9]]
assert all(t.is_contiguous() and t.storage_offset() % 4 for t in odd)
for cw in (1, 3, None):
    check_many(odd + mixed[:20], cw, [_word_sums(t.clone()).tolist() for t in odd + mixed[:20]])
assert _word_sums_many(odd[:1])[0] == direct(odd[0]), (_word_sums_many(odd[:1]), direct(odd[0]))
# Sums past 2^63 wrap modulo 2^64 (in the int64 prefix sums and on the host): words of equal
# value c have S = c·n and P = c·n(n+1)/2 exactly.


def signed64(x):
    x %= 2**64
    return x - 2**64 if x >= 2**63 else x


n = 200_003
for c in (2**31 - 1, -2**31, 12345):
    t = torch.full((n,), c, dtype=torch.int32)
    exact = [signed64(c * n), signed64(c * n * (n + 1) // 2)]
    assert abs(c) < 2**20 or abs(c * n * (n + 1) // 2) >= 2**64  # the big ones wrap
    for cw in (4096, 65536, None):
        assert _word_sums_many([t], cw) == [exact], (c, cw, _word_sums_many([t], cw), exact)
large = [rand_of(torch.int64, (60_001,)), torch.full((100_001,), 2**31 - 1, dtype=torch.int32),
         rand_of(torch.int32, (70_000,)), rand_of(torch.float16, (33_333,)), mixed[10]]
for cw in (1000, 65536, None, _CHUNK_WORDS):
    check_many(large + mixed, cw)
# Past the CPU's default chunk: a tensor cut in two by it, another starting inside a chunk.
check_many(large[:1] + [rand_of(torch.int32, (_CPU_CHUNK_WORDS + 5,))] + large[1:], None)
try:
    _word_sums_many(mixed, 0)
except ValueError as e:
    assert "chunk_words must be > 0" in str(e), e
else:
    raise AssertionError("chunk_words=0 was accepted")
assert _CHUNK_WORDS == 32 << 20  # the C++ StateChecksum::kDefaultChunkWords
# CPU tensors take no prefix sums (they wrote 4-5 bytes of fresh memory per byte of state, on
# one thread: 5.6 s per GB of a resize's checksum on the CI machine); a requires-grad tensor
# is read as it is.
big = [rand_of(torch.int32, (3 * _CPU_CHUNK_WORDS + 7,)), rand_of(torch.float16, (5,)),
       torch.randn(9, requires_grad=True)]
want_big = [_word_sums(t.detach()).tolist() for t in big]
real_cumsum = torch.cumsum
torch.cumsum = None  # any call fails
try:
    got_big = _word_sums_many(big)
finally:
    torch.cumsum = real_cumsum
assert got_big == want_big, (got_big, want_big)
print("python_units: chunked word sums equal the per-tensor ones; the CPU's take no prefix sums")

# checksum() hashes exactly what it hashed with one _word_sums per tensor (old_checksum: its
# code before the chunked sums), for a state with AdamW moments, 0-d, odd-sized, bool, empty
# and half tensors; with any chunk size.
import hashlib  # noqa: E402


def old_checksum(state):
    h = hashlib.blake2b(digest_size=8)
    sums = []  # per tensor: an int64 [2] on its device

    def feed(obj):
        if isinstance(obj, torch.Tensor):
            t = obj.detach()
            h.update(f"{t.dtype}:{tuple(t.shape)};".encode())
            sums.append(_word_sums(t))
        elif isinstance(obj, dict):
            for k in sorted(obj, key=str):
                h.update(str(k).encode())
                feed(obj[k])
        elif isinstance(obj, (list, tuple)):
            for x in obj:
                feed(x)
        else:
            h.update(repr(obj).encode())

    with torch.no_grad():
        feed(state)
        by_device = {}
        for i, x in enumerate(sums):
            by_device.setdefault(x.device, []).append(i)
        values = [None] * len(sums)
        for idx in by_device.values():  # one transfer per device
            host = torch.stack([sums[i] for i in idx]).cpu().tolist()
            for i, v in zip(idx, host):
                values[i] = v
    for v in values:
        h.update(b"".join(int(x).to_bytes(8, "little", signed=True) for x in v))
    return int.from_bytes(h.digest(), "little", signed=True)


mod = torch.nn.Sequential(torch.nn.Linear(5, 3), torch.nn.LayerNorm(3), torch.nn.Linear(3, 7))
mod.register_buffer("mask", torch.tensor([True, False, True]))
mod.register_buffer("count", torch.tensor(3, dtype=torch.int8))
mod.register_buffer("halfs", torch.randn(7, generator=gen).half())
mod.register_buffer("none", torch.empty(0))
adam = torch.optim.AdamW(mod.parameters(), lr=1e-3)
for _ in range(2):
    mod(torch.randn(4, 5, generator=gen)).sum().backward()
    adam.step()
rt3 = gpurun.Runtime().track(model=mod, optimizer=adam)
state = rt3._state()
want = old_checksum(state)
assert rt3.checksum() == want, (rt3.checksum(), want)
assert _state_digest(state, lambda ts: [_word_sums(t).tolist() for t in ts]) == want
for cw in (1, 7, 64, None):
    got = _state_digest(state, lambda ts: _word_sums_many(ts, cw))
    assert got == want, (cw, got, want)
assert old_checksum(rt._state()) == rt.checksum()  # the first runtime's, swapped elements
print("python_units: checksum() hashes the state as before")

# rt.loader(): DataLoader arguments the elastic sampler owns are refused, naming them.
data = torch.utils.data.TensorDataset(torch.arange(10))
for bad, err, text in (({"sampler": None, "batch_sampler": None}, TypeError, "batch_sampler, sampler"),
                       ({"persistent_workers": True}, TypeError, "persistent_workers"),
                       ({"num_workers": -1}, ValueError, "num_workers must be an int >= 0"),
                       ({"batch_size": 0}, ValueError, "batch_size must be an int >= 1")):
    try:
        gpurun.Runtime().loader(data, **{"batch_size": 2, **bad})
    except err as e:
        assert text in str(e), str(e)
    else:
        raise AssertionError(f"loader(**{bad}) was accepted")
# Outside gpurun (one process), workers read the same batches as the process itself would.
same = [b[0].tolist() for b in gpurun.Runtime().loader(data, batch_size=3, seed=1)]
with_workers = [b[0].tolist() for b in gpurun.Runtime().loader(data, batch_size=3, seed=1,
                                                              num_workers=2)]
# A second loader of one Runtime would move the first's position: refused, saying why.
one = gpurun.Runtime()
one.loader(data, batch_size=2)
try:
    one.loader(data, batch_size=2)
except RuntimeError as e:
    assert "called a second time" in str(e) and "plain torch.utils.data.DataLoader" in str(e), e
else:
    raise AssertionError("a second loader() was accepted")
assert not gpurun.runtime.is_comm_failure(RuntimeError("DataLoader timed out after 1 seconds"))
assert gpurun.runtime.is_comm_failure(RuntimeError("Connection closed by peer"))
assert gpurun.runtime.is_comm_failure(RuntimeError("failed to recv, got 0 bytes"))  # torch 2.x, a closed store connection
assert same == with_workers and sorted(sum(same, [])) == list(range(10)), (same, with_workers)
print("python_units: loader arguments checked; workers read the same batches")

# Cheap joiners: a rank whose state the start's broadcast overwrites (RANK 1 of 2) builds its
# model without a random initialisation under skip_init() (torch >= 2.0: on the meta device),
# and track() gives it empty storage on the runtime's device; rank 0 initialises as usual.
os.environ.update({"WORLD_SIZE": "2", "RANK": "1"})
joiner = gpurun.Runtime()
assert joiner.joining
with joiner.skip_init():
    lin = torch.nn.Linear(3, 2)
meta_capable = hasattr(torch.device("cpu"), "__enter__")
assert lin.weight.is_meta == meta_capable, (lin.weight.device, torch.__version__)
joiner.track(model=lin)
assert not lin.weight.is_meta and lin.weight.device == joiner.device and lin.weight.shape == (2, 3)
os.environ.update({"RANK": "0"})
source = gpurun.Runtime()
assert not source.joining
with source.skip_init():
    lin0 = torch.nn.Linear(3, 2)
assert not lin0.weight.is_meta and float(lin0.weight.abs().sum()) > 0
del os.environ["WORLD_SIZE"], os.environ["RANK"]
print(f"python_units: skip_init on a joiner ({'meta device' if meta_capable else 'torch < 2.0: a no-op'})")

# A failed group's connections (issue 25): GroupLinks counts only the TCP connections opened
# between before() and after(), sever() makes their peers read end-of-file, and a descriptor
# reused since (another socket now) is left alone.
import socket  # noqa: E402
from gpurun._comm import GroupLinks  # noqa: E402

listener = socket.create_server(("127.0.0.1", 0))
old = socket.create_connection(listener.getsockname())  # before the group: not its own
old_peer, _ = listener.accept()
links = GroupLinks()
links.before()
mine = socket.create_connection(listener.getsockname())
mine_peer, _ = listener.accept()  # both ends are this process's: two connections
links.after()
assert len(links) == 2, len(links)
assert links.sever() == 2
mine_peer.settimeout(5)
assert mine_peer.recv(1) == b"", "the severed connection's peer did not read end-of-file"
old.sendall(b"x")
assert old_peer.recv(1) == b"x", "a connection older than the group was severed"
links.before()
third = socket.create_connection(listener.getsockname())
third_peer, _ = listener.accept()
links.after()
fd = third.fileno()
third.close()
third_peer.close()
reuse = socket.create_connection(listener.getsockname())  # likely the same descriptor number
reuse_peer, _ = listener.accept()
links.sever()
reuse.sendall(b"y")
reuse_peer.settimeout(5)
assert reuse_peer.recv(1) == b"y", f"a reused descriptor ({fd} -> {reuse.fileno()}) was severed"
print("python_units: a failed group's own connections are severed, nothing else")

# NCCL's teardown (issue 24): NcclWake makes a proxy UDS service thread that polls with a long
# timeout see its stop flag at once. The fake is NCCL's loop (src/proxy.cc
# ncclProxyServiceUDS): poll, check stop, else receive one request with one descriptor.
import array  # noqa: E402
import select  # noqa: E402
import threading  # noqa: E402
from gpurun._comm import NcclWake, nccl_uds_addresses  # noqa: E402


class FakeNcclUds:
    def __init__(self, name):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(name.ljust(108, b"\0"))  # NCCL binds sizeof(sun_path)
        self.stop = False
        self.requests = []  # (type, descriptor or None) read before the stop
        self.exit_reason = None
        self.first_request = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        p = select.poll()
        p.register(self.sock, select.POLLIN)
        while True:
            ready = p.poll(20_000)
            if self.stop:
                self.exit_reason = "woken" if ready else "poll timeout"
                break
            if ready:
                msg, anc, _, _ = self.sock.recvmsg(152, socket.CMSG_SPACE(4))
                fds = [array.array("i", d)[0] for lvl, kind, d in anc
                       if lvl == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS]
                self.requests.append((int.from_bytes(msg[:4], "little"), fds[0] if fds else None))
                self.first_request.set()  # NCCL skips an unknown type; the descriptor stays
        self.sock.close()


def memfd_copies():
    n = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            n += os.readlink(f"/proc/self/fd/{name}").startswith("/memfd:gpurun-nccl-wake")
        except OSError:
            pass
    return n


fake = FakeNcclUds(b"\0tmp/nccl-socket-0-5eed")
other = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
other.bind(b"\0not-nccl-" + str(os.getpid()).encode())  # someone else's socket: left alone
other.setblocking(False)
assert fake.sock.getsockname() in nccl_uds_addresses(), nccl_uds_addresses()
assert len(nccl_uds_addresses()) == 1, nccl_uds_addresses()
with NcclWake() as wake:
    assert fake.first_request.wait(20), "no datagram reached the UDS thread"
    fake.stop = True  # what ncclProxyStop does; then the destroy joins the thread
    fake.thread.join(30)
assert fake.exit_reason == "woken", fake.exit_reason
assert all(t == 0 and fd is not None for t, fd in fake.requests), fake.requests
assert wake.sent >= 1 and wake.closed == len(fake.requests) >= 1, (wake.sent, wake.closed)
assert memfd_copies() == 0, "a received wake descriptor was left open"
try:
    other.recv(1)
    raise AssertionError("a socket that is not NCCL's got a datagram")
except BlockingIOError:
    pass
os.environ["GPURUN_NCCL_WAKE"] = "0"
assert NcclWake()._addrs == []
del os.environ["GPURUN_NCCL_WAKE"]
print(f"python_units: NCCL's UDS thread woken at its stop ({wake.sent} datagrams, "
      f"{wake.closed} descriptors closed)")

# The CUDA warm-up beside the start (_WarmUp): a failure in its thread is a warning printed at
# finish(), never an exception of the training thread (here: a CPU device, which
# torch.cuda.set_device refuses).
import contextlib  # noqa: E402
import io  # noqa: E402
from gpurun._warmup import _WarmUp  # noqa: E402

warm = _WarmUp(torch.device("cpu"), 3)
err = io.StringIO()
with contextlib.redirect_stderr(err):
    assert warm.finish() is None
assert "slot 3): warning: setting up the CUDA libraries ahead of the first step failed" in \
    err.getvalue(), err.getvalue()
print("python_units: a failed CUDA warm-up is a warning")

# The /proc/self/fd scans (GroupLinks, NcclWake) leave every socket's blocking mode as it
# was, also under socket.setdefaulttimeout() (where CPython makes a new socket object
# non-blocking, and a duplicate shares the flag with the original).
plain = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
assert os.get_blocking(plain.fileno())
socket.setdefaulttimeout(5)
try:
    nccl_uds_addresses()
    from gpurun._comm import tcp_connections  # noqa: E402
    tcp_connections()
finally:
    socket.setdefaulttimeout(None)
assert os.get_blocking(plain.fileno()), "a socket scan made a socket of the program non-blocking"
plain.close()
print("python_units: the socket scans leave blocking modes alone")

# The snapshot threads page-lock in cuda:<slot>'s context: the premap and the prepare thread set
# their device before the library's cudaHostRegister (a new thread's current device is 0: a
# worker of slot 1 would make a context on GPU 0). A standby's map-only premap, before its go,
# sets none (no CUDA at all), and the premap after the go joins it on its own thread.
from gpurun.runtime import Runtime  # noqa: E402

calls = []


class _FakeFiles:
    def premap(self, on_device):
        calls.append(("premap", on_device, threading.get_ident()))
        return {"done": True}


class _FakeSnap:
    files = _FakeFiles()

    def plan_prepare(self, state):
        return 0, [8], True

    def prepare(self, *args):
        calls.append(("prepare", args[-1], threading.get_ident()))
        return {"error": ""}


fake = object.__new__(Runtime)  # only what the two threads read
fake._prepare, fake._device, fake._snap, fake.slot = None, torch.device("cuda", 1), _FakeSnap(), 1
fake.elastic, fake._prepare_wanted, fake._state = True, True, lambda: {}
real_set_device = torch.cuda.set_device
torch.cuda.set_device = lambda d: calls.append(("set_device", d, threading.get_ident()))
try:
    fake._start_premap(ahead=True)  # a standby's, while it waits
    fake._start_premap()  # after its go
    fake._join_prepare()
    premap_calls = list(calls)
    calls.clear()
    fake._start_prepare()  # a training process's background preparation
    fake._join_prepare()
finally:
    torch.cuda.set_device = real_set_device
main = threading.get_ident()
assert [c[:2] for c in premap_calls] == [("premap", False), ("set_device", torch.device("cuda", 1)),
                                          ("premap", True)], premap_calls
assert premap_calls[1][2] == premap_calls[2][2] != main, premap_calls
assert [c[:2] for c in calls] == [("set_device", torch.device("cuda", 1)), ("prepare", True)], calls
assert calls[0][2] == calls[1][2] != main, calls
print("python_units: the snapshot threads page-lock on the slot's device")

# Only a standby's map before its go says "standby: snapshot mapped ahead" (the benches wait for
# that line): not a warm joiner's map after its start, nor a standby's after its go, which on CPU
# are map-only (on_device False) too.
import contextlib  # noqa: E402
import io  # noqa: E402

cpu = object.__new__(Runtime)
cpu._prepare, cpu._device, cpu._snap, cpu.slot = None, torch.device("cpu"), _FakeSnap(), 4
said = io.StringIO()
with contextlib.redirect_stderr(said):
    cpu._start_premap()  # a warm joiner's, after its start (no standby)
    cpu._join_prepare()
assert "mapped ahead" not in said.getvalue(), said.getvalue()
with contextlib.redirect_stderr(said):
    cpu._standby_ahead()  # a standby's, while it waits
    cpu._start_premap()  # after its go: joins that map
    cpu._join_prepare()
assert said.getvalue().count("slot 4): standby: snapshot mapped ahead of the go") == 1, said.getvalue()
print("python_units: only a standby's map before its go is said to be ahead")

# The state check after a boundary with one rank: nothing to compare, so no collective (with
# NCCL the first one would set the group's communicator up before the first step) and no
# checksum; with two ranks it all-gathers (Runtime._verify, in gpurun._group).
import gpurun._group as grt  # noqa: E402


class _Dist:
    def __init__(self, world):
        self.world, self.gathers = world, 0

    def get_world_size(self):
        return self.world

    def all_gather(self, out, t):
        self.gathers += 1
        for o in out:
            o.copy_(t)


real_dist = grt.dist
try:
    for world, gathers in ((1, 0), (2, 1)):
        grt.dist = _Dist(world)
        rt._verify(0, "after the boundary")
        assert grt.dist.gathers == gathers, (world, grt.dist.gathers)
finally:
    grt.dist = real_dist
print("python_units: one rank's state check makes no collective")

# A resume's reservation ahead of its first step (SnapshotIo._reserve), on a fake CUDA: the
# library's amount allocated on the current stream and freed at once; any failure only noted.
import torch  # noqa: E402
from gpurun import _snapshot  # noqa: E402


class _Files:
    def plan_reserve(self, hint, reserved, free):
        self.asked = (hint, reserved, free)
        return hint - reserved, ""


class _FakeCuda:
    def __init__(self, fail=False):
        self.fail, self.calls = fail, []

    def mem_get_info(self, device):
        if self.fail:
            raise RuntimeError("CUDA error: out of memory")
        return 70 << 30, 80 << 30

    def memory_stats(self, device):  # the small pool is not the hint's
        return {"reserved_bytes.large_pool.current": 8 << 30, "reserved_bytes.all.current": 9 << 30}

    def current_stream(self, device):
        return "training-stream"

    def caching_allocator_alloc(self, n, device, stream):
        self.calls.append(("alloc", n, stream))
        return 1234

    def caching_allocator_delete(self, ptr):
        self.calls.append(("delete", ptr))


io = _snapshot.SnapshotIo.__new__(_snapshot.SnapshotIo)
io.device, io.files, io.reserve_ahead = torch.device("cuda", 0), _Files(), True
real_cuda = _snapshot.torch.cuda
try:
    for fail in (False, True):
        _snapshot.torch.cuda = fake = _FakeCuda(fail)
        info = {"device_reserved_bytes": 29 << 30}
        io._reserve(info)
        if not fail:
            assert io.files.asked == (29 << 30, 8 << 30, 70 << 30), io.files.asked
            assert fake.calls == [("alloc", 21 << 30, "training-stream"), ("delete", 1234)]
            assert info["reserved_ahead_bytes"] == 21 << 30 and info["reserve_note"] == ""
        else:
            assert fake.calls == [] and info["reserved_ahead_bytes"] == 0, (fake.calls, info)
            assert "out of memory" in info["reserve_note"], info
    io.reserve_ahead = False  # GPURUN_RESERVE_AHEAD=0
    _snapshot.torch.cuda = fake = _FakeCuda()
    io._reserve(info)
    assert fake.calls == [] and info["reserved_ahead_bytes"] == 0
finally:
    _snapshot.torch.cuda = real_cuda
for value, on in (("0", False), ("1", True), ("", True)):  # empty counts as unset: on
    os.environ["GPURUN_RESERVE_AHEAD"] = value
    io2 = _snapshot.SnapshotIo.__new__(_snapshot.SnapshotIo)
    try:
        io2.__init__(torch.device("cpu"))
    except RuntimeError:  # no GPURUN_WORKER_LIBRARY here; the setting is read before it
        pass
    finally:
        del os.environ["GPURUN_RESERVE_AHEAD"]
    assert io2.reserve_ahead is on, (value, io2.reserve_ahead)
os.environ["GPURUN_RESERVE_AHEAD"] = "yes"
try:
    _snapshot.SnapshotIo(torch.device("cpu"))
    raise AssertionError("GPURUN_RESERVE_AHEAD=yes was taken")
except ValueError as e:
    assert "GPURUN_RESERVE_AHEAD='yes' must be 0 or 1" in str(e), e
finally:
    del os.environ["GPURUN_RESERVE_AHEAD"]
print("python_units: a resume reserves the writer's device memory on the training stream")

# ---- issue 43's Python API, without gpurun ------------------------------------------------
import contextlib  # noqa: E402
import io  # noqa: E402
import tempfile  # noqa: E402

import torch.distributed as dist  # noqa: E402
from gpurun._iterations import Micro, split  # noqa: E402

# micro_steps(): 40 micro-steps over 3 ranks: contiguous shares 14, 13, 13 covering 0..39 once,
# weight world/grad_accum, DDP's sync only in the last micro-step's backward (restored after).
assert [split(40, 3, r) for r in range(3)] == [(0, 14), (14, 13), (27, 13)]
assert split(8, 8, 7) == (7, 1) and split(5, 1, 0) == (0, 5)
# More ranks than micro-steps (a grow past grad_accum): the ranks beyond get none from split()
# and one micro-step of weight 0 from micro_steps() (the job goes on; before, it died).
assert [split(2, 3, r) for r in range(3)] == [(0, 1), (1, 1), (2, 0)]


class _SyncFlag:  # stands in for the generation's DDP wrapper
    require_backward_grad_sync = True


rt = gpurun.Runtime()
rt.grad_accum, rt._micro_seed, rt._steps_done = 40, 5, 17
indices = []
for r in range(3):
    rt.rank, rt.world_size, rt._ddp = r, 3, _SyncFlag()
    assert rt.accum_steps == (14, 13, 13)[r]
    got = []
    for m in rt.micro_steps():
        got.append((m.index, m.local, m.last, m.weight, rt._ddp.require_backward_grad_sync))
    n = len(got)
    assert n == rt.accum_steps, (r, n)
    assert [g[1] for g in got] == list(range(n)) and [g[2] for g in got] == [False] * (n - 1) + [True]
    assert [g[4] for g in got] == [False] * (n - 1) + [True], got  # sync on the last only
    assert all(g[3] == 3 / 40 for g in got), got
    assert rt._ddp.require_backward_grad_sync is True  # restored after the loop
    indices += [g[0] for g in got]
assert indices == list(range(40)), indices
rt.rank, rt.world_size, rt._ddp, rt.grad_accum = 0, 1, None, None
assert rt.accum_steps == 1 and [m.weight for m in rt.micro_steps()] == [1.0]
print("python_units: micro_steps() deals 40 over 3 ranks as 14, 13, 13; weights 3/40; last syncs")

# Micro.generator: a function of (seed, iteration, index) only, not of the rank's place.
draw = lambda m: torch.randint(1 << 30, (8,), generator=m.generator).tolist()  # noqa: E731
a = draw(Micro(3, 0, False, 0.25, seed=5, it=17))
assert a == draw(Micro(3, 2, True, 1.0, seed=5, it=17))  # other local index, last, weight
for other in (Micro(4, 0, False, 0.25, 5, 17), Micro(3, 0, False, 0.25, 6, 17),
              Micro(3, 0, False, 0.25, 5, 18)):
    assert draw(other) != a, other
rt.grad_accum, rt._micro_seed, rt._steps_done = 40, 5, 17
by_index = {}
for world in (1, 3, 8):  # micro-step 3's batch is the same at every world size
    for r in range(world):
        rt.rank, rt.world_size = r, world
        for m in rt.micro_steps():
            by_index.setdefault(m.index, set()).add(tuple(draw(m)))
assert all(len(v) == 1 for v in by_index.values()) and by_index[3] == {tuple(a)}
assert len({next(iter(v)) for v in by_index.values()}) == 40  # the 40 streams differ
rt.rank, rt.world_size, rt.grad_accum, rt._steps_done = 0, 1, None, 0
print("python_units: Micro.generator depends on (seed, it, index) only")

# ElasticModel (rt.model): calls and attributes go to the generation's DDP wrapper when there is
# one, else to the module; .module is always the plain module; one object across generations.
assert dist.is_available() and not dist.is_initialized()
rt = gpurun.Runtime()
assert rt.model is None
net = torch.nn.Linear(3, 2)
rt.track(model=net)
m = rt.model
assert isinstance(m, gpurun.ElasticModel) and m is rt.model and m.module is net
x = torch.ones(4, 3)
assert torch.equal(m(x), net(x)) and m.weight is net.weight
m.eval()
assert not net.training
m.train()
assert net.training
m.custom_flag = 7  # set through the view: lands on the module
assert net.custom_flag == 7
with m.no_sync():  # no wrapper: a no-op context
    pass
store_dir = tempfile.mkdtemp()
dist.init_process_group("gloo", init_method=f"file://{store_dir}/store", rank=0, world_size=1)
try:
    ddp = torch.nn.parallel.DistributedDataParallel(net)
    rt._ddp = ddp  # a new generation's wrapper
    assert m._current() is ddp and m.module is net
    assert torch.equal(m(x), ddp(x))
    m.require_backward_grad_sync = False  # DDP's own attribute, set through the view
    assert ddp.require_backward_grad_sync is False and "require_backward_grad_sync" not in vars(net)
    ddp.require_backward_grad_sync = True
    with m.no_sync():
        assert ddp.require_backward_grad_sync is False  # DDP's no_sync() ran
    assert "DistributedDataParallel" in repr(m)
    print("python_units: rt.model forwards calls and attributes; .module is the plain module")

    # init_process_group() before Runtime() under gpurun --config: an error that says what to do.
    os.environ["GPURUN_ELASTIC"] = "1"
    try:
        gpurun.Runtime()
        raise AssertionError("Runtime() accepted an initialized torch.distributed")
    except RuntimeError as e:
        assert "already initialized" in str(e) and "remove the program's init_process_group()" in str(e), e
    finally:
        del os.environ["GPURUN_ELASTIC"]
    gpurun.Runtime()  # without GPURUN_ELASTIC: a static run may make its own group
    print("python_units: init_process_group() before Runtime() under --config says what to do")
finally:
    rt._ddp = None
    dist.destroy_process_group()

# A tracked dict: its contents are the state (state_dict / load_state_dict), replaced in place;
# small, so it travels whole through the store at a resize.
rt = gpurun.Runtime()
stats = {"best_val_loss": 1e9, "history": [3.0, 2.5]}
rt.track(stats=stats)
saved = rt._state()
assert saved["other.stats"] == {"best_val_loss": 1e9, "history": [3.0, 2.5]}
from gpurun._tracked import _is_small  # noqa: E402
assert _is_small(saved["other.stats"]) and not _is_small({"w": torch.zeros(20000)})
stats["best_val_loss"] = 1.5
stats["seen"] = 1
rt._load(saved)
assert stats == {"best_val_loss": 1e9, "history": [3.0, 2.5]}, stats  # the same dict object
import pickle  # noqa: E402
rt._others["stats"].load_state_dict(pickle.loads(pickle.dumps({"best_val_loss": 0.25})))
assert stats == {"best_val_loss": 0.25}
try:
    rt.track(bad=3)
    raise AssertionError("track() took an int")
except TypeError as e:
    assert "bad=int" in str(e), e
print("python_units: a tracked dict round-trips through state_dict / load_state_dict in place")

# len() of the elastic loader: the steps left in the epoch at the current world size, what the
# loop then yields (tqdm's % and ETA).
rt = gpurun.Runtime()
data = torch.utils.data.TensorDataset(torch.arange(100.0))
loader = rt.loader(data, batch_size=8)
for epoch in rt.epochs(1):
    assert len(loader) == 13  # 12 steps of 8, then 4
    steps = 0
    for (xb,) in loader:
        steps += 1
        if steps == 5:  # inside the 5th step: it and 8 more are left
            assert len(loader) == 9, len(loader)
    assert steps == 13 and len(loader) == 0
rt._sampler.set_epoch(1)
rt.world_size = 3  # 24 samples a step over 3 ranks
assert len(loader) == 5  # 4 x 24 = 96, then 4 (>= 3 ranks: a step)
rt._sampler.advance(2)   # 98 left: 4 steps of 24, a tail of 2 < 3 ranks is skipped
assert len(loader) == 4
rt.world_size = 1
print("python_units: len() of the loader is the epoch's steps left")

# epochs(None): until the job stops (a static run: forever).
rt = gpurun.Runtime()
seen = []
for epoch in rt.epochs(None):
    seen.append(epoch)
    if epoch == 6:
        break
assert seen == list(range(7)) and rt.max_epochs == sys.maxsize and rt.stop_reason is None
for bad in (-1, 2.0, True):
    try:
        next(gpurun.Runtime().epochs(bad))
        raise AssertionError(f"epochs({bad!r}) was taken")
    except ValueError:
        pass
print("python_units: epochs(None) runs until stopped")

# elastic_scheduler without gpurun --config: static, one line saying so (rank 0, once); the
# function gets the model view, an elastic loader (the DataLoader's batch size, half the cores
# as workers), the device and the epoch, and its value is returned.
for k in ("GPURUN_SLOT", "TORCHELASTIC_RUN_ID", "GPURUN_CONFIG", "RANK", "WORLD_SIZE"):
    os.environ.pop(k, None)
got = []


@gpurun.elastic_scheduler(config_path="config.toml")
def train_one_epoch(model, dataset, optimizer, criterion, epoch, device, extra=None):
    got.append((model, dataset, epoch, device, extra))
    return epoch * 10


net = torch.nn.Linear(1, 1)
opt = torch.optim.SGD(net.parameters(), lr=0.1)
dl = torch.utils.data.DataLoader(data, batch_size=20, shuffle=True)
err = io.StringIO()
with contextlib.redirect_stderr(err):
    results = [train_one_epoch(net, dl, opt, torch.nn.MSELoss(), e, "cuda:7", extra="x")
               for e in range(3)]
notice = err.getvalue().splitlines()
assert len(notice) == 1, notice
assert notice[0].startswith("gpurun: train_one_epoch() runs static, not elastic (no launcher "
                            "started it): config.toml is not watched; run `gpurun --nproc N "
                            f"--config config.toml {sys.executable} "), notice
assert results == [0, 10, 20], results
rt = train_one_epoch.runtime
assert isinstance(rt, gpurun.Runtime) and not rt.elastic
for model, loader, epoch, device, extra in got:
    assert model is rt.model and model.module is net and device == rt.device and extra == "x"
    assert len(loader) == 5 and loader.batch_size == 20  # the DataLoader's batch size
    assert loader.kwargs["num_workers"] == max(1, (os.cpu_count() or 2) // 2), loader.kwargs
assert [g[2] for g in got] == [0, 1, 2]
print("python_units: elastic_scheduler runs static with one line; arguments replaced")
os.environ["RANK"] = "1"  # another rank (a static multi-process run) prints nothing
try:
    @gpurun.elastic_scheduler(config_path="config.toml")
    def train_rank1(model, dataset, optimizer, epoch, device):
        return "ok"

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert train_rank1(net, dl, opt, 0, None) == "ok"
    assert err.getvalue() == "", err.getvalue()
finally:
    del os.environ["RANK"]
print("python_units: ... and only rank 0 says so")

# rt.model after a resize to a DDP wrapper: state_dict() keys are the module's (no "module."
# prefix, so a checkpoint loads at any world size); the program's own methods, which DDP does not
# forward, are the module's.
class WithMethod(torch.nn.Linear):
    def describe(self):
        return f"linear {self.in_features}->{self.out_features}"


rt = gpurun.Runtime()
net = WithMethod(3, 2)
rt.track(model=net)
store_dir = tempfile.mkdtemp()
dist.init_process_group("gloo", init_method=f"file://{store_dir}/store", rank=0, world_size=1)
try:
    rt._ddp = torch.nn.parallel.DistributedDataParallel(net)
    assert list(rt.model.state_dict()) == ["weight", "bias"], list(rt.model.state_dict())
    rt.model.load_state_dict({"weight": torch.zeros(2, 3), "bias": torch.ones(2)})
    assert float(net.bias.sum()) == 2.0
    assert rt.model.describe() == "linear 3->2"  # DDP has no describe(): the module's
    try:
        rt.model.no_such_attribute
        raise AssertionError("a missing attribute did not raise")
    except AttributeError:
        pass
finally:
    rt._ddp = None
    dist.destroy_process_group()
print("python_units: rt.model's state_dict() has the module's keys; the module's own methods")

# iterations(start=N): a job that starts afresh begins at N (a run resumed from the program's
# own checkpoint), and the counter ends at max_iters.
rt = gpurun.Runtime()
rt.track(model=torch.nn.Linear(2, 1))
assert list(rt.iterations(8, every=3, start=5)) == [5, 6, 7]
try:
    list(gpurun.Runtime().iterations(8, start=-1))
    raise AssertionError("start=-1 accepted")
except ValueError as e:
    assert "start" in str(e)
print("python_units: iterations(start=5) yields 5, 6, 7")

# track_globals(): module variables by name are part of the state; loading assigns them anew.
best_val_loss = 1e9
rt = gpurun.Runtime()
rt.track_globals("best_val_loss")
best_val_loss = 2.5
saved = rt._state()
assert saved["other.globals.__main__"] == {"best_val_loss": 2.5}, saved
saved["other.globals.__main__"]["best_val_loss"] = 0.75  # rank 0's, as a resize brings it
rt._load(saved)
assert best_val_loss == 0.75, best_val_loss
try:
    rt.track_globals("not_defined_here")
    raise AssertionError("an undefined name was accepted")
except NameError as e:
    assert "not_defined_here" in str(e)
print("python_units: track_globals() carries module variables by name")

# Rank before the first generation: a static run's is the environment's (a program's
# `if rt.rank == 0:` before its loop picks one process).
os.environ.update(RANK="1", WORLD_SIZE="2")
try:
    rt = gpurun.Runtime()
    assert (rt.rank, rt.world_size) == (1, 2), (rt.rank, rt.world_size)
finally:
    del os.environ["RANK"], os.environ["WORLD_SIZE"]
print("python_units: rank and world before the loop are the environment's")

# Runtime.stop(): the loop ends at the next boundary (the epoch's end; the next multiple of
# `every`), not at once; stop_reason says the program asked.
rt = gpurun.Runtime()
seen = []
for epoch in rt.epochs(None):
    seen.append(epoch)
    if epoch == 2:
        rt.stop()
assert seen == [0, 1, 2] and rt.stop_reason == "stopped", (seen, rt.stop_reason)
rt = gpurun.Runtime()
assert list(rt.epochs(2)) == [0, 1] and rt.stop_reason == "completed", rt.stop_reason
rt = gpurun.Runtime()
its = []
for it in rt.iterations(100, every=5):
    its.append(it)
    if it == 7:
        rt.stop()
assert its == list(range(10)), its
print("python_units: stop() ends the loop at the next boundary")

# gpurun.elastic without gpurun --config: one line saying it runs static, under gpurun alone too.
os.environ["GPURUN_SLOT"] = "0"
try:
    err = io.StringIO()
    net = torch.nn.Linear(1, 1)

    @gpurun.elastic(model=net, optimizer=torch.optim.SGD(net.parameters(), lr=0.1))
    def one_epoch(loader, epoch):
        pass

    with contextlib.redirect_stderr(err):
        one_epoch(epochs=2)
    notice = err.getvalue().splitlines()
    assert notice == ["gpurun: one_epoch() runs static, not elastic (gpurun was started without "
                      f"--config): run `gpurun --nproc N --config config.toml {sys.executable} "
                      f"{sys.argv[0]}` to resize it while it trains"], notice
finally:
    del os.environ["GPURUN_SLOT"]
print("python_units: gpurun.elastic says in one line that it runs static")

# A rank beyond grad_accum: one micro-step of weight 0 (and a note), accum_steps 1.
rt = gpurun.Runtime()
rt.track(model=torch.nn.Linear(2, 1))
rt.grad_accum, rt.rank, rt.world_size = 2, 2, 3
err = io.StringIO()
with contextlib.redirect_stderr(err):
    ms = list(rt.micro_steps())
assert [(m.index, m.weight, m.last) for m in ms] == [(-3, 0.0, True)], ms
assert rt.accum_steps == 1 and "grad_accum = 2 is below the world size 3" in err.getvalue()
rt.rank = 1
assert [(m.index, m.weight) for m in rt.micro_steps()] == [(1, 1.5)]
print("python_units: a rank beyond grad_accum takes part with weight 0")

# Issue 44: the text gpurun is told for the program's own error (gpurun/_exit.py).
from gpurun._exit import program_error_text  # noqa: E402

assert program_error_text(KeyboardInterrupt, KeyboardInterrupt()) == "KeyboardInterrupt"
assert program_error_text(ValueError, ValueError("bad batch")) == "ValueError: bad batch"
long_error = "Caught ValueError in DataLoader worker process 0.\nOriginal Traceback:\n" + "".join(
    f'  File "/usr/lib/python3/dist-packages/torch/utils/data/f{i}.py", line 1\n'
    for i in range(200)) + "ValueError: sample 17 has no label"
said = program_error_text(ValueError, ValueError(long_error))
assert len(said) < 4100 and said.startswith("ValueError: Caught ValueError in DataLoader"), said
assert said.endswith("\nValueError: sample 17 has no label") and "characters elided ...]" in said
print("python_units: a program error's text: no 'KeyboardInterrupt: ', its end kept")

# A wrong GPURUN_WORKER_LIBRARY: which path, what is wrong, what to do (gpurun/_native.py).
import ctypes.util  # noqa: E402
import tempfile  # noqa: E402
from gpurun import _native  # noqa: E402

_native._lib = None
with tempfile.TemporaryDirectory() as d:
    text_file = os.path.join(d, "libgpurun_worker.so")
    with open(text_file, "w") as f:
        f.write("not a library\n")
    libc = ctypes.util.find_library("c") or "libc.so.6"
    libc_path = next((os.path.join(p, libc) for p in ("/lib/x86_64-linux-gnu", "/usr/lib64",
                                                      "/lib64", "/usr/lib/x86_64-linux-gnu")
                      if os.path.exists(os.path.join(p, libc))), libc)
    for path, why in ((os.path.join(d, "missing.so"), "does not exist"), (d, "is a directory"),
                      (text_file, "cannot be loaded ("),
                      (libc_path, "is a shared library but not gpurun's worker library (it has "
                                  "no gpurun_worker_abi function)")):
        try:
            _native.load(path)
        except RuntimeError as e:
            msg = str(e)
            assert msg.startswith(f"GPURUN_WORKER_LIBRARY='{path}' {why}"), msg
            assert "next to the gpurun binary" in msg and "unset it" in msg, msg
        else:
            raise AssertionError(f"{path} loaded")
    assert _native._lib is None
print("python_units: a wrong GPURUN_WORKER_LIBRARY names the path and what to do")

# Issue 46: another node's slot (job slot 1001: node 1's local slot 1) trains on cuda:1 while its
# keys and messages say 1001 (gpurun.runtime._slots_and_device; a standby's choice makes no CUDA
# call, so it runs on a CPU-only machine too). Without GPURUN_LOCAL_SLOT the slot is the device.
from gpurun.runtime import _slots_and_device  # noqa: E402

_saved = {k: os.environ.get(k) for k in ("GPURUN_SLOT", "GPURUN_LOCAL_SLOT", "GPURUN_DEVICE")}
try:
    os.environ.update(GPURUN_SLOT="1001", GPURUN_LOCAL_SLOT="1", GPURUN_DEVICE="cuda")
    got = _slots_and_device(standby=True)
    assert got == (1001, 1, torch.device("cuda", 1)), got
    del os.environ["GPURUN_LOCAL_SLOT"]  # an older gpurun, or node 0: the slot is the device
    os.environ["GPURUN_SLOT"] = "2"
    got = _slots_and_device(standby=True)
    assert got == (2, 2, torch.device("cuda", 2)), got
    os.environ.update(GPURUN_SLOT="1001", GPURUN_LOCAL_SLOT="1", GPURUN_DEVICE="cpu")
    got = _slots_and_device(standby=False)
    assert got == (1001, 1, torch.device("cpu")), got
finally:
    for k, v in _saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
print("python_units: another node's slot keeps its job id for keys, its local slot for the GPU")

# A Gloo group listens on the interface of this host's address towards gpurun's store, not on
# what the host name resolves to (a loopback address on many hosts: the other nodes cannot
# reach it); the user's GLOO_SOCKET_IFNAME wins; a store on loopback leaves torch's choice.
import fcntl  # noqa: E402
import socket  # noqa: E402
import struct  # noqa: E402

from gpurun import _gloo_iface  # noqa: E402

_saved_ifname = os.environ.pop("GLOO_SOCKET_IFNAME", None)
try:
    for host in ("127.0.0.1", "localhost", "::1", "", None):
        assert _gloo_iface.gloo_interface(host) is None, host
        with _gloo_iface.listening_towards(host):
            assert "GLOO_SOCKET_IFNAME" not in os.environ, host
    assert _gloo_iface.interface_of("127.0.0.1") == "lo"
    assert _gloo_iface.interface_of("not an address") is None
    # Each IPv4 address of this host's other interfaces: the store there -> its interface.
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as _s:
        for _, _name in socket.if_nameindex():
            try:
                _a = socket.inet_ntoa(fcntl.ioctl(_s.fileno(), 0x8915,
                                                  struct.pack("256s", _name.encode()))[20:24])
            except OSError:
                continue
            if _a.startswith("127."):
                continue
            assert _gloo_iface.gloo_interface(_a) == _name, (_a, _name)
            with _gloo_iface.listening_towards(_a):
                assert os.environ["GLOO_SOCKET_IFNAME"] == _name
            assert "GLOO_SOCKET_IFNAME" not in os.environ  # as it was, afterwards
            os.environ["GLOO_SOCKET_IFNAME"] = "mine0"
            with _gloo_iface.listening_towards(_a):
                assert os.environ["GLOO_SOCKET_IFNAME"] == "mine0"  # the user's, kept
            del os.environ["GLOO_SOCKET_IFNAME"]
finally:
    if _saved_ifname is not None:
        os.environ["GLOO_SOCKET_IFNAME"] = _saved_ifname
print("python_units: a Gloo group listens on the interface towards gpurun's store")

# The handoff's skeleton is a pickle with gpurun's _Ref placeholders: torch >= 2.6 loads only
# plain tensors unless told otherwise (weights_only=True by default), which refused every
# handoff of a CUDA or big tensor on the GPU machine's torch 2.11. Checked here against a
# torch.load that behaves as 2.6's does (this machine's torch 1.13 defaults to False).
import io  # noqa: E402
import pickle  # noqa: E402
from gpurun import _snapshot  # noqa: E402

_state = {"model": {"w": torch.zeros(40_000), "b": torch.ones(3)}, "step": 7}
_skeleton, _tensors = _snapshot.flatten(_state, keep=lambda t: t.numel() * t.element_size() > 65536)
assert len(_tensors) == 1  # the big one is sent apart: a _Ref stands for it
_buf = io.BytesIO()
torch.save((_skeleton, [[str(t.dtype), list(t.shape), t.device.type] for t in _tensors]), _buf)
_real_load = torch.load


def _load_as_torch_26(f, *args, weights_only=None, **kwargs):
    if weights_only is None or weights_only:
        raise pickle.UnpicklingError("Weights only load failed: Unsupported global: "
                                     "GLOBAL gpurun._snapshot._Ref")
    return _real_load(f, *args, weights_only=weights_only, **kwargs)


torch.load = _load_as_torch_26
try:
    _got, _metas = _snapshot.load_skeleton(_buf.getvalue())
finally:
    torch.load = _real_load
assert _metas == [["torch.float32", [40000], "cpu"]], _metas
print("python_units: the handoff's skeleton loads under torch >= 2.6's weights_only default")

# A handoff's received optimizer state is kept, not copied (torch 1.13's load_state_dict
# deep-copies it: 0.3-2.2 s for AdamW's moments of 1 GB), and it steps as a copied one does.
_nets = [torch.nn.Linear(4, 3) for _ in range(3)]
for _n in _nets[1:]:
    _n.load_state_dict(_nets[0].state_dict())
_opts = [torch.optim.AdamW(_n.parameters(), lr=0.1) for _n in _nets]
_nets[0](torch.ones(2, 4)).sum().backward()
_opts[0].step()
_sent = _opts[0].state_dict()
_got = copy.deepcopy(_sent)  # what a receiver holds: tensors of its own
_snapshot.load_optimizer_owned(_opts[1], _got)
_opts[2].load_state_dict(copy.deepcopy(_sent))
_w = _nets[1].weight
if torch.__version__.startswith("1."):  # 2.x copies the dict only: nothing to skip there
    assert _opts[1].state[_w]["exp_avg"].data_ptr() == _got["state"][0]["exp_avg"].data_ptr()
assert _snapshot.sys.modules["torch.optim.optimizer"].__dict__.get("deepcopy", copy.deepcopy) \
    is copy.deepcopy  # put back
for _n, _o in zip(_nets[1:], _opts[1:]):
    _n(torch.ones(2, 4)).sum().backward()
    _o.step()
assert torch.equal(_nets[1].weight, _nets[2].weight)
assert torch.equal(_opts[1].state[_nets[1].weight]["exp_avg_sq"],
                   _opts[2].state[_nets[2].weight]["exp_avg_sq"])
print("python_units: a handoff's optimizer state is kept, not copied; it steps the same")

# A CPU warm joiner's receive reserve: one buffer per big model tensor the source sends, plus
# AdamW's two moments per big parameter; a handoff takes them by shape and dtype.
_big = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Linear(256, 8))
_bopt = torch.optim.AdamW(_big.parameters())
_res = _snapshot.reserve_receive({"model": _big.state_dict()}, _bopt)
assert [list(t.shape) for t in _res] == [[256, 256]] * 3, [list(t.shape) for t in _res]
_first = _res[0]
_t = _snapshot._take_reserved(_res, [256, 256], torch.float32, torch.device("cpu"))
assert _t is _first and len(_res) == 2
assert _snapshot._take_reserved(_res, [8, 256], torch.float32, torch.device("cpu")).shape == \
    (8, 256) and len(_res) == 2  # none of that shape: a new one
assert _snapshot.reserve_receive({}, torch.optim.SGD(_big.parameters(), lr=0.1)) == []
print("python_units: a warm joiner reserves the handoff's buffers; a handoff takes them")
