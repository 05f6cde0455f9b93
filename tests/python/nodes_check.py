"""The training checks of the elastic-node tests (issue 46): tests/python/run_nodes*.sh and
tests/slurm/run_elastic_nodes.sh import it (PYTHONPATH=tests/python; nodes_lib.sh's
check_nodes runs a check script with it) to read what the slots' training program wrote in
its output folder OUT:
  decorated_train.py  OUT/steps.<slot> (a line a step: epoch, step, rank, world, seen) and
                      OUT/epochs.<slot> (a line an epoch a rank started: epoch, checksum)
  elastic_train.py    OUT/log.<slot> (a line an epoch a rank trained: epoch, rank, world,
                      seen, start_checksum; and a last line without "seen")
<slot> is the job slot id (node k's local slot i is k*1000+i)."""
import glob
import json


def read(out, name):
    """Every JSON line of the files OUT/name.* (all slots), in no particular order."""
    return [json.loads(l) for f in glob.glob(f"{out}/{name}.*") for l in open(f)]


def slots(out, name="steps"):
    """The job slots that wrote a file OUT/name.<slot>: a set of ints."""
    return {int(f.rsplit("/", 1)[1].split(".")[1]) for f in glob.glob(f"{out}/{name}.*")}


def exactly_once(steps, starts, epochs, samples=240, checksum="checksum"):
    """Asserts that each epoch 0..epochs-1 trained each of the `samples` sample indices exactly
    once over all ranks (the "seen" lists of `steps`, steps a rank completed before its death
    included) and that every rank started it from the same state (the `checksum` field of
    `starts`: a joiner's state came from a peer). Returns the worlds in the order the job went
    through them, consecutive repeats collapsed (within an epoch, by step)."""
    worlds = []
    for e in range(epochs):
        mine = [s for s in steps if s["epoch"] == e]
        seen = sorted(i for s in mine for i in s["seen"])
        assert seen == list(range(samples)), \
            f"epoch {e}: {len(seen)} samples, {len(set(seen))} distinct"
        sums = {s[checksum] for s in starts if s["epoch"] == e}
        assert len(sums) == 1, f"epoch {e}: ranks start from different states {sums}"
        for s in sorted(mine, key=lambda s: s.get("step", 0)):
            if not worlds or worlds[-1] != s["world"]:
                worlds.append(s["world"])
    return worlds


def follows(worlds, want):
    """Whether `worlds` (exactly_once's) goes through `want` (strings such as "2?", "4") in
    order: a leading "N?" may be absent (node 1 ready before node 0's first boundary), and
    between two of them the world may pass through values in between (a node's warm joiners
    not ready at the same boundary enter one after the other)."""
    targets = [int(w.rstrip("?")) for w in want]
    if want[0].endswith("?") and worlds[0] != targets[0]:
        targets = targets[1:]
    ok, j = worlds[0] == targets[0], 0
    for w in worlds[1:]:
        if not ok or j + 1 >= len(targets):
            return False
        lo, hi = sorted((targets[j], targets[j + 1]))
        if w == targets[j + 1]:
            j += 1
        elif not lo < w < hi:
            return False
    return ok and j == len(targets) - 1
