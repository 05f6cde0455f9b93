#!/usr/bin/env python3
"""ctest python_failed_step: a peer's death inside a step of the loop form and of the decorator
form (worker_runtime/python/gpurun/_failed_step.py, docs/python.md#failures), in-process with fakes:
the gradient hook gives the rank's own gradient back instead of raising in backward(), the
tracked optimizer's and scheduler's step() then do nothing, DDP's forward falls back to the
module, and the loader gives the failed step's batch again after the recovery, so that every
sample is trained once. The process run with real peers: tests/python/run_nodes.sh kill_loop.
Runs on the CPU on any machine (the runtime's device pinned as a user would: GPURUN_DEVICE)."""
import os
import sys

os.environ["GPURUN_DEVICE"] = "cpu"
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "worker_runtime", "python"))
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import gpurun  # noqa: E402
from gpurun import _failed_step  # noqa: E402

PEER_DIED = "[gloo/transport/tcp/pair.cc:598] Connection closed by peer [127.0.0.1]:4242"


def elastic_runtime(elastic=True):
    """A Runtime (static: no gpurun here) whose recovery is recorded, not driven (no engine);
    ``elastic``: the hook and the forward take a peer's failure as under gpurun --config (the
    loops' rule does not look: a static loop has no engine to start or report to)."""
    rt = gpurun.Runtime()
    rt.elastic = elastic
    rt.recovered = []
    rt._recover = lambda err: rt.recovered.append((str(err), rt.epoch, rt._steps_done)) or True
    return rt


class Bucket:  # DDP's GradBucket as the hook reads it
    def __init__(self, values):
        self.t = torch.tensor(values)

    def buffer(self):
        return self.t


class AllReduce:
    """dist.all_reduce(tensor, async_op=True) stand-in: a work whose future fails with ``error``
    (None: the sum of 2 equal ranks); counts its calls."""

    def __init__(self, error=None):
        self.error, self.calls = error, 0

    def __call__(self, tensor, async_op=False):
        assert async_op
        self.calls += 1
        fut = torch.futures.Future()
        if self.error is not None:
            fut.set_exception(self.error)
        else:
            fut.set_result([tensor * 2])

        class Work:
            def get_future(self):
                return fut
        return Work()


real_all_reduce, real_world = dist.all_reduce, dist.get_world_size
dist.get_world_size = lambda *a, **k: 2
try:
    # A peer died in the all-reduce: the hook's future holds this rank's own gradient (divided
    # by the world as DDP's is), the step is failed, and the next bucket starts no all-reduce.
    # The group's connections are closed at once (a live peer blocked on this rank fails now,
    # not after the rest of the program's body), once.
    rt = elastic_runtime()
    severed = []
    rt._links.sever = lambda: severed.append(1) or 0
    dist.all_reduce = AllReduce(RuntimeError(PEER_DIED))
    got = _failed_step._allreduce_hook(rt, Bucket([2.0, 4.0])).wait()
    assert got.tolist() == [1.0, 2.0], got
    assert rt.step_failed and str(rt._step_failure) == PEER_DIED and severed == [1], severed
    got = _failed_step._allreduce_hook(rt, Bucket([6.0])).wait()
    assert got.tolist() == [6.0] and dist.all_reduce.calls == 1, (got, dist.all_reduce.calls)
    rt._fail_step(RuntimeError(PEER_DIED))
    assert severed == [1], severed

    # Without a failure: the mean over the ranks (what DDP's own all-reduce gives).
    rt = elastic_runtime()
    dist.all_reduce = AllReduce()
    assert _failed_step._allreduce_hook(rt, Bucket([2.0, 4.0])).wait().tolist() == [2.0, 4.0]
    assert not rt.step_failed

    # The decorator forms catch the error around the program's function: it is raised there.
    # So is an error that is not a peer's failure, in any form, and any in a static run.
    for raises, error, elastic in ((True, PEER_DIED, True), (False, "bad shape", True),
                                   (False, PEER_DIED, False)):
        rt = elastic_runtime()
        rt._failures_raise, rt.elastic = raises, elastic
        dist.all_reduce = AllReduce(RuntimeError(error))
        try:
            _failed_step._allreduce_hook(rt, Bucket([1.0])).wait()
            raise AssertionError(f"the hook swallowed {error!r} (raise mode {raises})")
        except RuntimeError as e:
            assert error in str(e), e
        assert not rt.step_failed
