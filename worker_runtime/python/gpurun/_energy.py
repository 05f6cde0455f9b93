"""Energy from the program's side (docs/python.md#energy): ``rt.energy()``, named windows in
Zeus' shape (``begin_window``/``end_window``, ``with rt.energy_window(name)``) and the detail of
``rt.stop_reason``. gpurun's supervisor owns NVML and its energy monitor (docs/energy.md); a
worker reads no GPU counter, it asks gpurun through the job's store
(docs/control-protocol.md#energy-questions) and gets the monitor's own figures: an epoch's
joules are the ``energy_epoch`` event's, to the digit.

Zeus' names (zeus.monitor.ZeusMonitor, Measurement): ``begin_window(name)``,
``end_window(name)``, a ``Measurement`` with ``time`` (s), ``gpu_energy`` ({gpu: J}) and
``total_energy`` (J). Zeus' knobs are gpurun's ``[energy]`` keys: η is ``eta_knob``, β is
``cost_threshold_factor`` (docs/energy.md#cost-zeus).
"""
import contextlib
import sys
import time

# How long a question waits for gpurun's answer (s): a window's end is answered one monitor
# reading after it (0.1 s by default); gpurun gives up on one after 10 s.
_ANSWER_TIMEOUT_S = 30.0


class EnergyUnavailable(RuntimeError):
    """gpurun could not answer an energy question (the job's store is gone, no answer in
    time, or a window that was not begun). Monitoring that is off is no error: ``energy()``
    and ``end_window()`` return None then, and ``Runtime.energy_unavailable`` says why."""


class Measurement:
    """One energy window (Zeus' ``Measurement``): ``time`` (s, float), ``gpu_energy``
    ({GPU slot: J}, the job's GPUs of this node active at the window's end), ``total_energy``
    (J, their sum); also ``name`` and ``rank`` (the rank that measured it)."""

    def __init__(self, name, rank, time_s, gpu_energy):
        self.name, self.rank, self.time, self.gpu_energy = name, rank, time_s, gpu_energy

    @property
    def total_energy(self):
        return sum(self.gpu_energy.values())

    def __repr__(self):
        return (f"Measurement(name={self.name!r}, rank={self.rank}, time={self.time:.3f}, "
                f"gpu_energy={self.gpu_energy!r})")


class EnergyReading:
    """``Runtime.energy()``: the energy monitor's figures at the time of the call.

    ``seconds`` (s since the job started), ``gpu_energy`` ({GPU slot: J} charged to the job
    so far) and ``total_energy`` (J); ``epoch`` (the epoch being trained, from 0),
    ``epoch_gpu_energy`` and ``epoch_energy`` (J of it so far); ``epochs``: every finished
    epoch's record, a dict with the ``energy_epoch`` event's fields (``epoch``, ``seconds``,
    ``energy_j``, ``gpu_energy_j``, ``cost``, ``cost_total``, ``predicted_next_cost``,
    ``threshold``, …; docs/energy.md#events). Charged means what the monitor charges: a GPU's
    energy only while it trains in the job (parked, paused, lent GPUs cost nothing)."""

    def __init__(self, answer):
        gpus = answer.get("gpus", [])
        self.seconds = float(answer.get("seconds", 0))
        self.gpu_energy = {int(g["slot"]): float(g["job_j"]) for g in gpus}
        self.total_energy = float(answer.get("job_j", 0))
        self.epoch = int(answer.get("epoch", 0))
        self.epoch_gpu_energy = {int(g["slot"]): float(g["epoch_j"]) for g in gpus}
        self.epoch_energy = float(answer.get("epoch_j", 0))
        self.epochs = list(answer.get("epochs", []))

    def __repr__(self):
        return (f"EnergyReading(seconds={self.seconds:.1f}, total_energy={self.total_energy:.1f}, "
                f"epoch={self.epoch}, epoch_energy={self.epoch_energy:.1f}, "
                f"epochs={len(self.epochs)})")


class StopReason(str):
    """``Runtime.stop_reason``: a str equal to the reason code ("completed", "stopped",
    "finished", "stop", "early_stop", "state_lost", "failed"; docs/python.md#energy), the
    same on every rank, with gpurun's detail where it has one: ``text`` (gpurun's sentence),
    for "early_stop" ``predicted_cost_j`` (the total Zeus cost predicted after one more epoch,
    J), ``cost_so_far_j``, ``predicted_next_cost_j`` and ``threshold_j``; for "stop"
    ``cause`` ("signal" or "preemption") and ``signal`` ("SIGTERM", …). Absent detail is None."""

    def __new__(cls, code, detail=None):
        s = super().__new__(cls, code)
        d = detail or {}
        s.text = d.get("text")
        s.predicted_cost_j = d.get("predicted_cost_j")
        s.cost_so_far_j = d.get("cost_so_far_j")
        s.predicted_next_cost_j = d.get("predicted_next_cost_j")
        s.threshold_j = d.get("threshold_j")
        s.cause = d.get("cause")
        s.signal = d.get("signal")
        return s


