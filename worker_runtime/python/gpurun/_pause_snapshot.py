"""The pause snapshot's steps of gpurun.Runtime (a mixin: they use the Runtime's device, slot,
state and snapshot I/O): write and read it, prepare its file ahead while training runs, and a
standby's or warm joiner's early map of it. The C++ runtime's counterpart is
worker_runtime/src/runtime/runtime_snapshot.cpp; the file format and its checks are the
library's (_snapshot.SnapshotIo)."""
import sys
import threading

import torch

from . import _native
from ._checksum import StateMismatch


class _PauseSnapshot:
    def _write_snapshot(self):
        if not self._snap.files:
            return "no GPURUN_SNAPSHOT_PATH: gpurun gave this worker no snapshot file"
        self._join_prepare()
        try:
            self._snap.write(self._state())
            return "ok"
        except Exception as e:  # noqa: BLE001 - the outcome goes to gpurun, which refuses the pause
            return f"cannot write the pause snapshot: {e}"

    def _read_snapshot(self, epoch, step):
        """Loads the pause snapshot; its state must be at (epoch, step) (-1: any), the position
        of the pause it belongs to. Returns its tensor bytes."""
        self._join_prepare()
        try:
            snap, info = self._snap.read(verify=True)
        except Exception as e:  # noqa: BLE001 - any unreadable file: say which
            raise StateMismatch(f"cannot read the pause snapshot: {type(e).__name__}: {e}") from e
        pos = snap["position"]
        if epoch >= 0 and (int(pos["epoch"]), int(pos.get("step", 0))) != (epoch, step):
            raise StateMismatch(
                f"the pause snapshot '{info['path']}' holds the state "
                f"{_native.position_text(pos['epoch'], pos.get('step', 0))}, but the pause it "
                f"resumes was {_native.position_text(epoch, step)}: refusing to roll training back "
                "(was an older snapshot copied over it?)")
        if info.get("reserve_note"):
            self._note(f"device memory reserved ahead of the first step: "
                       f"{info['reserved_ahead_bytes']} of {info['device_reserved_bytes']} "
                       f"bytes ({info['reserve_note']})")
        self._load(snap)
        return info["tensor_bytes"]

    def _start_prepare(self):
        """Once, after the optimizer's first step (its moments exist, so the size is known),
        unless GPURUN_SNAPSHOT_PREPARE=0: the pause snapshot file is created, reserved, mapped
        and page-locked (CUDA; CPU: mlock) on a thread while training goes on, so that a pause
        only copies. A failure is said once; the pause then makes the file itself."""
        if not (self.elastic and self._prepare_wanted and self._snap.files):
            return
        self._prepare_wanted = False
        try:
            args = self._snap.plan_prepare(self._state())
        except Exception as e:  # noqa: BLE001 - only an optimisation: say it and go on
            self._note(f"the pause snapshot is not prepared ahead: {e}")
            return
        out = {}
        device = self._device

        def run():
            try:
                if device.type == "cuda":  # cudaHostRegister in cuda:<slot>'s context, not 0's
                    torch.cuda.set_device(device)
                out.update(self._snap.prepare(*args))
            except Exception as e:  # noqa: BLE001
                out["error"] = str(e)
        self._prepare = (threading.Thread(target=run, name="gpurun-snapshot-prepare",
                                          daemon=True), out)
        self._prepare[0].start()

    def _standby_ahead(self):
        """A standby, before it waits for its go, does what needs no CUDA context: cuDNN's and
        cuBLAS's lazily opened libraries are loaded (_native.preload_cuda_libraries) and the
        pause snapshot is mapped without page-locking (_start_premap); after the go only the
        page-locking is left (the C++ runtime's Impl::standby_ahead)."""
        if self._device.type == "cuda":
            try:
                r = _native.preload_cuda_libraries()
            except Exception as e:  # noqa: BLE001 - only an optimisation: the standby goes on
                r = {"failed": [f"({e})"]}
            for failed in r["failed"]:  # only slower: the library opens it itself later
                self._note(f"standby: cannot preload {failed}")
            # The CUDA driver's own start (cuInit, through cudaGetDeviceCount; at most ~0.25 s
            # on the H200 by the C++ warm-up thread's start, 2026-12-05), which makes no
            # context: the GPU stays at 0 MiB. The go's check returns at once then, and says
            # its error, if any, there.
            torch.cuda.is_available()
        if self._snap.files:
            self._start_premap(ahead=True)

    def _start_premap(self, ahead=False):
        """A warm joiner (of a paused job, when the run's snapshot file holds a committed
        snapshot): the library maps and page-locks that file on a thread while the program
        builds its model and loads its data, so that the resume only checks and copies. The
        file is not changed; nothing is said when there is none (a grow of a running job).
        ``ahead``: a standby's, before its go: mapped without page-locking (no CUDA call; the
        C++ runtime's start_premap(map_only)). That mapping is joined first by the premap after
        the go, on the new thread (the go's CUDA set-up goes on meanwhile): the library then
        only page-locks it, if the file is still the one mapped."""
        earlier, self._prepare = self._prepare, None  # a standby's map-only thread (quiet)
        out = {"quiet": True}
        on_device = not ahead and self._device.type == "cuda"
        device = self._device

        def run():
            try:
                if earlier is not None:
                    earlier[0].join()
                if on_device:  # cudaHostRegister in this thread's current device's context
                    torch.cuda.set_device(device)
                out.update(self._snap.files.premap(on_device))
                if ahead and out.get("done"):  # a standby's, before its go: all it does ahead
                    ms = out.get("total_s", 0) * 1e3
                    print(f"gpurun (python, slot {self.slot}): standby: snapshot mapped ahead of "
                          f"the go ({ms:.0f} ms)", file=sys.stderr, flush=True)
            except Exception:  # noqa: BLE001 - only an optimisation: the read maps it then
                pass
            out["error"] = ""
        self._prepare = (threading.Thread(target=run, name="gpurun-snapshot-premap",
                                          daemon=True), out)
        self._prepare[0].start()

    def _join_prepare(self):
        if self._prepare is None:
            return
        thread, out = self._prepare
        self._prepare = None
        thread.join()
        if out.get("quiet"):
            return
        if out.get("error"):
            self._note(f"the pause snapshot is not prepared ahead ({out['error']}); a pause "
                       "writes it then (slower)")
        elif out.get("lock_error"):
            self._note("the pause snapshot file is prepared but not locked in memory: "
                       f"{out['lock_error']}")
