"""The elastic loader of gpurun.Runtime (``Runtime.loader``, ``Runtime.steps``): one epoch's
batches of this rank from the ElasticSampler's cursor, cut at the boundaries gpurun may decide
at, and ``[batch] global`` steps cut into micro-batches."""
import contextlib

import torch


_NEXT, _AGAIN, _END = "next", "again", "end"  # _Loader._step_ended: what follows a step


class _Loader:
    """One epoch's batches of this rank (see Runtime.loader)."""

    def __init__(self, rt, dataset, batch_size, kwargs):
        self.rt, self.dataset, self.batch_size, self.kwargs = rt, dataset, batch_size, kwargs

    def __len__(self):
        """Steps left in this epoch at the current world size (int): what tqdm's percentage
        and ETA read when the epoch's loop starts (a resize inside the epoch changes it)."""
        return self.steps_left()

    def steps_left(self):
        """Steps left in this epoch at the current world size (int; for progress bars)."""
        s, w = self.rt._sampler, self.rt.world_size
        per = (self.rt.global_batch if self.rt._uses_steps and self.rt.global_batch
               else self.batch_size * w)
        full, rest = divmod(s.remaining(), per)
        return full + (1 if rest >= w else 0)  # a tail smaller than the world is skipped

    def _collate(self, idx):
        collate = self.kwargs.get("collate_fn", torch.utils.data.default_collate
                                  if hasattr(torch.utils.data, "default_collate")
                                  else torch.utils.data.dataloader.default_collate)
        return collate([self.dataset[i] for i in idx])

    def _segment(self, per_step):
        """[(count, this rank's indices)] of the steps from the cursor to the next possible
        boundary: the epoch's end, or the step after which _after_step() may decide."""
        rt, s = self.rt, self.rt._sampler
        plan, offset, steps = [], 0, rt._steps_done
        while s.remaining() - offset >= rt.world_size:
            count = min(per_step, s.remaining() - offset)
            plan.append((count, s.window(count, rt.rank, rt.world_size, offset)))
            offset += count
            steps += 1
            if rt.elastic and rt.every_steps > 0 and steps % rt.every_steps == 0:
                break
        return plan

    def _workers(self, batches):
        """An iterator over the collated ``batches`` (lists of indices), read by a DataLoader
        with this loader's worker arguments."""
        # The DataLoader forks its workers: no thread of the runtime's may run then (a child
        # forked while the snapshot preparation held a lock could block forever; CI saw one
        # such hang in the first epoch after a grow, when the preparation starts).
        if self.rt.elastic:
            self.rt._join_prepare()
        kw = {k: v for k, v in self.kwargs.items() if k != "collate_fn"}
        collate = self.kwargs.get("collate_fn")
        if collate is not None:
            kw["collate_fn"] = collate
        return iter(torch.utils.data.DataLoader(self.dataset, batch_sampler=batches, **kw))

    def _check_inside_epochs(self):
        if self.rt.elastic and not self.rt._started:
            raise RuntimeError("iterate the gpurun loader inside `for epoch in rt.epochs(n):` "
                               "(under gpurun --config the world, the rank and the state are "
                               "set up by epochs())")

    def __iter__(self):
        self._check_inside_epochs()
        rt, s = self.rt, self.rt._sampler
        rt._warn_direct_iteration()
        workers = self.kwargs.get("num_workers", 0) > 0
        while s.remaining() >= rt.world_size:  # a tail smaller than the world is skipped
            plan = self._segment(self.batch_size * rt.world_size)
            it = self._workers([mine for _, mine in plan]) if workers else None
            for j, (count, mine) in enumerate(plan):
                batch = next(it) if workers else self._collate(mine)
                rt._in_step = count  # a failure before _step_ended: _recover_step counts it
                yield batch
                if j == len(plan) - 1:
                    it = None  # the segment's DataLoader and its workers end before a boundary
                after = self._step_ended(count)
                if after is _END:
                    return
                if after is _AGAIN:
                    it = None
                    break
        s.advance(s.remaining())

    def _step_ended(self, count):
        """After the program's body of one step of ``count`` samples: the cursor moves past
        them when the step's update happened (a step whose collective failed before the update
        runs again); a failed step is recovered from here (_failed_step.py), else a step
        boundary may follow. Returns _NEXT (the plan's next step), _AGAIN (recovered: plan the
        rest of the epoch anew, over the new world, from the cursor) or _END (this epoch's
        iteration ends: the job is finishing, or this rank rejoined at another position)."""
        rt = self.rt
        if rt._step_failure is not None:  # counted there when its update happened
            return _AGAIN if rt._recover_step() and not rt._jumped else _END
        rt._in_step = None
        rt._sampler.advance(count)
        rt._steps_done += 1
        return _NEXT if rt._after_step() else _END

    def _steps(self):
        self._check_inside_epochs()
        rt, s = self.rt, self.rt._sampler
        workers = self.kwargs.get("num_workers", 0) > 0
        while s.remaining() >= rt.world_size:
            per_step = rt.global_batch or self.batch_size * rt.world_size
            if per_step < rt.world_size:
                raise ValueError(f"[batch] global = {per_step} is smaller than the world size "
                                 f"{rt.world_size}: every rank needs at least one sample per "
                                 "step (raise [batch] global in the config)")
            plan = self._segment(per_step)
            steps = [_Step(self, mine, count) for count, mine in plan]
            box = [self._workers([mb for st in steps for mb in st.micro])] if workers else None
            if workers:
                for st in steps:
                    st.fetch = lambda _mb, box=box: next(box[0])
            for j, ((count, _), st) in enumerate(zip(plan, steps)):
                rt._in_step = count  # a failure before _step_ended: _recover_step counts it
                yield st
                if j == len(plan) - 1 and box:
                    box[0] = None  # the DataLoader and its workers end before a boundary
                after = self._step_ended(count)
                if after is _END:
                    return
                if after is _AGAIN:
                    break
        s.advance(s.remaining())


class _Step:
    """One optimizer step's micro-batches of this rank (see Runtime.steps)."""

    def __init__(self, loader, mine, count):
        self.loader, self.mine, self.count = loader, mine, count
        b = loader.batch_size
        self.micro = [mine[i:i + b] for i in range(0, len(mine), b)]
        self.fetch = loader._collate  # micro-batch indices -> batch (workers: the next one read)

    def __len__(self):
        return len(self.micro)

    def __iter__(self):
        rt = self.loader.rt
        for i, mb in enumerate(self.micro):
            last = i == len(self.micro) - 1
            ctx = rt._ddp.no_sync() if rt._ddp is not None and not last else contextlib.nullcontext()
            with ctx:
                yield self.fetch(mb), len(mb) * rt.world_size / self.count
