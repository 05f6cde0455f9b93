#!/usr/bin/env python3
"""ctest python_energy_units: the package's energy calls (gpurun/_energy.py) against a fake
session: what each answer of gpurun becomes (EnergyReading, Measurement, StopReason), None and
the reason when there is no monitor, the errors a program sees. No gpurun, no store."""
import io
import os
import sys
from contextlib import redirect_stderr

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "worker_runtime", "python"))
import torch  # noqa: E402

from gpurun._energy import (EnergyReading, EnergyUnavailable, Measurement, StopReason,  # noqa: E402
                            _Energy)
from gpurun._native import StoreError  # noqa: E402


class FakeSession:
    """Answers each question with the next of `answers` (a dict, or an exception to raise)."""

    def __init__(self, *answers):
        self.answers, self.asked = list(answers), []

    def energy_ask(self, question, timeout_s):
        self.asked.append(question)
        if question["op"] == "begin":
            return {}
        a = self.answers.pop(0)
        if isinstance(a, Exception):
            raise a
        return a


class Rt(_Energy):
    def __init__(self, session, elastic=True):
        self._session, self.elastic, self.rank, self.slot = session, elastic, 1, 3
        self._device = torch.device("cpu")


def raises(kind, text, fn, *args):
    try:
        fn(*args)
    except kind as e:
        assert text in str(e), (text, str(e))
        return
    raise AssertionError(f"{fn.__name__} did not raise {kind.__name__}")


# Without --config there is nothing to ask: None, and why (said once).
rt = Rt(None, elastic=False)
err = io.StringIO()
with redirect_stderr(err):
    assert rt.energy() is None
    assert rt.energy() is None
    with rt.energy_window("eval") as m:
        pass
assert m.time == 0 and m.gpu_energy == {} and m.total_energy == 0
assert "--config" in rt.energy_unavailable, rt.energy_unavailable
assert err.getvalue().count("no energy figures") == 1, err.getvalue()
assert rt._stop_detail("finished") == "finished"

# gpurun has no monitor: its reason.
rt = Rt(FakeSession({"v": 1, "off": "gpurun's GPU energy monitor is off for this job (no NVML)"}))
with redirect_stderr(io.StringIO()):
    assert rt.energy() is None
assert rt.energy_unavailable.endswith("(no NVML)")

# rt.energy(): the figures as answered.
epoch0 = {"epoch": 0, "seconds": 2.5, "energy_j": 1234.5, "gpu_energy_j": {"0": 700, "1": 534.5}}
rt = Rt(FakeSession({"v": 1, "seconds": 61.5, "epoch": 1, "job_j": 1800.5, "epoch_j": 450.25,
                     "gpus": [{"slot": 0, "job_j": 1000.5, "epoch_j": 250.25},
                              {"slot": 1, "job_j": 800, "epoch_j": 200}],
                     "epochs": [epoch0]}))
e = rt.energy()
assert isinstance(e, EnergyReading)
assert (e.seconds, e.total_energy, e.epoch, e.epoch_energy) == (61.5, 1800.5, 1, 450.25)
assert e.gpu_energy == {0: 1000.5, 1: 800} and e.epoch_gpu_energy == {0: 250.25, 1: 200}
assert e.epochs == [epoch0]
assert rt._session.asked == [{"op": "energy", "rank": 1}]

# A window: begin and end carry the name, the rank and the time; the answer is a Measurement.
s = FakeSession({"v": 1, "name": "eval", "seconds": 0.5,
                 "gpus": [{"slot": 0, "energy_j": 300}, {"slot": 1, "energy_j": 200.5}]})
rt = Rt(s)
with rt.energy_window("eval") as m:
    raises(ValueError, "already open on rank 1", rt.begin_window, "eval")
assert isinstance(m, Measurement)
assert (m.time, m.gpu_energy, m.total_energy) == (0.5, {0: 300, 1: 200.5}, 500.5)
assert [q["op"] for q in s.asked] == ["begin", "end"] and s.asked[0]["t"] <= s.asked[1]["t"]
assert s.asked[0]["name"] == "eval" and s.asked[0]["rank"] == 1
raises(ValueError, "is not open on rank 1 (begin_window first)", rt.end_window, "eval")
raises(ValueError, "1 to 128 bytes", rt.begin_window, "")
# A body that raises drops its window: the name may be opened again.
try:
    with rt.energy_window("train"):
        raise KeyError("x")
except KeyError:
    pass
assert "train" not in rt._energy_windows

# gpurun cannot measure it, or does not answer: EnergyUnavailable naming why.
rt = Rt(FakeSession({"v": 1, "error": "no energy window named 'eval' is open for slot 3"}))
rt.begin_window("eval")
raises(EnergyUnavailable, "no energy window named 'eval'", rt.end_window, "eval")
rt = Rt(FakeSession(StoreError("timed out after 30000 ms waiting for the key")))
raises(EnergyUnavailable, "no answer from gpurun to the energy question 'energy' within 30 s",
       rt.energy)

# stop_reason: the code, with gpurun's detail for an early stop and a stop signal.
rt = Rt(FakeSession({"v": 1, "reason": "early_stop", "text": "the predicted total cost after "
                     "epoch 8 (9070.5 J) would pass the threshold (9000 J)",
                     "predicted_cost_j": 9070.5, "threshold_j": 9000}))
r = rt._stop_detail("early_stop")
assert isinstance(r, StopReason) and isinstance(r, str) and r == "early_stop"
assert (r.predicted_cost_j, r.threshold_j) == (9070.5, 9000) and "9070.5 J" in r.text
rt = Rt(FakeSession({"v": 1, "reason": "stop", "cause": "signal", "signal": "SIGTERM",
                     "text": "gpurun received SIGTERM"}))
r = rt._stop_detail("stop")
assert r == "stop" and r.signal == "SIGTERM" and r.cause == "signal" and r.predicted_cost_j is None
# Detail of another stop than the decision's is not taken; no answer leaves the code alone.
assert Rt(FakeSession({"v": 1, "reason": "stop"}))._stop_detail("early_stop").text is None
assert Rt(FakeSession(StoreError("gone")))._stop_detail("stop") == "stop"
print("python_energy_units: OK")
