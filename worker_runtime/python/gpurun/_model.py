"""``Runtime.model``: one object for the whole job that is always the current generation's model
(docs/python.md#use), so a script keeps ``model = rt.model`` from before its loop and calls it
after any resize."""
import contextlib

import torch


class ElasticModel:
    """The tracked model as the current generation trains it: calling it, reading or setting an
    attribute (``train()``, ``eval()``, ``require_backward_grad_sync``, ``no_sync()``) goes to
    the generation's ``DistributedDataParallel`` wrapper when the world has more than one rank,
    else to the module itself. A resize makes a new wrapper; this object stays the same, so
    ``model = rt.model`` taken once before the loop stays right (a ``DDP(...)`` object kept by
    the program would keep the old generation's process group).

    ``module`` is always the plain ``torch.nn.Module`` (as ``DDP.module``: use it to evaluate
    without synchronising); ``state_dict()`` / ``load_state_dict()`` are the module's (keys
    without DDP's ``module.`` prefix, in every generation); an attribute DDP lacks (the
    program's own methods) is the module's. ``no_sync()`` is a no-op context without a wrapper.
    Before the first generation (and in a single-process run) it is the module."""

    __slots__ = ("_rt",)

    def __init__(self, rt):
        object.__setattr__(self, "_rt", rt)

    def _current(self):
        rt = object.__getattribute__(self, "_rt")
        target = rt._ddp if rt._ddp is not None else rt._module
        if target is None:
            raise RuntimeError("gpurun: Runtime.model is used before track(model=...) named one")
        return target

    @property
    def module(self):
        """The plain module (torch.nn.Module), whatever the generation."""
        rt = object.__getattribute__(self, "_rt")
        return rt._module

    def no_sync(self):
        """DDP's ``no_sync()`` (gradients kept local) when wrapped; otherwise a no-op context."""
        target = self._current()
        if isinstance(target, torch.nn.parallel.DistributedDataParallel):
            return target.no_sync()
        return contextlib.nullcontext()

    def __call__(self, *args, **kwargs):
        # a peer's death in DDP's forward collectives fails the step, not the program
        rt = object.__getattribute__(self, "_rt")
        return rt._forward(self._current(), args, kwargs)

    def state_dict(self, *args, **kwargs):
        """The plain module's ``state_dict()``: the same keys in every generation (no DDP
        ``module.`` prefix), so a checkpoint loads whatever the world size."""
        return self.module.state_dict(*args, **kwargs)

    def load_state_dict(self, *args, **kwargs):
        """The plain module's ``load_state_dict()``."""
        return self.module.load_state_dict(*args, **kwargs)

    def __getattr__(self, name):
        current = self._current()
        try:
            return getattr(current, name)
        except AttributeError:
            # the program's own methods (e.g. a model's configure_optimizers(), generate())
            # are the module's: DDP does not forward them
            module = object.__getattribute__(self, "_rt")._module
            if module is None or module is current:
                raise
            return getattr(module, name)

    def __setattr__(self, name, value):
        setattr(self._current(), name, value)

    def __repr__(self):
        rt = object.__getattribute__(self, "_rt")
        return f"gpurun.ElasticModel(generation {rt.generation}, {self._current()!r})"
