"""The step-loop form of gpurun.Runtime (docs/python.md#the-step-iterator): ``iterations()``
for iteration-based training (nanoGPT's shape: no dataset, no epochs, random batches) and
``micro_steps()`` for gradient accumulation split over the current world."""
import hashlib

import torch

from ._energy import StopReason


class Micro:
    """One micro-step of an iteration on this rank (``Runtime.micro_steps``).

    * ``index`` (int): the micro-step's number in the iteration over all ranks, 0 …
      ``grad_accum`` − 1: the same micro-step gets the same number whatever the world size.
    * ``local`` (int): its number on this rank, 0 … ``rt.accum_steps`` − 1.
    * ``last`` (bool): this rank's last micro-step of the iteration (DDP synchronises the
      gradients in its backward; ``micro_steps()`` sets that itself).
    * ``weight`` (float): multiply the micro-batch's mean loss by it before ``backward()``:
      world_size / grad_accum, so the averaged gradient is the mean over the iteration's
      ``grad_accum`` micro-batches whatever the world size (DDP divides the sum over ranks by
      the world size; it equals 1 / ``rt.accum_steps`` when the world divides grad_accum).
    * ``generator`` (torch.Generator, CPU): seeded from (``seed``, iteration, ``index``) only,
      so a batch drawn with it is the same whichever rank draws it and however many ranks
      there are: ``torch.randint(n, (b,), generator=micro.generator)``.
    """

    __slots__ = ("index", "local", "last", "weight", "_seed", "_it", "_gen")

    def __init__(self, index, local, last, weight, seed, it):
        self.index, self.local, self.last, self.weight = index, local, last, weight
        self._seed, self._it, self._gen = seed, it, None

    @property
    def generator(self):
        if self._gen is None:
            self._gen = torch.Generator()
            self._gen.manual_seed(micro_seed(self._seed, self._it, self.index))
        return self._gen

    def __repr__(self):
        return (f"gpurun.Micro(index={self.index}, local={self.local}, last={self.last}, "
                f"weight={self.weight:g})")


def micro_seed(seed, it, index):
    """A 63-bit seed for (seed, iteration, micro-step) (BLAKE2b of the three integers): streams
    of neighbouring micro-steps are unrelated, and no rank or world size enters it."""
    h = hashlib.blake2b(f"{seed}:{it}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") & (2**63 - 1)


def split(total, world, rank):
    """This rank's share of ``total`` micro-steps: ``(first, count)``, contiguous, the first
    ``total % world`` ranks one more; ``count`` is 0 for the ranks beyond ``total`` when the
    world is larger (micro_steps() gives those one micro-step of weight 0)."""
    if rank >= total:
        return total, 0
    base, extra = divmod(total, world)
    first = rank * base + min(rank, extra)
    return first, base + (1 if rank < extra else 0)


