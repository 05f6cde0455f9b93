"""gpurun.Runtime: elastic data-parallel training for Python scripts under
``gpurun --config config.toml`` (docs/python.md). It speaks the same control protocol as the C++
worker runtime (docs/control-protocol.md): at each epoch boundary it reports to gpurun and
follows the decision: continue, exit, or a resize into a new generation (a new process group,
the model wrapped in DDP again, joiners given the current state by broadcast, a checksum
compared on every rank); a leaver exits (release mode) or parks (hold mode); a pause writes a
host snapshot that the resume reads.

Without gpurun's elastic environment (plain ``python3 train.py``, torchrun, or gpurun without
``--config``) it is a static data-parallel run: ``init_process_group("env://")`` when
WORLD_SIZE > 1, else a single process.
"""
import datetime
import gc
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

from . import _exit, _gloo_iface, _native, _snapshot
from ._checksum import StateMismatch, _state_digest, _word_sums_many
from ._comm import GroupLinks, is_comm_failure
from ._energy import StopReason, _Energy
from ._failed_step import _FailedStep
from ._group import _ProcessGroup, _destroy_group_at_exit
from ._iterations import _Iterations
from ._loader import _Loader
from ._model import ElasticModel
from ._pause_snapshot import _PauseSnapshot
from ._sampler import ElasticSampler
from ._tracked import _DictState, _Tracked
from ._warmup import _WarmUp


def _env_int(name, default=None):
    v = os.environ.get(name, "")
    if v == "":
        if default is None:
            raise RuntimeError(f"environment variable {name} is not set (is this worker "
                               "started by gpurun --config?)")
        return default
    try:
        return int(v)
    except ValueError:
        raise RuntimeError(f"environment variable {name}='{v}' is not an integer") from None


def _slots_and_device(standby):
    """(slot, local_slot, device) of this worker from its environment: ``slot`` is the job slot
    id that names its keys (GPURUN_SLOT, else LOCAL_RANK; node k's local slot i is k*1000+i),
    ``local_slot`` its slot on this node (GPURUN_LOCAL_SLOT, else ``slot``), which is CUDA
    device ``cuda:<local_slot>`` after CUDA_VISIBLE_DEVICES (docs/cli.md#worker-environment).
    Without gpurun (torchrun, plain python) a GPU is used when there is one. A standby (gpurun's
    [park] standby) touches no CUDA here: its device is set up at its first use."""
    slot = _env_int("GPURUN_SLOT", _env_int("LOCAL_RANK", 0))
    local_slot = _env_int("GPURUN_LOCAL_SLOT", slot)
    wanted = os.environ.get("GPURUN_DEVICE", "")
    if (standby and wanted == "cuda") or (
            not standby and wanted in ("cuda", "") and torch.cuda.is_available()):
        return slot, local_slot, torch.device("cuda", local_slot)
    return slot, local_slot, torch.device("cpu")


