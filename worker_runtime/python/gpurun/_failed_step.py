"""A peer's death inside a training step, for gpurun.Runtime (a mixin; docs/python.md#failures).

A collective the runtime issues inside the program's step — DDP's gradient all-reduce in
``loss.backward()`` (the comm hook below), DDP's own collectives in ``rt.model(x)`` (the buffer
broadcast, the bucket rebuild of a generation's second step) — fails when a peer dies (its
process killed, its node's gpurun killed with it). In the loop forms (``for epoch in
rt.epochs()``, ``rt.iterations()``) that error would be raised in the program's own body, where
the runtime cannot catch it, and end the program with the job's state. Instead:

* the step is marked failed (``Runtime.step_failed``); the rest of the step issues no
  collective: ``rt.model(x)`` runs the plain module, the gradient hook returns this rank's own
  gradient, and the tracked optimizer's ``step()`` does nothing, so every survivor keeps the
  state it had before the step;
* when the program's body hands control back to the runtime (the loader's next step,
  ``iterations()``' next iteration, ``epochs()``' next epoch), the rank reports at its
  position (``Runtime._recover``, the decorator's rule too), gpurun decides without the dead
  ranks, and the failed step runs again over the survivors: the loader's cursor moves only
  past a step whose optimizer update happened.

The decorator forms (``gpurun.elastic``, ``elastic_scheduler``) catch the error around the
program's function themselves (_decorator._call_elastic): there the hook lets it through
(``_failures_raise``), and what follows the failed collective in the function does not run; the
recovery is the same (``_recover_step``): a step whose optimizer update happened before the
failure (the program's own collective after ``opt.step()``) counts, and the function's next
call starts at the next step.
"""
import functools
import types

import torch
import torch.distributed as dist

from ._comm import is_comm_failure


class _FailedStep:
    """Runtime's failed-step rule; mixed into Runtime (uses ``_recover``, ``_module``,
    ``_count_step``)."""

    def _init_failed_step(self):
        self._step_failure = None  # the error of a collective of the runtime's in this step
        self._stepped = False  # the tracked optimizer's step() ran in this step
        self._in_step = None  # samples of the loader's step in flight (None: no step of its)
        self._failures_raise = False  # a decorator catches failures around the program's call

    @property
    def step_failed(self):
        """True when a collective of the runtime's failed in the current step before the tracked
        optimizer's ``step()`` (a peer died): that ``step()`` did nothing, and the loader gives
        this step's batch again once gpurun decided without the dead rank. A program that logs or counts its steps skips a step where it is set.
        Always False in the decorator forms (the error ends the function's call there)."""
        return self._step_failure is not None and not self._stepped

    def _fail_step(self, err):
        """A collective of the runtime's failed inside the program's step: the step goes on
        without collectives and is recovered from when the program hands control back. The
        group's connections are closed now (``GroupLinks.sever``), not after the rest of the
        program's body: a live peer blocked on this rank fails at once too. Called from torch's
        communication thread (the gradient hook) or the training thread."""
        if self._step_failure is None:
            self._step_failure = err
            self._links.sever()

    def _recover_step(self, err=None):
        """After a step in which a collective failed (a peer died): the loop forms' runtime
        collective (``_fail_step``), or ``err``, the error a decorator form caught around the
        program's function (_decorator._call_elastic; there the step's body did not end). One
        rule for every form: the step counts when the tracked optimizer's ``step()`` ran in it
        before the failure (its update happened) — the loader's cursor moves past the step's
        samples, and the loader goes on from the next step; else the step runs again (the same
        batch). Then the gradients of the step are dropped, the rank reports at its position
        and follows gpurun's decision (``_recover``). Returns False when the job is finishing."""
        err = self._step_failure if err is None else err
        applied, samples = self._stepped, self._in_step
        self._step_failure, self._in_step = None, None
        if applied:
            if samples is not None:  # a step of the loader's (its _step_ended did not count it)
                self._sampler.advance(samples)
                self._steps_done += 1
            self._count_step()
        self._stepped = False
        if self._module is not None:
            for p in self._module.parameters():
                p.grad = None  # this rank's own gradient of a step that did not happen
        return self._recover(err)

    def _forward(self, target, args, kwargs):
        """``rt.model(...)``: ``target`` (this generation's DDP wrapper, or the module) called;
        a DDP forward whose collective fails (a peer died) marks the step failed and runs the
        plain module instead, as does any forward after that in the same step."""
        if target is self._module or self._failures_raise or not self.elastic:
            return target(*args, **kwargs)
        if self._step_failure is None:
            try:
                return target(*args, **kwargs)
            except RuntimeError as e:
                if not (self.elastic and is_comm_failure(e)):
                    raise
                self._fail_step(e)
        return self._module(*args, **kwargs)

    def _register_hook(self, ddp):
        """DDP's gradient all-reduce through the runtime (the sum over ranks divided by the
        world size, as DDP's own; torch's default_hooks.allreduce_hook), so that a peer's
        failure in it marks the step failed rather than raising in ``backward()``."""
        ddp.register_comm_hook(self, _allreduce_hook)

    def _guard_step(self, optimizer):
        """The tracked ``optimizer``'s ``step()`` does nothing in a failed step. Wraps the
        object's own ``step`` (an LR scheduler's step counter put there before stays; one made
        after wraps this one); once per object. (Not a scheduler: its ``state_dict()`` is its
        ``__dict__``, which would then hold the wrapper; Optimizer's is its state.)"""
        obj = optimizer
        inner = obj.step
        if getattr(inner, "_gpurun_guard", False):
            return
        func = getattr(inner, "__func__", None)  # the class's step, bound to obj
        rt = self

        def step(self_, *args, **kwargs):
            if rt._step_failure is not None:
                return None
            rt._stepped = True
            return func(self_, *args, **kwargs) if func is not None else inner(*args, **kwargs)

        # the wrapped step's name, doc and marks (an LR scheduler's _with_counter: it checks)
        functools.update_wrapper(step, inner)
        step._gpurun_guard = True
        # a bound method, as torch's LR schedulers expect of optimizer.step (__func__, __self__)
        obj.step = types.MethodType(step, obj)


def _allreduce_hook(rt, bucket):
    """DDP comm hook (runs in backward, on the autograd thread): all-reduces the bucket
    (divided by the world size first); a peer's failure gives this rank's own gradient back and
    marks the step failed (the tracked optimizer's step() then does nothing). After a failure in
    the step, no all-reduce is started."""
    buf = bucket.buffer()
    if rt._step_failure is not None and not rt._failures_raise:
        return _ready(buf)
    buf.div_(dist.get_world_size())

    def finish(fut):
        try:
            return fut.value()[0]
        except RuntimeError as e:
            if rt._failures_raise or not rt.elastic or not is_comm_failure(e):
                raise
            rt._fail_step(e)
            return buf

    return dist.all_reduce(buf, async_op=True).get_future().then(finish)


def _ready(tensor):
    """A completed torch future holding ``tensor``."""
    devices = [tensor.device] if tensor.device.type == "cuda" else None
    fut = torch.futures.Future(devices=devices) if devices else torch.futures.Future()
    fut.set_result(tensor)
    return fut
