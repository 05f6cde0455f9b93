#!/usr/bin/env bash
# ctest python_launch_line: a `python -m torch.distributed.launch` line with gpurun in place
# of python (docs/cli.md#torchdistributedlaunch-lines). Each worker gets --local_rank=N (torch
# < 2.0) or --local-rank=N (torch >= 2.0), as that torch's launcher passed it, unless
# --use-env/--use_env; the interpreter named on the line runs the workers.
# Usage: run_launch_line.sh GPURUN
TEST=python_launch_line
source "$(dirname "$0")/common.sh"
want=$("$PY" -c 'import torch; print("--local_rank" if int(torch.__version__.split(".")[0]) < 2 else "--local-rank")')

# check DIR ARGUMENT: both ranks ran, summed 0+1, and got ARGUMENT=<their LOCAL_RANK> first,
# before the script's own arguments, where torch's launcher put it (ARGUMENT "": none at all)
check() {
  "$PY" - "$1" "$2" <<'PY' || fail "the checks of $1 (want '$2')"
import json, sys
d, want = sys.argv[1], sys.argv[2]
for r in (0, 1):
    got = json.load(open(f"{d}/rank{r}.json"))
    assert got["world"] == 2 and got["sum"] == 1.0, got
    assert got["LOCAL_RANK"] == str(r), got
    if want:
        assert got["argv"][0] == f"{want}={r}", got
        assert got["local_rank_arg"] == r, got
    else:
        assert not any(a.startswith("--local") for a in got["argv"]), got
        assert got["local_rank_arg"] is None, got
print(f"{d.rsplit('/', 1)[1]}: ranks 0, 1 got {want + '=N' if want else 'LOCAL_RANK only'}")
PY
}

mkdir -p "$TMP/named" "$TMP/prefix" "$TMP/use_env"
# The whole line after gpurun, its interpreter named.
"$GPURUN" "$PY" -m torch.distributed.launch --nproc_per_node=2 --master-port 0 --device cpu \
  "$HERE/launch_line.py" --out "$TMP/named" > "$LOG" 2>&1 || fail "gpurun $PY -m torch.distributed.launch …"
check "$TMP/named" "$want"
# gpurun in place of python, some of gpurun's flags first: the interpreter from PYTHON_EXEC,
# as for torchrun lines.
PYTHON_EXEC=$PY "$GPURUN" --device cpu --master-port 0 -m torch.distributed.launch \
  --nproc_per_node 2 "$HERE/launch_line.py" --out "$TMP/prefix" > "$LOG" 2>&1 ||
  fail "gpurun --device cpu --master-port 0 -m torch.distributed.launch …"
check "$TMP/prefix" "$want"
# --use_env: LOCAL_RANK only.
"$GPURUN" "$PY" -m torch.distributed.launch --use_env --nproc_per_node=2 --master-port 0 \
  --device cpu "$HERE/launch_line.py" --out "$TMP/use_env" > "$LOG" 2>&1 ||
  fail "gpurun … --use_env …"
check "$TMP/use_env" ""
echo "python_launch_line: OK"
