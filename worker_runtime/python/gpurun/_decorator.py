"""The decorator form of the Python package (docs/python.md#the-decorator-form): a per-epoch
function run in Runtime's elastic loop."""
from ._comm import is_comm_failure
from .runtime import Runtime


def elastic(model=None, optimizer=None, scheduler=None, dataset=None, batch_size=None,
            seed=0, loader_kwargs=None, drop_on_error=False, **others):
    """Decorator for a per-epoch function ``train_one_epoch(loader, epoch[, rt])``:

        @gpurun.elastic(model=net, optimizer=opt, dataset=train_set, batch_size=64)
        def train_one_epoch(loader, epoch, rt):
            for x, y in loader:
                ...  # forward with rt.model (DDP over this generation's group)

        rt = train_one_epoch(epochs=10)

    Calling the decorated function runs the whole elastic loop (``Runtime.epochs``) and
    returns the Runtime on every rank that finishes (a release-mode leaver exits with status
    0 inside it). A collective that fails because a peer died (``is_comm_failure``) is
    followed at once: the rank reports at its position, gpurun removes the dead rank, and the
    rest of the epoch runs again over the survivors (the failed step included, so each sample
    is still trained once). ``loader_kwargs`` (dict) goes to ``Runtime.loader`` (e.g.
    ``{"num_workers": 2}``). An exception of ``train_one_epoch`` fails the whole job, as under
    torchrun, unless ``drop_on_error`` (then gpurun goes on without the rank, as after a
    crash). Limits: docs/python.md#limits."""
    import inspect

    def wrap(fn):
        takes_rt = len(inspect.signature(fn).parameters) >= 3

        def run(epochs):
            rt = Runtime(drop_on_error=drop_on_error)
            rt.track(model=model, optimizer=optimizer, scheduler=scheduler, **others)
            loader = (rt.loader(dataset, batch_size=batch_size, seed=seed, **(loader_kwargs or {}))
                      if dataset else None)
            for epoch in rt.epochs(epochs):
                while True:
                    try:
                        fn(loader, epoch, rt) if takes_rt else fn(loader, epoch)
                        break
                    except SystemExit as e:
                        # sys.exit(N != 0) in the program fails the job, as under torchrun
                        # (the excepthook passes SystemExit by).
                        if e.code not in (None, 0) and rt.elastic and not drop_on_error:
                            rt._session.on({"event": "program_error",
                                            "text": f"SystemExit: sys.exit({e.code!r}) in "
                                                    f"{fn.__name__}"})
                        raise
                    except RuntimeError as e:
                        if not is_comm_failure(e) or not rt.elastic:
                            raise
                        if not rt._recover(e):
                            return rt
            return rt

        run.__wrapped__ = fn
        run.__doc__ = fn.__doc__
        return run

    return wrap