class Runtime(_ProcessGroup, _PauseSnapshot, _Iterations, _Tracked, _Energy, _FailedStep):
    """One per process. Attributes: ``rank``, ``world_size``, ``generation`` (int),
    ``device`` (torch.device), ``model`` (``ElasticModel``: the tracked model as the current
    generation trains it, in DDP when the world has more than one rank; one object for the
    whole job), ``epoch`` (int, the epoch being trained), ``stop_reason`` (``StopReason``, a
    str: None while the job runs, then why the loops ended: "completed", "stopped" (this rank's
    ``stop()``) or gpurun's exit reason: "finished", "stop", "early_stop", ...; with gpurun's
    sentence and an early stop's predicted cost: docs/python.md#energy).

    Energy (docs/python.md#energy): ``energy()``, ``begin_window(name)`` /
    ``end_window(name)`` and ``with energy_window(name) as m:`` (Zeus' shape), answered by
    gpurun's energy monitor.

    At every generation (the start and each resize) the process's ``os.environ`` says the
    generation's ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``,
    ``GROUP_RANK``, ``ROLE_RANK``, ``ROLE_WORLD_SIZE`` (docs/cli.md#worker-environment).

    Raises RuntimeError under gpurun --config when ``torch.distributed`` is already
    initialized (the runtime makes every process group; remove the program's
    ``init_process_group()``).

    ``drop_on_error``: under gpurun --config, an exception of the program that ends this
    process fails the whole job, as under torchrun (gpurun is told before the process exits);
    True: gpurun goes on without this rank instead, as after a crash."""

    def __init__(self, backend=None, drop_on_error=False):
        self.elastic = os.environ.get("GPURUN_ELASTIC") == "1"
        if self.elastic and dist.is_available() and dist.is_initialized():
            raise RuntimeError(
                "gpurun: torch.distributed is already initialized (the program called "
                "init_process_group() before gpurun.Runtime() or its decorator's first call); "
                "under gpurun --config gpurun makes each generation's process group itself: "
                "remove the program's init_process_group() call (and destroy_process_group() at "
                "the end); the rank and world size are then rt.rank and rt.world_size, or "
                "RANK and WORLD_SIZE in os.environ")
        # A standby (gpurun's [park] standby) touches no CUDA until a config names its slot:
        # its device is set up by the first use of ``device`` (docs/python.md#standby).
        standby = self.elastic and os.environ.get("GPURUN_STANDBY") == "1"
        # slot: the job slot id (keys, messages); local_slot: this node's, the CUDA device index
        self.slot, self.local_slot, self._device = _slots_and_device(standby)
        self._device_pending = True  # _set_up_device(): now, or at a standby's first use
        self._warm = None  # _WarmUp: the CUDA libraries set up beside the program's start
        self._standby = standby
        if not standby:
            self._set_up_device()
        self.backend = backend or ("nccl" if self._device.type == "cuda" else "gloo")
        self.comm_timeout = datetime.timedelta(
            milliseconds=_env_int("GPURUN_COMM_TIMEOUT_MS", 300_000))
        self.rank, self.world_size, self.generation = 0, 1, 0
        self.epoch, self.max_epochs = 0, 0
        self._ddp = None  # the current generation's DistributedDataParallel (None: world 1)
        self._module, self._optimizer, self._others = None, None, {}
        self._model_view = ElasticModel(self)
        self.stop_reason = None
        self._stop_asked = False  # stop(): this rank's loop ends at its next boundary
        self._small_pending = False  # a new generation's set-up: adopt rank 0's small objects
        self.grad_accum, self._micro_seed, self._iteration_form = None, 0, False
        self._sampler = None
        self._started = False
        self._pg_store = None
        self._links = GroupLinks()  # the current gloo group's TCP connections (_comm)
        self._receive_reserve = None  # a CPU warm joiner's handoff buffers (_snapshot)
        self._warned = set()
        self._steps_done = 0  # steps of the current epoch done (the position of a report)
        self._init_failed_step()  # a peer's death inside a step (_failed_step.py)
        self.global_batch = 0  # [batch] global in force (0: batch_size x world_size)
        self.every_steps = 0   # [boundary] every: 0 = at epoch ends, N = every N steps
        self._finishing = False
        self._jumped = False
        self._uses_steps = False
        # Preemption (docs/cli.md#preemption): gpurun's warning signal (save a checkpoint at
        # this boundary) and its stop request (the loops ended at a boundary: save and exit).
        self.checkpoint_requested = False
        self.stop_requested = False
        self._global_step = 0
        self._progress = None
        if os.environ.get("GPURUN_PROGRESS_FILE") and os.environ.get("GPURUN_WORKER_LIBRARY"):
            self._progress = _native.Progress()  # steps for gpurun's power-limit profiler
        if self.elastic and os.environ.get("GPURUN_GC_FREEZE", "1") != "0":
            # What is alive now (imports, torch's own objects, the data loaded so far) goes to
            # the collector's permanent generation, so that a hold-mode park's gc.collect()
            # scans only what was made since (the model, the wrappers): ViT-H on an H200, that
            # pass took 175 ms of the park before. GPURUN_GC_FREEZE=0 turns it off. The files
            # left open are flushed at the end, which finalizes nothing frozen (_exit.py).
            _exit.freeze_and_flush_at_exit()
        if self.elastic:
            _exit.fast_exit_enabled()  # a bad GPURUN_LEAVER_EXIT fails here, not at a leave
            # gpurun's worker engine (its C library): the control protocol's every rule; this
            # package only executes its actions with torch.
            self._session = _native.Session()
            # Under Slurm, slurmstepd's SIGTERM reaches this process too: it must wait for
            # gpurun's stop at the next boundary rather than end here with the state.
            if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
                _native.install_term_handler()
            # The pause snapshot's host side is the C++ runtime's (paths, file, commit, XXH64),
            # through the library; this package copies the tensors (docs/python.md#snapshots).
            self._snap = _snapshot.SnapshotIo(self._device)
            self._prepare = None  # the background preparation of the snapshot file
            self._prepare_wanted = os.environ.get("GPURUN_SNAPSHOT_PREPARE", "1") != "0"
            self._parked = []  # hold mode: (tensor, shape) whose device storage was freed
            self._drive({"event": "open"})  # a joiner reads its generation's start record
            if not drop_on_error:
                _report_program_errors(self._session)
        info = self._session.info() if self.elastic else None  # the engine after "open"
        # True when the tracked state is overwritten before the first step (a joiner of a
        # running job, a warm joiner, a rank other than 0 at a start): its model needs no
        # random initialisation (skip_init()). Same rule as the C++ runtime's joining().
        self.joining = (info["joining"] if self.elastic
                        else _env_int("WORLD_SIZE", 1) > 1 and _env_int("RANK", 0) != 0)
        # Before the first generation is set up, rank and world are the start record's (a
        # worker of a start or a joiner of a known generation), else the environment's: a
        # program's `if rt.rank == 0:` before its loop picks one rank (a warm joiner or a
        # standby learns its rank at its admission).
        if info is not None and info["rank"] >= 0:
            self.rank, self.world_size = info["rank"], info["world_size"]
        elif not self.elastic:
            self.rank, self.world_size = _env_int("RANK", 0), _env_int("WORLD_SIZE", 1)
        elif self._standby or info["warm"]:
            # not a member yet (told at its admission): no rank, the spawn's world size
            self.rank, self.world_size = -1, _env_int("WORLD_SIZE", 1)
        if self.elastic and info["warm"] and not standby and self._snap.files:
            self._start_premap()

    @property
    def device(self):
        """The torch.device for the model and batches (cuda:<slot> under gpurun --device cuda,
        else CPU). A standby blocks in its first use until a config names its slot, then sets
        up CUDA: what the program does before (imports, data, a model skeleton under
        ``skip_init()``) runs while its GPU stays free. A standby told to exit ends the
        process here (status 0)."""
        if self._device_pending:
            self._set_up_device()
        return self._device

    def _set_up_device(self):
        self._device_pending = False
        if self._standby:
            print(f"gpurun (python, slot {self.slot}): standby: waiting for a config that names "
                  "this slot (no CUDA context yet)", file=sys.stderr, flush=True)
            self._standby_ahead()
            t0 = time.perf_counter()
            self._drive({"event": "device"})  # waits for gpurun's go (or exits here)
            print(f"gpurun (python, slot {self.slot}): standby told to go after "
                  f"{time.perf_counter() - t0:.1f} s; setting up {self._device}",
                  file=sys.stderr, flush=True)
            if self._device.type == "cuda" and not torch.cuda.is_available():
                raise RuntimeError(f"GPURUN_DEVICE=cuda but torch sees no CUDA device (slot "
                                   f"{self.slot}'s {self._device}; CUDA_VISIBLE_DEVICES="
                                   f"{os.environ.get('CUDA_VISIBLE_DEVICES', '(unset)')})")
            if self._snap.files:
                self._start_premap()
        if self._device.type == "cuda":
            torch.cuda.set_device(self._device)
            if self.elastic:
                self._warm = _WarmUp(self._device, self.slot)

    @property
    def model(self):
        """The tracked model as the current generation trains it (``ElasticModel``; None before
        ``track(model=...)``): calls and attributes go to this generation's DDP wrapper (world
        > 1) or the module (world 1). The same object for the whole job: ``model = rt.model``
        may be taken once, before the loop. ``rt.model.module`` is the plain module."""
        return self._model_view if self._module is not None else None

    # ---- what moves with the state ----------------------------------------------------
    def track(self, model=None, optimizer=None, scheduler=None, **others):
        """Registers the training state. ``model`` (torch.nn.Module) is moved to
        ``self.device``; every value needs ``state_dict()``/``load_state_dict()``. The
        sampler position and the epoch move with it. RNG streams are per slot, not part of
        the state (moving one rank's RNG to another would make their dropout and augmentation
        equal): seed each rank yourself; a slot that leaves and comes back — a new process in
        release mode, a pause and resume — goes on with its own streams where it left them
        (torch CPU, its CUDA device's, Python ``random``, numpy's global; kept in gpurun's
        store). Several calls add up. Returns self.

        ``others`` may also be plain dicts (``rt.track(stats={"best_val_loss": inf})``): their
        contents are the state, replaced in place. An object whose state holds no tensor over
        64 KiB (a dict of numbers, a scheduler, a step counter) is *small*: rank 0 writes it to
        gpurun's store at each boundary and at every resize every rank of the new generation
        loads that copy, continuing ranks too, so values only rank 0 computes (a best
        validation loss) survive a change of rank 0. Raises TypeError for a
        value without ``state_dict()``/``load_state_dict()`` that is not a dict."""
        if isinstance(model, torch.nn.parallel.DistributedDataParallel):
            model = model.module  # the runtime wraps it anew for each generation
        if model is not None:
            if any(t.is_meta for t in model.parameters()) or any(
                    t.is_meta for t in model.buffers()):
                # built under skip_init(): storage on the device, values from the handoff
                model = model.to_empty(device=self.device)
            self._module = model.to(self.device)
        if optimizer is not None:  # a later call adds to what is tracked, it replaces nothing
            self._optimizer = optimizer
            if self.elastic:
                self._guard_step(optimizer)  # nothing in a failed step
        if scheduler is not None:
            others["scheduler"] = scheduler
        for k, v in list(others.items()):
            if isinstance(v, dict):
                others[k] = _DictState(v)
            elif not (hasattr(v, "state_dict") and hasattr(v, "load_state_dict")):
                raise TypeError(f"Runtime.track(): {k}={type(v).__name__} has no state_dict() / "
                                "load_state_dict() (track a dict, or an object with both)")
        self._others.update(others)
        return self

    @property
    def state(self):
        """The worker state (str: ACTIVE, OFFLOADING, PARKED, REJOINING, EXITED;
        docs/control-protocol.md#slot-states): the engine's, always ACTIVE in a static run."""
        return self._session.info()["state"] if self.elastic else "ACTIVE"

    def skip_init(self):
        """A context manager for building the model: when this rank is ``joining`` (its state
        is overwritten by the handoff or the pause snapshot before its first step), modules
        made inside it get no random initialisation — their tensors are on torch's meta
        device (no storage, no compute) and ``track(model=...)`` gives them empty storage on
        ``self.device``. Build the optimizer after ``track()`` then (the parameters are new
        objects). Otherwise (rank 0 of a start, a static run, torch < 2.0: no device context)
        it does nothing. ViT-H: its ~630 M parameters' CPU initialisation is skipped."""
        import contextlib
        if self.joining and hasattr(torch.device("cpu"), "__enter__"):
            return torch.device("meta")
        return contextlib.nullcontext()

    def _state(self):
        s = {"position": {"epoch": self.epoch, "step": self._steps_done,
                          "sampler": self._sampler.state_dict() if self._sampler else None}}
        if self._module is not None:
            s["model"] = self._module.state_dict()
        if self._optimizer is not None:
            s["optimizer"] = self._optimizer.state_dict()
        for k, v in self._others.items():
            s["other." + k] = v.state_dict()
        return s

    def _load(self, s, owned=False):
        """Takes state ``s`` (``_state()``'s layout). ``owned``: its tensors are this rank's alone
        (a handoff's, just received): the optimizer keeps them rather than copying them."""
        self.epoch = int(s["position"]["epoch"])
        self._steps_done = int(s["position"].get("step", 0))
        if self._sampler and s["position"]["sampler"]:
            self._sampler.load_state_dict(s["position"]["sampler"])
        if self._module is not None:
            self._module.load_state_dict(s["model"])
        if self._optimizer is not None:
            if owned:
                _snapshot.load_optimizer_owned(self._optimizer, s["optimizer"])
            else:
                self._optimizer.load_state_dict(s["optimizer"])
        for k, v in self._others.items():
            v.load_state_dict(s["other." + k])

    def checksum(self):
        """A 64-bit hash (int) of the model's and the optimizer's tensors and the position:
        equal on every rank after each start and resize. Blocks: one device->host copy per
        device.

        Per tensor, on the tensor's own device: its bytes as int32 words w_i (the last one
        zero-padded), S = sum(w_i) and P = sum((i+1) * w_i) modulo 2^64 (the C++ runtime's
        per-tensor sums, worker_runtime/src/state/state_checksum.hpp: exact integers, so CPU
        and CUDA agree); then BLAKE2b (8 bytes) over the names, shapes, dtypes, S, P and the
        non-tensor values. Not cryptographic: it detects divergence, not tampering.

        The sums are taken as the C++ runtime takes them (_word_sums_many): per device, the
        tensors' words in chunks of _CHUNK_WORDS words (128 MiB of state; _CPU_CHUNK_WORDS on
        the CPU), about ten operations per chunk instead of per tensor. Temporary device memory:
        one chunk's two int64 prefix sums (16 bytes per word, 512 MiB) plus the copy of its
        words that packs it (4 bytes per word). CPU tensors: one pass over their bytes in
        blocks of 1 Mi words (_cpu_word_sums; 8 MiB of temporary memory), the same sums."""
        with torch.no_grad():
            return _state_digest(self._state(), _word_sums_many)

    # ---- data -----------------------------------------------------------------------
    _LOADER_KWARGS = ("collate_fn", "num_workers", "pin_memory", "worker_init_fn",
                      "prefetch_factor", "timeout", "multiprocessing_context")

    def loader(self, dataset, batch_size, seed=0, shuffle=True, **dataloader_kwargs):
        """Per-rank batches of ``batch_size`` from ``dataset``, dealt by gpurun's elastic
        sampler: one step takes batch_size × world_size samples of the epoch's permutation,
        so every sample is trained exactly once per epoch across resizes. Iterate it once
        per epoch inside ``epochs()``.

        ``dataloader_kwargs``: ``collate_fn``, and for worker processes ``num_workers``,
        ``pin_memory``, ``worker_init_fn``, ``prefetch_factor``, ``timeout``,
        ``multiprocessing_context`` (torch.utils.data.DataLoader's meaning). With
        ``num_workers`` > 0 a DataLoader reads the windows up to the next possible boundary
        (the epoch's end, or the next ``[boundary] every`` step) and ends, its workers with
        it, before that boundary: prefetching never runs past a resize. Anything else
        (``sampler``, ``shuffle``, ``batch_size``, ``persistent_workers``, ...) is refused:
        the elastic sampler decides the batches."""
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
            raise ValueError(f"Runtime.loader(): batch_size must be an int >= 1, not {batch_size!r}")
        if self._sampler is not None:
            raise RuntimeError(
                "Runtime.loader() was called a second time: the loader's position is part of "
                "the elastic state and one Runtime has one (a second would move the first's); "
                "make the training loader once, before epochs(), and use a plain "
                "torch.utils.data.DataLoader for validation")
        unknown = sorted(set(dataloader_kwargs) - set(self._LOADER_KWARGS))
        if unknown:
            raise TypeError(f"Runtime.loader(): unsupported argument(s) {', '.join(unknown)} "
                            f"(supported: {', '.join(self._LOADER_KWARGS)}; the elastic "
                            "sampler decides the batches)")
        workers = dataloader_kwargs.get("num_workers", 0)
        if not isinstance(workers, int) or workers < 0:
            raise ValueError(f"Runtime.loader(): num_workers must be an int >= 0, not {workers!r}")
        self._sampler = ElasticSampler(len(dataset), seed=seed, shuffle=shuffle)
        return _Loader(self, dataset, batch_size, dataloader_kwargs)

    # ---- the epoch loop ---------------------------------------------------------------
    def epochs(self, n=None):
        """Yields the epochs to train (int, from the current state's epoch up to n-1; ``None``:
        until the job stops, ``stop_reason`` says why); a boundary follows each but the last. A
        leaver in release mode exits the process (exit status 0) from inside this loop."""
        if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n < 0):
            raise ValueError(f"Runtime.epochs(): n must be an int >= 0 or None, not {n!r}")
        if self._iteration_form:
            raise RuntimeError("Runtime.epochs() on a Runtime that runs iterations(): use one "
                               "form per Runtime")
        n = sys.maxsize if n is None else n
        self.max_epochs = n
        self._ensure_started()
        while self.epoch < n and not self._finishing:
            if self._sampler and self._sampler.epoch != self.epoch:
                self._sampler.set_epoch(self.epoch)
            if not self._sampler or self._sampler.cursor == 0:
                self._steps_done = 0
            # no step in flight yet (a loop left by `break` leaves its last step's marks)
            self._stepped, self._in_step = False, None
            yield self.epoch
            if self._finishing:  # a step boundary's decision: the job is finishing
                return
            if self._step_failure is not None:
                # A collective of the runtime's failed outside the loader's steps (which recover
                # their own): after gpurun's decision the epoch goes on from the state's position.
                if not self._recover_step():
                    return
                self._jumped = False
                continue
            if self._jumped:  # rejoined (hold mode) at another position: go on from there
                self._jumped = False
                continue
            finished = self.epoch
            self.epoch += 1
            if self._stop_asked:
                return self._stop_here()
            if self._sampler:
                self._sampler.set_epoch(self.epoch)
            self._steps_done = 0
            if self.epoch < n and not self._boundary(finished, 0):
                return
            self._jumped = False  # the loop goes on from the position this boundary left
        if not self._finishing:
            self.stop_reason = StopReason("completed")

    def stop(self):
        """Ends this rank's loop at its next boundary — the end of the epoch in ``epochs()``
        (so in ``gpurun.elastic``), the next multiple of ``every`` in ``iterations()``, the next
        call in the gpud form — without reporting there (``stop_reason`` = "stopped"). When
        this process then ends, gpurun finishes the job: the other ranks' loops end at their
        next boundary (their ``stop_reason``: "finished"). Call it on one rank (a target
        metric reached on rank 0) or on all. Does not block."""
        self._stop_asked = True

    def _stop_here(self):
        """At a boundary after stop(): the loop ends here, this rank reports nothing."""
        self._finishing = True
        self.stop_reason = StopReason("stopped")
        print(f"gpurun (python, slot {self.slot}): the program asked to stop (Runtime.stop()): "
              "its loop ends at this boundary; the other ranks end at their next one",
              file=sys.stderr, flush=True)

    def _ensure_started(self):
        if self._started:
            return
        self._started = True
        self.device  # a standby that never asked for its device waits for its go here
        if not self.elastic:
            return self._start_static()
        if os.environ.get("GPURUN_WARM") and self.device.type == "cpu":
            # A warm joiner's handoff buffers, written now rather than faulted in by the
            # receive with every peer waiting (_snapshot.reserve_receive).
            self._receive_reserve = _snapshot.reserve_receive(self._state(), self._optimizer)
        self._drive({"event": "ready"})

    def _start_static(self):
        world = _env_int("WORLD_SIZE", 1)
        if dist.is_available() and dist.is_initialized():  # the program made the group itself
            world = dist.get_world_size()
            self.rank, self.world_size = dist.get_rank(), world
        elif world > 1:
            _destroy_group_at_exit()
            # Gloo: listen where the other nodes reach this one (_gloo_iface).
            with _gloo_iface.listening_towards(
                    _gloo_iface.store_host() if self.backend == "gloo" else None):
                dist.init_process_group(self.backend, timeout=self.comm_timeout)
        if world > 1:
            self.rank, self.world_size = dist.get_rank(), world
            self._broadcast_state(0)
            self._verify(0, "after the start")
        self._wrap()

    # ---- protocol: the engine's actions, executed with torch ------------------------------
    def _drive(self, event):
        """Feeds ``event`` to gpurun's worker engine and executes the actions it returns,
        feeding each outcome back, until the engine waits for the program; returns the last
        action (``train`` or ``exit``; None when there was none). A release-mode leaver, a
        warm joiner not needed and a rank told to exit while parked end the process here
        (exit status 0)."""
        last = None
        while True:
            actions = self._session.on(event)
            event = None
            for a in actions:
                last = a
                event = self._execute(a)
            if event is None:
                break
        if last is not None and last["action"] == "exit":
            if last["left"]:
                self._join_prepare()  # a standby's early mapping: not torn down under exit
                _exit.leave()  # status 0; the interpreter's teardown skipped (_exit.py)
            self._finishing = True
            self.checkpoint_requested = False
            self.stop_requested = bool(last.get("stop"))
            self.stop_reason = self._stop_detail(_stop_reason(last))
        return last

    def _failed(self, err):
        """The outcome of an action that failed because a peer died (or raise: the program's
        own error)."""
        if not is_comm_failure(err):
            raise err
        self._links.sever()  # peers blocked on this rank fail now, not at the comm timeout
        return {"event": "failed", "text": str(err).strip()[:300], "epoch": self.epoch,
                "step": self._steps_done}

    def _execute(self, a):
        kind = a["action"]
        if kind == "state":
            if a["from"] == "PARKED" and a["to"] == "REJOINING":
                self._unpark()  # the state itself comes from the source or the snapshot
            return None
        if kind in ("log", "train", "exit"):
            if kind == "train":
                self._receive_reserve = None  # a warm joiner that received no state
                self._train(a)
            return None
        if kind == "drop_group":
            self._destroy_group()
            return None
        try:
            if kind == "make_group":
                if a.get("purpose") == "train":
                    self._small_pending = True  # a new generation: rank 0's small objects
                self._make_group(a["prefix"], a["abort_key"], a["group"], a["rank"])
                return {"event": "done"}
            if kind == "broadcast_state":
                return {"event": "done",
                        "bytes": self._broadcast_state(a["root"], load=a["receive"])}
            if kind == "verify_state":
                self._adopt_small()
                self._verify(a["root"], a["text"])
                return {"event": "done"}
        except RuntimeError as e:
            return self._failed(e)
        if kind == "write_snapshot":
            return {"event": "done", "text": self._write_snapshot()}
        if kind == "read_snapshot":
            return {"event": "done", "bytes": self._read_snapshot(a["epoch"], a["step"])}
        if kind == "release":
            self._ddp = None
            self._save_rng()
            return {"event": "done"}
        if kind == "park":
            self._ddp = None
            self._save_rng()
            self._offload()  # hold: the tensors go to host memory; a joiner gets the state anew
            return {"event": "done"}
        raise _native.ProtocolError(f"gpurun's worker engine asked for an unknown action {a!r}")

    def _train(self, a):
        """Training goes on in the generation the engine says (rank, world, settings)."""
        self.generation, self.rank, self.world_size = a["generation"], a["rank"], a["world_size"]
        _set_generation_env(a)
        self.global_batch = int(a["global_batch"])
        self.every_steps = int(a["every_steps"])
        self.checkpoint_requested = bool(a["checkpoint"])
        if a["kind"] == "continue":
            self._start_prepare()  # (epochs() alone: the first boundary; done once)
        if a["kind"] != "continue":
            self._adopt_small()
            if self._warm is not None:
                self._warm = self._warm.finish()
            try:
                self._wrap()  # DDP's own broadcast and shape check: the new group's first use
            except RuntimeError as e:
                if not is_comm_failure(e):
                    raise
                # A peer died there: as a failed collective at this boundary (gpurun decides
                # again without it; the engine's next train action has run when this returns).
                self._recover(e)
                return
            if a["role"] == "joiner":
                self._restore_rng()
        if a["jumped"]:
            self._jumped = True  # its position is the state's, not where it parked

    def steps(self, loader):
        """The epoch's optimizer steps (use inside ``epochs()``), for ``[batch] global``:
        each step is ``[batch] global`` samples over all ranks (else
        ``batch_size × world_size``), this rank's share cut into micro-batches of at most
        ``batch_size``. Iterating a step yields ``(batch, weight)``; backward
        ``loss * weight`` (``loss`` the mean over the micro-batch) for each, then step the
        optimizer once: the gradient is then the mean over the step's samples whatever the
        world size (weight = len(micro-batch) × world_size / samples of the step; DDP
        averages over ranks). All but the last micro-batch run under DDP's ``no_sync``."""
        self._uses_steps = True
        return loader._steps()

    @property
    def step(self):
        """Optimizer steps of the current epoch done so far (int, counted by ``loader``)."""
        return self._steps_done

    def _recover(self, err):
        """After a failed collective: drop the group, report at once at this position (the
        epoch and its step), follow gpurun's decision (a resize without the failed rank).
        Returns False when the job is finishing. (gpurun's engine prints why.)"""
        self._links.sever()  # peers blocked on this rank fail now, not at the comm timeout
        before = self.epoch
        self._drive({"event": "collective_failed", "text": str(err).strip()[:300],
                     "epoch": self.epoch, "step": self._steps_done})
        if self.epoch != before:
            # A survivor a step ahead handed this rank its state (docs/python.md#failures):
            # the position is the state's, in the next epoch (C++: after_join).
            self._jumped = True
        return not self._finishing

    def _warn_direct_iteration(self):
        """Rank 0, once: ``[batch] global`` is in force but the loader is iterated directly."""
        if self.global_batch and "global_batch" not in self._warned and self.rank == 0:
            self._warned.add("global_batch")
            print(f"gpurun (python, slot {self.slot}): warning: [batch] global = "
                  f"{self.global_batch} is kept only through Runtime.steps(loader); iterating "
                  "the loader directly keeps each rank's batch size (docs/python.md#limits)",
                  file=sys.stderr, flush=True)

    def _boundary(self, epoch, step):
        """A boundary at (epoch, step): report and follow gpurun's decision. False when the
        job is finishing."""
        if not self.elastic:  # a static run: nothing is decided at a boundary
            return True
        self._publish_small()
        self._drive({"event": "boundary", "epoch": epoch, "step": step})
        return not self._finishing

    def _after_step(self):
        """Called by the loader after each step: a step boundary when ``[boundary] every``
        says so and the epoch is not over. False when this epoch's iteration must end (the
        job is finishing, or this rank rejoined at another position)."""
        self._count_step()
        s = self._sampler
        if not (self.elastic and self.every_steps > 0 and self._steps_done % self.every_steps == 0
                and s.remaining() >= self.world_size):
            return True
        return self._boundary(self.epoch, self._steps_done) and not self._jumped

    def _count_step(self):
        """One optimizer step done: published for gpurun's power-limit profiler; after the
        first, the pause snapshot's file is prepared in the background."""
        self._global_step += 1
        self._stepped = False  # the next step's optimizer update is still to come
        if self._progress is not None:
            self._progress.step(self._global_step)  # gpurun's power-limit profiler reads it
        if self._global_step == 1 and self.elastic:
            self._start_prepare()

    def _note(self, text):
        print(f"gpurun (python, slot {self.slot}): note: {text}", file=sys.stderr, flush=True)

    def _offload(self):
        """A parked rank keeps no tensor on its GPU: the model's parameters and buffers keep
        their objects (the optimizer still refers to them) but their device storage is freed,
        the optimizer's state and the gradients are dropped (a rejoin gets the whole state
        anew: from the source, or from the pause snapshot), unreachable objects are
        collected, the cuBLAS workspaces dropped and torch's CUDA cache emptied (the CUDA
        context stays). What torch still holds is printed (MiB): tensors the training code
        itself keeps (its last batch, outputs) stay on the GPU."""
        if self.device.type != "cuda":
            return
        t0 = time.perf_counter()
        if self._module is not None:
            for p in self._module.parameters():
                p.grad = None
            for t in list(self._module.parameters()) + list(self._module.buffers()):
                if t.device.type == "cuda" and t.numel():
                    self._parked.append((t, t.shape))
                    t.data = torch.empty(0, dtype=t.dtype, device=t.device)
        if self._optimizer is not None:
            self._optimizer.state.clear()
        t1 = time.perf_counter()
        gc.collect()
        t2 = time.perf_counter()
        # cuBLAS/cuBLASLt workspaces are caching-allocator blocks too; a live one can sit in a
        # segment of GBs (split from a freed one) and keep all of it reserved.
        if hasattr(torch._C, "_cuda_clearCublasWorkspaces"):
            torch._C._cuda_clearCublasWorkspaces()
        torch.cuda.empty_cache()
        t3 = time.perf_counter()
        held = torch.cuda.memory_allocated(self.device)
        print(f"gpurun (python, slot {self.slot}): parked (hold mode); torch still holds "
              f"{held / 2**20:.0f} MiB allocated, {torch.cuda.memory_reserved(self.device) / 2**20:.0f} "
              f"MiB reserved on {self.device} (group destroyed in "
              f"{getattr(self, '_destroy_ms', 0):.0f} ms, freed in {(t1 - t0) * 1e3:.0f} ms, gc "
              f"{(t2 - t1) * 1e3:.0f} ms, cache emptied in {(t3 - t2) * 1e3:.0f} ms)",
              file=sys.stderr, flush=True)

    def _unpark(self):
        """Hold mode, rejoining: the parked tensors get device storage again (uninitialised:
        the state that follows fills them)."""
        for t, shape in self._parked:
            t.data = torch.empty(shape, dtype=t.dtype, device=t.device)
        self._parked = []

    def _store(self):
        """This process's client of gpurun's store (torch's TCPStore), made at its first use:
        the process groups' rendezvous and the small objects' key."""
        if self._pg_store is None:
            # A peer that dies after the arrival wait holds up torch's own rendezvous: gpurun
            # then closes this connection (docs/control-protocol.md#failures-during-a-resize,
            # abandoned keys). The store's timeout (_RENDEZVOUS_TIMEOUT, at most the comm
            # timeout) bounds the waits that keep it (torch 1.13's gloo waits with the
            # group's timeout).
            self._pg_store = dist.TCPStore(
                os.environ["GPURUN_STORE_ADDR"], _env_int("GPURUN_STORE_PORT"), is_master=False,
                timeout=min(self.comm_timeout, _RENDEZVOUS_TIMEOUT))
        return self._pg_store


