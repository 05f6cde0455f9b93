#!/usr/bin/env python3
"""ctest python_units: the Python elastic sampler deals what the C++ one deals; track() calls add up.

The golden permutation is the C++ test's (tests/worker_runtime/elastic_sampler_test.cpp,
"the same indices on every platform"); a property check: any sequence of world sizes between
steps trains every sample exactly once per epoch."""
import os
import random
import sys

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
from gpurun.runtime import _word_sums  # noqa: E402


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