class _Energy:
    """Runtime's energy methods (a mixin: ``self._session``, ``self.elastic``, ``self.rank``,
    ``self.slot``, ``self._device``)."""

    energy_unavailable = None  # why energy() returns None (str), once known

    def _energy_ask(self, question):
        from ._native import StoreError
        try:
            return self._session.energy_ask(question, _ANSWER_TIMEOUT_S)
        except StoreError as e:
            raise EnergyUnavailable(f"gpurun (python, slot {self.slot}): no answer from gpurun "
                                    f"to the energy question {question['op']!r} within "
                                    f"{_ANSWER_TIMEOUT_S:.0f} s: {e}") from None

    def _energy_off(self, answer):
        """None when gpurun answered; else the reason (said once on stderr)."""
        why = None
        if not self.elastic:
            why = ("energy figures come from gpurun's energy monitor through the elastic "
                   "control protocol: run under gpurun --config (with NVML, or "
                   "--simulate-gpus N)")
        elif answer is not None and "off" in answer:
            why = answer["off"]
        if why and self.energy_unavailable is None:
            self.energy_unavailable = why
            print(f"gpurun (python, slot {self.slot}): no energy figures: {why}",
                  file=sys.stderr, flush=True)
        return why

    def energy(self):
        """This job's energy so far (``EnergyReading``: per GPU of this node, the job's and the
        current epoch's joules, and every finished epoch's record), or None when gpurun has no
        energy monitor (``energy_unavailable`` says why; without --config, without NVML and
        --simulate-gpus, ``--energy off``). Blocks for one store round trip (~1 ms). Raises
        EnergyUnavailable when gpurun does not answer."""
        if self._energy_off(None):
            return None
        answer = self._energy_ask({"op": "energy", "rank": self.rank})
        if self._energy_off(answer):
            return None
        if "error" in answer:
            raise EnergyUnavailable(answer["error"])
        return EnergyReading(answer)

    def _window_time(self):
        if self._device.type == "cuda":
            import torch
            torch.cuda.synchronize(self._device)  # the window holds the work queued so far
        return time.time()  # gpurun's monitor stamps its readings with CLOCK_REALTIME too

    def begin_window(self, name):
        """Zeus' ``begin_window``: a named energy window begins now (after the device's queued
        work). Names are per rank: every rank may open "eval" at once, each gets its own. Does
        not wait for gpurun. Raises ValueError when this rank already has ``name`` open."""
        if not isinstance(name, str) or not 1 <= len(name.encode()) <= 128:
            raise ValueError(f"an energy window's name is a str of 1 to 128 bytes, not {name!r}")
        open_ = self.__dict__.setdefault("_energy_windows", set())
        if name in open_:
            raise ValueError(f"energy window {name!r} is already open on rank {self.rank}")
        open_.add(name)
        if self._energy_off(None):
            return
        self._energy_ask({"op": "begin", "name": name, "rank": self.rank,
                          "t": self._window_time()})

    def end_window(self, name):
        """Zeus' ``end_window``: ends the window and returns its ``Measurement`` (joules and
        seconds per GPU), or None when gpurun has no energy monitor. Blocks until gpurun's
        monitor has read every GPU after the window's end (one reading, 0.1 s by default).
        Raises ValueError when ``name`` is not open on this rank, EnergyUnavailable when
        gpurun cannot measure it."""
        open_ = self.__dict__.setdefault("_energy_windows", set())
        if name not in open_:
            raise ValueError(f"energy window {name!r} is not open on rank {self.rank} "
                             "(begin_window first)")
        open_.discard(name)
        if self._energy_off(None):
            return None
        answer = self._energy_ask({"op": "end", "name": name, "rank": self.rank,
                                   "t": self._window_time()})
        if self._energy_off(answer):
            return None
        if "error" in answer:
            raise EnergyUnavailable(answer["error"])
        return Measurement(name, self.rank, float(answer["seconds"]),
                           {int(g["slot"]): float(g["energy_j"]) for g in answer["gpus"]})

    @contextlib.contextmanager
    def energy_window(self, name):
        """``with rt.energy_window("eval") as m:`` — begin_window on entry, end_window on exit;
        ``m`` (a ``Measurement``) is filled in at the exit (``m.time``, ``m.gpu_energy``,
        ``m.total_energy``), and stays empty (time 0, no GPU) when gpurun has no monitor."""
        m = Measurement(name, self.rank, 0.0, {})
        self.begin_window(name)
        ok = False
        try:
            yield m
            ok = True
        finally:
            if ok:
                got = self.end_window(name)
                if got is not None:
                    m.time, m.gpu_energy = got.time, got.gpu_energy
            else:  # the body raised: the window is dropped (its exception goes on)
                self.__dict__.get("_energy_windows", set()).discard(name)

    def _stop_detail(self, code):
        """StopReason for gpurun's exit reason `code`, with gpurun's sentence and numbers
        (an early stop's predicted cost, the signal of a stop) where it has them."""
        if not self.elastic or code not in ("early_stop", "stop"):
            return StopReason(code)
        try:
            answer = self._energy_ask({"op": "stop", "rank": self.rank})
        except EnergyUnavailable:
            return StopReason(code)
        if answer.get("reason") not in (None, code):
            answer = {}  # another stop's detail (a signal during an early stop): the code rules
        return StopReason(code, answer)
