"""ctest python_destroy_first (issue 44 item 5): rank 1 destroys its process group, then raises
ValueError under torch's @record (its error file holds the real error) and lingers in its exit
(an atexit callback, as a DataLoader's shutdown would); rank 0, in a collective, fails of the
closed connection and is reaped first. gpurun must name rank 1 and its ValueError as the root
cause, not rank 0's "Connection closed by peer".
ctest python_destroy_first_gap: with DESTROY_GAP_S=<s> rank 1 raises that long after it
destroyed its group (and exits at once): rank 0 fails first, and gpurun's teardown must wait
for rank 1's error rather than end it (docs/errors.md, "The root cause").
Usage (under gpurun, 2 workers, gloo): [DESTROY_GAP_S=1] destroy_first.py"""
import atexit
import os
import time

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record


@record
def main():
    dist.init_process_group("gloo")
    t = torch.ones(1)
    dist.all_reduce(t)
    if dist.get_rank() == 1:
        gap = float(os.environ.get("DESTROY_GAP_S", "0"))
        if gap == 0:
            atexit.register(time.sleep, 20)  # a slow exit: rank 0 is reaped first
        dist.destroy_process_group()
        time.sleep(gap)  # rank 0 fails meanwhile
        raise ValueError("rank 1 found a bad learning rate (10.0)")
    while True:  # rank 0: the next collective fails when rank 1's group is gone
        dist.all_reduce(t)


if __name__ == "__main__":
    main()