def _stop_reason(exit_action):
    """Runtime.stop_reason from the engine's exit action: gpurun's reason code (the exit
    decision's ``reason``: "stop", "early_stop", "finished", ...) or, where it has none (an
    exit wake whose reason gpurun does not know), "stop" after a stop request and "finished"
    otherwise."""
    reason = exit_action.get("reason") or ""
    if reason:
        return reason
    return "stop" if exit_action.get("stop") else "finished"


def _set_generation_env(train_action):
    """os.environ (and so the C environ: os.environ calls putenv) says the generation's
    place: the engine's ``env`` of the train action (control::generation_env, gpurun's one rule,
    shared with the C++ runtime and the supervisor's spawn environment)."""
    for k, v in (train_action.get("env") or {}).items():
        os.environ[k] = str(v)


# How long torch's rendezvous of a new group may wait once every rank arrived (s): the ranks
# go straight from _arrive() into init_process_group, so only a peer that died in between
# waits this long.
_RENDEZVOUS_TIMEOUT = datetime.timedelta(seconds=30)


def _report_program_errors(session):
    """Wraps sys.excepthook (once per process): an uncaught exception other than a peer's
    failure is told to gpurun (the engine's program_error event) before Python prints it and
    exits, so that gpurun fails the job rather than going on without this rank."""
    if getattr(sys.excepthook, "_gpurun", False):
        return
    previous = sys.excepthook

    def hook(kind, value, tb):
        if not (isinstance(value, (SystemExit, StateMismatch)) or is_comm_failure(value)):
            try:
                session.on({"event": "program_error",
                            "text": _exit.program_error_text(kind, value)})
            except Exception:  # noqa: BLE001 - the exit itself still ends the process
                pass
        previous(kind, value, tb)
        if is_comm_failure(value):
            print(f"gpurun (python, slot {os.environ.get('GPURUN_SLOT', '?')}): a collective "
                  "the program called itself failed because a peer died or hung (the error "
                  "above): the runtime recovers from the collectives it makes (rt.model's "
                  "forward and backward, its boundaries) and from any inside a gpurun.elastic "
                  "function, not from one in a loop body; this process ends and gpurun goes on "
                  "without it (docs/python.md#failures)", file=sys.stderr, flush=True)

    hook._gpurun = True
    sys.excepthook = hook
