"""What a Runtime keeps of the program's beyond the model and the optimizer
(docs/python.md#use): each slot's random streams, kept in gpurun's store while the slot is out
of the job, and the small tracked objects, made rank 0's on every rank at each resize."""
import os
import pickle
import random
import sys

import torch


class _Tracked:
    """Runtime's per-slot streams and small objects; mixed into Runtime."""

    def track_globals(self, *names):
        """Tracks variables of the calling module by name, for script-style programs:
        ``rt.track_globals("best_val_loss")`` after ``best_val_loss = 1e9``. Their values are
        part of the state (read at each boundary: a joiner gets them) and, being small, are the
        previous generation's rank 0's on every rank after each resize, so a value only rank 0
        updates survives a change of rank 0. Loading assigns the module variable anew (a name
        imported elsewhere with ``from m import x`` keeps its old binding). Raises NameError for
        a name the module does not define yet. Returns self."""
        g = sys._getframe(1).f_globals
        missing = [n for n in names if n not in g]
        if missing:
            raise NameError(f"Runtime.track_globals(): {', '.join(missing)} not defined in module "
                            f"{g.get('__name__', '?')} yet (assign it before tracking it)")
        key = "globals." + g.get("__name__", "?")
        if key in self._others:
            names = tuple(dict.fromkeys(self._others[key].names + names))
        self._others[key] = _GlobalsState(g, names)
        return self

    # ---- per-slot RNG streams -----------------------------------------------------------
    def _save_rng(self):
        """A leaving rank keeps its slot's RNG streams in gpurun's store (a few KB): torch's
        CPU generator, this device's CUDA generator, Python's ``random`` and numpy's global
        one (where numpy is imported)."""
        if not self.elastic:
            return
        st = {"torch": torch.get_rng_state().numpy().tobytes(), "random": random.getstate()}
        if self.device.type == "cuda":
            st["cuda"] = torch.cuda.get_rng_state(self.device).numpy().tobytes()
        if "numpy" in sys.modules:
            st["numpy"] = sys.modules["numpy"].random.get_state()
        self._session.put_slot_data("pyrng", pickle.dumps(st))

    def _restore_rng(self):
        """A rank that joins without the state (a new process, or a parked one woken) takes
        back its slot's RNG streams where the slot left them; a slot that never ran keeps the
        program's own seeding."""
        raw = self._session.get_slot_data("pyrng") if self.elastic else None
        if raw is None:
            return
        # pickle: this job's own bytes, written by _save_rng() of the same slot
        st = pickle.loads(raw)
        as_tensor = lambda b: torch.frombuffer(bytearray(b), dtype=torch.uint8)  # noqa: E731
        torch.set_rng_state(as_tensor(st["torch"]))
        random.setstate(st["random"])
        if "cuda" in st and self.device.type == "cuda":
            torch.cuda.set_rng_state(as_tensor(st["cuda"]), self.device)
        if "numpy" in st and "numpy" in sys.modules:
            sys.modules["numpy"].random.set_state(st["numpy"])

    # ---- small tracked objects: the previous rank 0's on every rank ----------------------
    def _small_key(self):
        return f"gpurun_py/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/rank0_small"

    def _publish_small(self):
        """Rank 0, before each boundary report: its small tracked objects (track()) go to
        gpurun's store (one SET of their pickled state dicts), for the next generation."""
        if self.rank != 0 or not self._others:
            return
        small = {}
        for k, v in self._others.items():
            sd = v.state_dict()
            if _is_small(sd):
                small[k] = sd
        if small:
            store = self._store()
            store.set(self._small_key(), pickle.dumps((self.generation, small)))
            store.add(self._small_key() + "/n", 1)  # published (torch 1.13 has no check())

    def _adopt_small(self):
        """Every rank of a new generation, before its checksum and its first step: the small
        tracked objects become the previous generation's rank 0's (values only rank 0
        computes, like a best validation loss, survive a change of rank 0)."""
        if not self._small_pending:
            return
        self._small_pending = False
        if not self._others:
            return
        key = self._small_key()
        store = self._store()
        if store.add(key + "/n", 0) == 0:
            return  # rank 0 has published nothing yet (before the first boundary)
        # pickle: this job's own bytes, written by _publish_small() of its rank 0
        _, small = pickle.loads(store.get(key))
        for k, sd in small.items():
            if k in self._others:
                self._others[k].load_state_dict(sd)


def _is_small(state):
    """True when a tracked object's ``state`` holds no tensor over 64 KiB or on a device: it
    travels whole through the store (Runtime.track, small objects)."""
    if isinstance(state, torch.Tensor):
        return state.device.type == "cpu" and state.numel() * state.element_size() <= 65536
    if isinstance(state, dict):
        return all(_is_small(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return all(_is_small(v) for v in state)
    return True


class _DictState:
    """A tracked plain dict (Runtime.track): its items are the state, replaced in place."""

    def __init__(self, d):
        self.d = d

    def state_dict(self):
        return dict(self.d)

    def load_state_dict(self, s):
        self.d.clear()
        self.d.update(s)


class _GlobalsState:
    """Variables of one module's namespace, tracked by name (Runtime.track_globals)."""

    def __init__(self, namespace, names):
        self.namespace, self.names = namespace, tuple(names)

    def state_dict(self):
        return {n: self.namespace[n] for n in self.names}

    def load_state_dict(self, s):
        for n in self.names:
            if n in s:
                self.namespace[n] = s[n]
