"""The one polling helper of the Python test workers (tests/supervisor/workers/store_client.py,
tests/slurm/workers/sum_worker.py); the shell's is wait_for.sh, C++'s poll_until.

A worker imports it with
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "common"))
"""
import time


def wait_for(what, pred, seconds, every=0.05):
    """Calls pred() every `every` s until it returns a true value, which it returns. After
    `seconds` (monotonic clock) without one, raises TimeoutError("timed out after S s waiting
    for WHAT"). Exceptions of pred() go through."""
    deadline = time.monotonic() + seconds
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {seconds} s waiting for {what}")
        time.sleep(every)
