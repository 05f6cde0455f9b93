#!/usr/bin/env python3
"""ctest python_engine_cases: the worker engine's JSON cases (tests/worker_runtime/engine/engine_cases.json,
also run by the C++ table test "worker engine: JSON cases") give the same actions when the
Python package drives the engine through its C interface (libgpurun_worker.so, ctypes): one
engine for both languages. Usage: test_engine_cases.py LIBGPURUN_WORKER_SO"""
import json
import os
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "..", "worker_runtime", "python"))
from gpurun import _native  # noqa: E402

lib = _native.load(sys.argv[1])
cases = json.load(open(os.path.join(here, "..", "worker_runtime", "engine", "engine_cases.json")))
assert len(cases) >= 5, len(cases)
checked = 0
for case in cases:
    eng = _native.Engine(case["options"], lib)
    for i, step in enumerate(case["steps"]):
        got = eng.on(step["event"])
        assert got == step["actions"], (
            f"{case['name']}, step {i} ({step['event']['event']}): got {got}, "
            f"want {step['actions']}")
        checked += 1

# An executor bug (an event out of place) and a bad value are errors with their text.
eng = _native.Engine({"slot": 0, "join_generation": 0, "pid": 1}, lib)
try:
    eng.on({"event": "ready"})
    raise SystemExit("an event out of place was accepted")
except _native.ProtocolError as e:
    assert "event 'ready' in phase" in str(e), e
eng = _native.Engine({"slot": 0, "join_generation": 0, "pid": 1}, lib)
eng.on({"event": "open"})
try:
    eng.on({"event": "value", "text": "{not json"})
    raise SystemExit("a bad start record was accepted")
except _native.ProtocolError as e:
    assert "is not a JSON object" in str(e), e
print(f"python_engine_cases: {len(cases)} cases, {checked} steps equal through the C interface")

# The words for a resume position come from the library (the Python messages use them too).
assert _native.position_text(3, 0) == "after epoch 3", _native.position_text(3, 0)
assert _native.position_text(0, 0) == "before the first epoch"
assert _native.position_text(2, 5) == "in epoch 3 after step 5"
print("python_engine_cases: positions in gpurun's words")
