"""A generation's process group, for gpurun.Runtime (a mixin: it uses the Runtime's backend,
comm timeout, store client, engine session, device and state): made on gpurun's store once every
rank arrived (or gpurun's abort key appeared), destroyed when the engine drops it, the tracked
module wrapped in DDP for it, the state broadcast over it and its checksum compared on every
rank. The engine decides when (runtime.py's _execute); a static run uses the same steps for its
start (docs/python.md)."""
import atexit
import time

import torch
import torch.distributed as dist

from . import _gloo_iface, _snapshot
from ._checksum import StateMismatch
from ._comm import NcclWake


class _ProcessGroup:
    def _make_group(self, prefix, abort_key, group, rank):
        """A process group of ``group`` (slots; this rank ``rank``) on gpurun's store under
        ``prefix``, the engine's key for it."""
        self._store()
        # Every rank of the group reached its set-up, or gpurun's abort key appeared (torch's
        # own rendezvous would wait for a dead peer until the comm timeout).
        self._session.wait_arrivals(prefix, rank, len(group), abort_key,
                                    self.comm_timeout.total_seconds())
        # Gloo: the group's own connections, closed should one of its collectives fail
        # (_comm.GroupLinks; NCCL's are NCCL's own).
        gloo = self.backend == "gloo"
        if gloo:
            self._links.before()
        _destroy_group_at_exit()
        try:
            # Gloo: listen where the other nodes reach this one (_gloo_iface).
            with _gloo_iface.listening_towards(_gloo_iface.store_host() if gloo else None):
                dist.init_process_group(self.backend,
                                        store=dist.PrefixStore(prefix + "/pg", self._pg_store),
                                        rank=rank, world_size=len(group),
                                        timeout=self.comm_timeout)
        except RuntimeError:
            # When gpurun abandons the generation (a rank died in its set-up) it closes this
            # connection to end torch's wait for the dead rank's address: the next group
            # needs a new one.
            self._pg_store = None
            raise
        finally:
            if gloo:
                self._links.after()

    def _destroy_group(self):
        self._ddp = None
        t0 = time.perf_counter()
        if dist.is_initialized():
            with NcclWake():  # NCCL's teardown would wait for its proxy thread's 500 ms poll
                dist.destroy_process_group()
        self._links.forget()
        self._destroy_ms = (time.perf_counter() - t0) * 1e3

    def _wrap(self):
        if self._module is None:
            return
        if dist.is_initialized() and dist.get_world_size() > 1:
            ids = [self.device.index] if self.device.type == "cuda" else None
            self._ddp = torch.nn.parallel.DistributedDataParallel(self._module, device_ids=ids)
            if self.elastic:
                self._register_hook(self._ddp)  # a peer's death in backward (_failed_step.py)
        else:
            self._ddp = None

    def _broadcast_state(self, root, load=True):
        """Sends the root's state to every rank of the group, tensor by tensor on the
        backend's device (_snapshot.broadcast_state); ``load``: this rank takes it (a rank that
        holds the current state already only takes part). Returns the bytes sent."""
        dev = self.device if self.backend == "nccl" else torch.device("cpu")
        state = self._state() if dist.get_rank() == root else None
        reserve, self._receive_reserve = self._receive_reserve, None
        got, total = _snapshot.broadcast_state(state, root, dev, load, reserve)
        if got is not None:
            self._load(got, owned=True)  # the received tensors are this rank's alone
        return total

    def _verify(self, root, what):
        """All-gathers the state checksum (int64, one per rank) and raises StateMismatch naming
        each rank whose checksum differs from rank ``root``'s. Blocks; raises what the
        collective raises. One rank has nothing to compare: no checksum and no collective (with
        NCCL a group's first collective sets its communicator up, 0.4-0.6 s on an H200 before the
        first step; the program's own first collective pays that, if it makes one). The C++
        runtime's SoloCommunicator makes no collective either (C++ still computes the
        checksum)."""
        if dist.get_world_size() == 1:
            return
        mine = self.checksum()
        dev = self.device if self.backend == "nccl" else torch.device("cpu")
        t = torch.tensor([mine], dtype=torch.int64, device=dev)
        out = [torch.zeros_like(t) for _ in range(dist.get_world_size())]
        dist.all_gather(out, t)
        sums = [int(x.item()) for x in out]
        bad = [f"rank {r} has {v & (2**64 - 1):016x}" for r, v in enumerate(sums) if v != sums[root]]
        if bad:
            raise StateMismatch(f"state checksum mismatch {what} (generation {self.generation}): "
                                f"rank {root} (the source) has {sums[root] & (2**64 - 1):016x}, "
                                + ", ".join(bad))


_exit_destroy_registered = False


def _destroy_group_at_exit():
    """Once per process, before the runtime makes a process group: the group the program ends
    with is destroyed at its normal exit (atexit), as a torchrun program's
    ``destroy_process_group()`` would be (torch >= 2.4 warns of leaked resources otherwise). A
    group the program made itself is the program's."""
    global _exit_destroy_registered
    if _exit_destroy_registered:
        return
    _exit_destroy_registered = True

    def destroy():
        try:
            if dist.is_initialized():
                with NcclWake():
                    dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - the process is ending; a broken group stays broken
            pass

    atexit.register(destroy)