finally:
    dist.all_reduce, dist.get_world_size = real_all_reduce, real_world
print("python_failed_step: the gradient hook fails the step instead of raising in backward()")

# The tracked optimizer's step() does nothing in a failed step (every survivor keeps the state
# it had before it); an LR scheduler made before or after track() still counts the optimizer's
# steps (it wraps optimizer.step and expects a bound method; it warns when its own wrapper is
# gone: warnings are errors here), and the state moved at a resize is unchanged by the wrapper.
import warnings  # noqa: E402

for scheduler_first in (True, False):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rt = elastic_runtime(elastic=False)
        net = torch.nn.Linear(2, 1)
        opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
        sched = torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5) if scheduler_first else None
        rt.track(model=net)
        rt.track(optimizer=opt)
        rt._guard_step(opt)
        rt._guard_step(opt)  # once per object
        if sched is None:
            sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
        rt.track(scheduler=sched)
        net(torch.ones(1, 2)).sum().backward()
        opt.step()
        sched.step()
        # The scheduler saw the step: torch 1.13 counts it in _step_count, 2.x flags _opt_called
        # (and its warning for a step() it did not see is an error here).
        assert rt._stepped and getattr(opt, "_step_count", 1) == 1
        assert getattr(opt, "_opt_called", True)
        assert opt.param_groups[0]["lr"] == 0.05
        assert "step" not in opt.state_dict() and "step" not in sched.state_dict()
        before = rt.checksum()
        rt._count_step()
        rt._fail_step(RuntimeError(PEER_DIED))
        net(torch.ones(1, 2)).sum().backward()
        assert opt.step() is None and not rt._stepped
        assert rt.step_failed and rt.checksum() == before
print("python_failed_step: a failed step's optimizer step() does nothing")

# rt.model(x): DDP's forward failing with a peer's death runs the plain module (and so does
# every forward after it in the step); the program's own error is raised.
rt = elastic_runtime()
net = torch.nn.Linear(2, 1)
rt.track(model=net)


class DyingDdp:
    calls = 0

    def __call__(self, x):
        DyingDdp.calls += 1
        raise RuntimeError(PEER_DIED)


rt._ddp = DyingDdp()
x = torch.ones(3, 2)
assert torch.equal(rt.model(x), net(x)) and rt.step_failed
assert torch.equal(rt.model(x), net(x)) and DyingDdp.calls == 1
rt._step_failure = None
rt._ddp = lambda x: (_ for _ in ()).throw(ValueError("the program's own"))
try:
    rt.model(x)
    raise AssertionError("a program's error in forward was swallowed")
except ValueError:
    pass
print("python_failed_step: DDP's forward falling over a dead peer runs the module")

# The loader: a step failed before the optimizer's update comes again after the recovery (its
# batch, at the position reported), one failed after the update counts; every sample is trained
# once in the epoch, the gradients of the failed step are dropped.
for after_update in (False, True):
    rt = elastic_runtime(elastic=False)
    net = torch.nn.Linear(1, 1)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    rt.track(model=net)
    rt._guard_step(opt)
    data = torch.utils.data.TensorDataset(torch.arange(12.0).unsqueeze(1))
    loader = rt.loader(data, batch_size=2, seed=5)
    trained, failed_once = [], False
    for epoch in rt.epochs(1):
        for (xb,) in loader:
            net(xb).sum().backward()
            if rt.step == 2 and not failed_once:
                failed_once = True
                if after_update:
                    opt.step()
                rt._fail_step(RuntimeError(PEER_DIED))
            opt.step()
            if not rt.step_failed:
                trained += xb.squeeze(1).int().tolist()
            opt.zero_grad()
    assert sorted(trained) == list(range(12)), (after_update, trained)
    assert rt.recovered == [(PEER_DIED, 0, 3 if after_update else 2)], rt.recovered
    assert rt._step_failure is None and rt.stop_reason == "completed"
print("python_failed_step: the loader gives a failed step's batch again after the recovery")

# The decorator form (gpurun.elastic; _decorator._call_elastic catches the error around the
# program's function, which the hook lets through): the same rule as the loop form's. A failure
# after the optimizer's update (the program's own all_reduce after opt.step()) counts the step
# once, and the function's next call starts at the next batch; a failure inside backward (the
# gradient all-reduce, before step()) gives the same batch again. Each sample is trained once.
from gpurun import _decorator  # noqa: E402