class _Iterations:
    """Runtime's step-loop form; mixed into Runtime (uses its boundary machinery)."""

    def iterations(self, max_iters, every=25, grad_accum=None, seed=0, start=0):
        """Yields the global iteration number ``it`` (int) from the job's current one up to
        ``max_iters`` − 1: the counter is part of the elastic state, so a rank that joins
        mid-job (a grow, a resume after a pause, a standby) starts at the same ``it`` as the
        others, and a hold-mode rank woken later goes on from the state's ``it``.

        A boundary (report to gpurun, follow its decision: resize, park, pause, exit) comes
        after every ``every`` iterations (and after every ``[boundary] every`` steps of
        config.toml when that is set), never after the last. ``grad_accum`` (int ≥ 1 or None):
        the iteration's micro-steps over *all* ranks; ``micro_steps()`` deals this rank's share
        and ``accum_steps`` counts it (None: one micro-step per rank). ``seed`` (int): the seed
        of the micro-steps' generators (``Micro.generator``). ``start`` (int): the iteration a
        job that starts afresh begins at (a run resumed from the program's own checkpoint:
        ``start=iter_num``); rank 0's is every rank's, and a mid-job joiner takes the job's
        instead. A release-mode leaver exits the
        process (status 0) inside the loop; when the job stops (``stop_reason``) the loop ends.
        Under gpurun --config, a process that joins without the state takes its slot's random
        streams back at its admission, before its first iteration
        (docs/python.md#the-step-iterator). Raises ValueError for a
        bad argument, RuntimeError when the loader form is used on the same Runtime."""
        for name, v, low in (("max_iters", max_iters, 0), ("every", every, 1),
                             ("start", start, 0)):
            if not isinstance(v, int) or isinstance(v, bool) or v < low:
                raise ValueError(f"Runtime.iterations(): {name} must be an int >= {low}, not {v!r}")
        if grad_accum is not None and (not isinstance(grad_accum, int)
                                       or isinstance(grad_accum, bool) or grad_accum < 1):
            raise ValueError(f"Runtime.iterations(): grad_accum must be an int >= 1 or None, "
                             f"not {grad_accum!r}")
        if self._sampler is not None:
            raise RuntimeError("Runtime.iterations() on a Runtime that has a loader(): the "
                               "step loop and the epoch loop keep different positions; use one "
                               "form per Runtime")
        self._iteration_form = True
        self.grad_accum, self._micro_seed = grad_accum, seed
        self.max_epochs = 1
        if not self._started:
            self._steps_done = start  # rank 0's goes to every rank with the start's state
        self._ensure_started()
        while self._steps_done < max_iters and not self._finishing:
            yield self._steps_done
            if self._finishing:
                return
            if self._step_failure is not None:
                # A collective of the runtime's failed in this iteration (a peer died,
                # _failed_step.py): it counts only when the optimizer's update came before the
                # failure; after gpurun's decision the loop goes on from the state's position.
                if self._stepped:
                    self._steps_done += 1
                if not self._recover_step():
                    return
                self._jumped = False
                continue
            if self._jumped:  # a hold-mode rank woken at the state's position (a boundary)
                self._jumped = False
                continue
            self._steps_done += 1
            self._count_step()
            done = self._steps_done
            config_every = self.every_steps if self.elastic else 0
            if done < max_iters and (done % every == 0
                                     or (config_every > 0 and done % config_every == 0)):
                if self._stop_asked:
                    return self._stop_here()
                if not self._boundary(self.epoch, done):
                    return
                self._jumped = False  # the loop goes on from the position the boundary left
        if not self._finishing:
            self.stop_reason = StopReason("completed")

    @property
    def accum_steps(self):
        """This rank's micro-steps per iteration in the current generation (int): its share of
        ``grad_accum`` (``iterations()``), 1 without it, and 1 for a rank beyond grad_accum (a
        program that divides its loss by it then adds a full micro-batch's gradient: use
        ``micro_steps()``' weights where the world can exceed grad_accum)."""
        if not self.grad_accum:
            return 1
        return max(1, split(self.grad_accum, self.world_size, self.rank)[1])

    def micro_steps(self):
        """This rank's micro-steps of the current iteration (``Micro``, see its fields): a
        contiguous share of the iteration's ``grad_accum`` micro-steps (the first
        ``grad_accum % world`` ranks one more). DDP's gradient synchronisation is off for all but
        the last (``require_backward_grad_sync`` of ``rt.model``), so backward each micro-batch's
        ``loss * micro.weight`` and step the optimizer after the loop. A rank beyond
        ``grad_accum`` (a world larger than it, e.g. after a grow) gets one micro-step of weight
        0 and a negative ``index``: it takes part in the all-reduce and adds nothing (one note
        on stderr)."""
        total = self.grad_accum or self.world_size
        first, count = split(total, self.world_size, self.rank)
        ddp = self._ddp
        weight = self.world_size / total
        if count == 0:
            # More ranks than micro-steps (a grow past grad_accum): this rank still takes part
            # in DDP's gradient all-reduce, with a micro-step that adds nothing to the gradient.
            if "grad_accum" not in self._warned:
                self._warned.add("grad_accum")
                self._note(f"grad_accum = {total} is below the world size {self.world_size}: "
                           f"rank {self.rank} runs a micro-step of weight 0 each iteration "
                           "(wasted work; raise grad_accum, or use fewer GPUs)")
            first, count, weight = -1 - self.rank, 1, 0.0
        try:
            for k in range(count):
                last = k == count - 1
                if ddp is not None:
                    ddp.require_backward_grad_sync = last
                yield Micro(first + k, k, last, weight, self._micro_seed, self._steps_done)
        finally:
            if ddp is not None:
                ddp.require_backward_grad_sync = True
