"""The decorator form of the Python package (docs/python.md#the-decorator-form): a per-epoch
function run in Runtime's elastic loop."""
import os
import sys

from ._comm import is_comm_failure
from .runtime import Runtime


def elastic(model=None, optimizer=None, scheduler=None, dataset=None, batch_size=None,
            seed=0, loader_kwargs=None, drop_on_error=False, **others):
    """Decorator for a per-epoch function ``train_one_epoch(loader, epoch[, rt])``:

        @gpurun.elastic(model=net, optimizer=opt, dataset=train_set, batch_size=64)
        def train_one_epoch(loader, epoch, rt):
            for x, y in loader:
                ...  # forward with rt.model (DDP over this generation's group)

        rt = train_one_epoch(epochs=10)   # epochs=None: until the job stops

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

        def run(epochs=None):
            rt = Runtime(drop_on_error=drop_on_error)
            _say_how_it_runs(rt, fn.__name__, None)
            rt.track(model=model, optimizer=optimizer, scheduler=scheduler, **others)
            loader = (rt.loader(dataset, batch_size=batch_size, seed=seed, **(loader_kwargs or {}))
                      if dataset else None)
            for epoch in rt.epochs(epochs):
                call = (lambda: fn(loader, epoch, rt)) if takes_rt else (lambda: fn(loader, epoch))
                if _call_elastic(rt, fn, call, drop_on_error) is _JOB_ENDED:
                    return rt
            return rt

        run.__wrapped__ = fn
        run.__doc__ = fn.__doc__
        return run

    return wrap


_JOB_ENDED = object()  # _call_elastic: the job is finishing


def _call_elastic(rt, fn, call, drop_on_error):
    """Runs ``call()`` (one epoch of the decorated ``fn``) to its end and returns its value. A
    collective that fails because a peer died (``is_comm_failure``) is followed at once: the
    rank reports at its position, gpurun goes on without the dead rank, and ``call()`` runs
    again over the survivors: the loader goes on from the step that failed, or from the next
    one when the tracked optimizer's ``step()`` ran in it (``_recover_step``); _JOB_ENDED when
    gpurun ends the job instead. ``sys.exit(N != 0)`` inside fails the job, as under torchrun
    (the excepthook passes SystemExit by), unless ``drop_on_error``."""
    while True:
        rt._failures_raise = True  # a failed collective raises here (_failed_step.py)
        try:
            return call()
        except SystemExit as e:
            if e.code not in (None, 0) and rt.elastic and not drop_on_error:
                rt._session.on({"event": "program_error",
                                "text": f"SystemExit: sys.exit({e.code!r}) in {fn.__name__}"})
            raise
        except RuntimeError as e:
            if not is_comm_failure(e) or not rt.elastic:
                raise
            # the step counts when the optimizer's update came before the failure, as in the
            # loop forms (_failed_step.py): the loader goes on from the next step, else this one
            if not rt._recover_step(e):
                return _JOB_ENDED
        finally:
            rt._failures_raise = False


# Parameter names the gpud form recognises (gpud's own, and the usual spellings).
_DATA_NAMES = ("dataset", "dataloader", "dataset_or_dataloader", "train_loader", "loader",
               "train_dataset", "data")
_OPTIMIZER_NAMES = ("optimizer", "optim", "opt")


def elastic_scheduler(config_path="config.toml", batch_size=None, num_workers=None, seed=0,
                      drop_on_error=False, loader_kwargs=None):
    """gpud's decorator: elastic training for a per-epoch function the program calls itself.

        @elastic_scheduler(config_path="config.toml")
        def train_one_epoch(model, dataset, optimizer, criterion, epoch, device):
            ...

        epoch = 0
        while True:                       # or: for epoch in range(N)
            train_one_epoch(model, train_set, optimizer, criterion, epoch, device)
            epoch += 1

    Parameters are found by name, in any order, extra ones passed through: ``model``
    (torch.nn.Module, or the first module argument that is not a loss), the data (``dataset``,
    ``dataloader``, ``train_loader``, ...: a ``Dataset`` or a ``DataLoader``, else the first
    argument of either type), ``optimizer``, ``epoch`` (int), ``device``. Each call is one
    epoch: it makes the boundary before it (gpurun's decision: go on, resize, park, pause,
    stop), then calls the function with ``model`` replaced by ``Runtime.model`` (the current
    generation's DDP model; ``.module`` is the plain one), the data by the elastic loader
    (``Runtime.loader``: each sample once per epoch whatever the resizes; ``len()`` is the
    epoch's steps), ``device`` by the slot's device and ``epoch`` by the job's epoch, and
    returns the function's return value. The first call makes the Runtime (available as
    ``train_one_epoch.runtime``) and tracks the model and optimizer.

    Loader: batch size from a DataLoader passed as the data (its ``collate_fn`` too), else
    ``batch_size``, else 64 (gpud's default); ``num_workers`` as gpud's: half the CPU cores
    (``os.cpu_count() // 2``, at least 1) unless given; ``pin_memory`` on CUDA.
    ``loader_kwargs``: more ``Runtime.loader`` arguments.

    Lining up: a process that joins mid-job (a grow in release mode, a standby, a resume, a
    hold-mode rank woken later) trains the job's epoch in the call it joins in, with ``epoch``
    the job's value; its later calls whose ``epoch`` argument it has already trained return None
    at once, without a boundary, until its loop reaches the job's next epoch. So a loop that ends
    after N epochs ends together on every rank, and nobody waits for a rank that will never
    come. (A loop that passes the same ``epoch`` every call is never skipped.)

    When the job stops (SIGTERM or preemption, the energy early stop, another rank ended its
    program) the next call prints one line and ends the process with status 0 (SystemExit:
    ``finally`` and ``atexit`` run); ``train_one_epoch.runtime.stop_reason`` says why. To end
    early (a target metric), leave the loop on every rank, or on one: the others end at their
    next call.

    Without gpurun --config (torchrun, plain python, gpurun alone) it runs static and rank 0
    says so in one line. Under gpurun --config, gpurun's ``--config`` file is the one watched:
    when ``config_path`` names another file, one line says which one counts.
    ``drop_on_error``: as ``gpurun.elastic``'s."""
    import functools
    import inspect

    def wrap(fn):
        sig = inspect.signature(fn)
        form = _SchedulerForm(fn, sig, config_path, batch_size, num_workers, seed, drop_on_error,
                              loader_kwargs)

        @functools.wraps(fn)
        def call(*args, **kwargs):
            result = form(args, kwargs)
            call.runtime = form.rt
            return result

        call.runtime = None
        return call

    return wrap


class _SchedulerForm:
    """One decorated function's calls (elastic_scheduler)."""

    def __init__(self, fn, sig, config_path, batch_size, num_workers, seed, drop_on_error,
                 loader_kwargs):
        self.fn, self.sig, self.config_path = fn, sig, config_path
        self.batch_size, self.num_workers, self.seed = batch_size, num_workers, seed
        self.drop_on_error, self.loader_kwargs = drop_on_error, dict(loader_kwargs or {})
        self.rt = self.loader = self.epochs = None
        self.names = {}
        # The gpud form's part of the elastic state, a tracked dict (small: every rank and every
        # joiner gets rank 0's): "arg", the program's epoch argument of the epoch the job trains.
        self.position = {"arg": None}
        self.offset = 0  # the job's epoch minus this process's argument (a joiner's lag)
        self.skip = 0  # calls left to return None at once (every member skips them in step)
        self.last_call_arg = None  # the program's epoch argument of its previous call

    def _find(self, arguments):
        """{role: parameter name} for model, data, optimizer, epoch, device."""
        import torch
        names = {}
        params = list(arguments)
        for p in params:
            v = arguments[p]
            if p == "model" or ("model" not in names and isinstance(v, torch.nn.Module)
                                and not isinstance(v, torch.nn.modules.loss._Loss)
                                and "model" not in arguments):
                names.setdefault("model", p)
            if p in _DATA_NAMES or isinstance(v, (torch.utils.data.Dataset,
                                                  torch.utils.data.DataLoader)):
                names.setdefault("data", p)
            if p in _OPTIMIZER_NAMES or isinstance(v, torch.optim.Optimizer):
                names.setdefault("optimizer", p)
        for role in ("epoch", "device"):
            if role in arguments:
                names[role] = role
        return names

    def _start(self, arguments):
        import torch
        self.names = self._find(arguments)
        rt = Runtime(drop_on_error=self.drop_on_error)
        self.rt = rt
        _say_how_it_runs(rt, self.fn.__name__, self.config_path)
        model = arguments.get(self.names.get("model"))
        optimizer = arguments.get(self.names.get("optimizer"))
        rt.track(model=model, optimizer=optimizer, gpud_position=self.position)
        data = arguments.get(self.names.get("data"))
        if data is not None:
            kw = dict(self.loader_kwargs)
            size = self.batch_size or 64
            if isinstance(data, torch.utils.data.DataLoader):
                if data.batch_size:
                    size = data.batch_size
                if data.collate_fn is not None and "collate_fn" not in kw:
                    kw["collate_fn"] = data.collate_fn
                data = data.dataset
            workers = self.num_workers
            if workers is None:
                workers = max(1, (os.cpu_count() or 2) // 2)  # gpud: half the cores
            kw.setdefault("num_workers", workers)
            if kw["num_workers"] > 0 and rt.device.type == "cuda":
                kw.setdefault("pin_memory", True)
            self.loader = rt.loader(data, batch_size=size, seed=self.seed, **kw)
        self.epochs = rt.epochs(None)

    def _line_up(self, lag):
        """How this process's loop lines up with the job's epochs. ``lag``: the job's epoch this
        call trains minus the program's ``epoch`` argument (a process that joined mid-job is
        behind by the epochs trained before it came). Every call of every member trains one job
        epoch, so the program's code after the call runs once per epoch on every member, in
        step (a barrier there pairs up). Members skip calls only together: the smallest lag
        over the generation (one all-reduce of an int64) is skipped by every member after this
        call (its later calls return None at once), so a loop that ends after N epochs ends
        with the job on every rank once no member is ahead any more (a resume: every process
        behind; a joiner left alone)."""
        import torch
        import torch.distributed as dist
        rt = self.rt
        common = lag
        if rt.elastic and dist.is_initialized() and dist.get_world_size() > 1:
            dev = rt.device if rt.backend == "nccl" else torch.device("cpu")
            t = torch.tensor([lag], dtype=torch.int64, device=dev)
            dist.all_reduce(t, op=dist.ReduceOp.MIN)
            common = int(t.item())
        common = max(common, 0)
        self.skip, self.offset = common, lag - common

    def __call__(self, args, kwargs):
        bound = self.sig.bind(*args, **kwargs)  # a wrong call fails as the function would
        arguments = bound.arguments
        if self.rt is None:
            self._start(arguments)
        rt = self.rt
        arg = arguments.get(self.names.get("epoch")) if "epoch" in self.names else None
        counting = (isinstance(arg, int) and isinstance(self.last_call_arg, int)
                    and arg > self.last_call_arg)
        self.last_call_arg = arg
        if self.skip and counting:
            self.skip -= 1
            return None  # the job trained this epoch before this process came (see _line_up)
        self.skip = 0
        ints = isinstance(arg, int) and not isinstance(arg, bool)
        # The job's epoch this call trains, as this process counts it; rank 0's is every
        # rank's after each resize (a small tracked object), and a joiner's comes with the state.
        self.position["arg"] = arg + self.offset if ints else arg
        try:
            next(self.epochs)  # the boundary before this epoch (none before the first)
        except StopIteration:
            print(f"gpurun (python, slot {rt.slot}): the job stops ({rt.stop_reason}): "
                  f"{self.fn.__name__}() ends the program with status 0", file=sys.stderr,
                  flush=True)
            raise SystemExit(0) from None
        job_arg = self.position["arg"]  # the job's: this process may have joined or been woken
        lag = job_arg - arg if ints and isinstance(job_arg, int) else 0
        for role, value in (("model", rt.model), ("data", self.loader), ("device", rt.device),
                            ("epoch", job_arg)):
            name = self.names.get(role)
            if name is not None and (role != "data" or value is not None):
                bound.arguments[name] = value

        def one_epoch():
            self._line_up(lag)  # first: a peer's death here is followed like one in training
            return self.fn(*bound.args, **bound.kwargs)

        result = _call_elastic(rt, self.fn, one_epoch, self.drop_on_error)
        if result is _JOB_ENDED:
            raise SystemExit(0)
        return result


def _say_how_it_runs(rt, name, config_path):
    """One line on rank 0 (of a static run; of an elastic job's start) when a decorated program
    runs static (why, and the command that makes it elastic), or when its ``config_path``
    (None: gpurun.elastic has none) is not the file gpurun watches."""
    watched = os.environ.get("GPURUN_CONFIG", "")
    if not rt.elastic:
        if rt.rank == 0:
            if os.environ.get("GPURUN_SLOT") is not None:
                why = "gpurun was started without --config"
            elif os.environ.get("TORCHELASTIC_RUN_ID"):
                why = "torchrun starts it"
            else:
                why = "no launcher started it"
            unwatched = f"{config_path} is not watched; " if config_path else ""
            print(f"gpurun: {name}() runs static, not elastic ({why}): {unwatched}run `gpurun "
                  f"--nproc N --config {config_path or 'config.toml'} {sys.executable} "
                  f"{sys.argv[0] or 'train.py'}` to resize it while it trains",
                  file=sys.stderr, flush=True)
        return
    # rank 0 of the start (its start record's; not a joiner): one line per job
    if (config_path and watched and rt.rank == 0 and not rt.joining
            and os.path.realpath(config_path) != os.path.realpath(watched)):
        print(f"gpurun: {name}(): config_path '{config_path}' is not gpurun's --config "
              f"'{watched}'; gpurun watches '{watched}' (edit that one, or start gpurun with "
              f"--config {config_path})", file=sys.stderr, flush=True)