for after_update in (False, True):
    rt = elastic_runtime(elastic=False)  # epochs() starts static here (no engine)
    rt._start_prepare = lambda: None  # the pause snapshot's file: not in this test
    net = torch.nn.Linear(1, 1)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    rt.track(model=net)
    rt._guard_step(opt)
    data = torch.utils.data.TensorDataset(torch.arange(12.0).unsqueeze(1))
    loader = rt.loader(data, batch_size=2, seed=5)
    trained, firsts, failed = [], [], []

    def train_one_epoch():
        for (xb,) in loader:
            batch = xb.squeeze(1).int().tolist()
            if len(firsts) == len(failed):
                firsts.append(batch)  # the first batch of each call
            net(xb).sum().backward()
            if rt.step == 2 and not failed:
                failed.append(batch)
                if not after_update:
                    raise RuntimeError(PEER_DIED)  # backward's all-reduce: no update
                opt.step()
                trained.extend(batch)
                raise RuntimeError(PEER_DIED)  # dist.all_reduce(loss) after the update
            opt.step()
            trained.extend(batch)
            opt.zero_grad()
        return "done"

    for epoch in rt.epochs(1):
        rt.elastic = True  # under gpurun --config: _call_elastic follows a peer's failure
        try:
            got = _decorator._call_elastic(rt, train_one_epoch, train_one_epoch, False)
        finally:
            rt.elastic = False
        assert got == "done" and rt.step == 6, (got, rt.step)
    assert sorted(trained) == list(range(12)), (after_update, trained)
    assert len(firsts) == 2 and (firsts[1] != failed[0]) == after_update, (firsts, failed)
    assert rt.recovered == [(PEER_DIED, 0, 3 if after_update else 2)], rt.recovered
    assert rt._global_step == 6, rt._global_step
    assert rt._step_failure is None and not rt._stepped and rt._in_step is None
print("python_failed_step: the decorator form counts a step whose update happened, once")

# A function that leaves the loader with `break` after a step's update leaves no step in flight
# for the next epoch: a failure there before any step (elastic_scheduler's _line_up) moves no
# cursor, and the next epoch is trained whole.
rt = elastic_runtime(elastic=False)
rt._start_prepare = lambda: None
net = torch.nn.Linear(1, 1)
opt = torch.optim.SGD(net.parameters(), lr=0.1)
rt.track(model=net)
rt._guard_step(opt)
loader = rt.loader(torch.utils.data.TensorDataset(torch.arange(8.0).unsqueeze(1)), batch_size=2)
seen = {}


def one_epoch(epoch, calls=[]):
    calls.append(epoch)
    if epoch == 1 and calls.count(1) == 1:
        raise RuntimeError(PEER_DIED)  # before the loader's first step
    for (xb,) in loader:
        net(xb).sum().backward()
        opt.step()
        seen.setdefault(epoch, []).extend(xb.squeeze(1).int().tolist())
        if epoch == 0:
            break  # the step's update happened; its _step_ended does not run


for epoch in rt.epochs(2):
    rt.elastic = True
    try:
        _decorator._call_elastic(rt, one_epoch, lambda: one_epoch(epoch), False)
    finally:
        rt.elastic = False
assert len(seen[0]) == 2 and sorted(seen[1]) == list(range(8)), seen
print("python_failed_step: a loader left by break leaves no step in flight")

# iterations(): a failed iteration runs again with the same number; epochs(): a failure outside
# the loader (after its last step) is recovered at the epoch's end and the epoch goes on.
rt = elastic_runtime(elastic=False)
seen = []
for it in rt.iterations(4, every=100):
    seen.append(it)
    if it == 1 and seen.count(1) == 1:
        rt._fail_step(RuntimeError(PEER_DIED))
assert seen == [0, 1, 1, 2, 3] and rt.recovered == [(PEER_DIED, 0, 1)], (seen, rt.recovered)
rt = elastic_runtime(elastic=False)
yielded = []
for epoch in rt.epochs(2):
    yielded.append(epoch)
    if len(yielded) == 1:
        rt._fail_step(RuntimeError(PEER_DIED))
assert yielded == [0, 0, 1], yielded
print("python_failed_step: iterations() and epochs() recover at their next turn")
print("python_failed_step: OK")
