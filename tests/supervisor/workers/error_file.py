#!/usr/bin/env python3
"""Fails the way a torch script decorated with @record does: writes the JSON error
report to $TORCHELASTIC_ERROR_FILE (torch's format), then exits 1 (rank 0 only). The other
ranks wait until gpurun stops them."""
import json
import os
import signal
import sys

if os.environ["RANK"] != "0":
    signal.pause()  # until the teardown's SIGTERM
    sys.exit(0)
with open(os.environ["TORCHELASTIC_ERROR_FILE"], "w") as f:
    json.dump({"message": {"message": "ValueError: loss is NaN at step 12",
                           "extraInfo": {"py_callstack": "Traceback (most recent call last):\n  File \"train.py\", line 3, in <module>\nValueError: loss is NaN at step 12\n",
                                         "timestamp": "1764400000"}}}, f)
print("about to fail", file=sys.stderr, flush=True)
sys.exit(1)
