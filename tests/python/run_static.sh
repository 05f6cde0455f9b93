#!/usr/bin/env bash
# ctest python_static: the gpurun package without gpurun's elastic environment is a static
# run: tests/python/elastic_train.py as a plain single process, and under gpurun without
# --config on 2 CPU slots (init_process_group("env://"), rank 0's state broadcast). Both
# finish every epoch, each sample once per epoch, equal checksums on both ranks, and each
# rank keeps its own RNG stream (the state broadcast does not move torch's RNG).
# Usage: run_static.sh GPURUN
TEST=python_static
source "$(dirname "$0")/common.sh"
mkdir -p "$TMP/plain" "$TMP/two"
"$PY" "$HERE/elastic_train.py" "$TMP/plain" 3 0 > "$LOG" 2>&1 || fail "the plain run failed"
"$GPURUN" --master-port 0 --nproc 2 --device cpu "$PY" "$HERE/elastic_train.py" "$TMP/two" 3 0 \
  > "$LOG" 2>&1 || fail "the run under gpurun without --config failed"
"$PY" - "$TMP/plain" "$TMP/two" <<'PY' || fail "the checks above"
import glob, json, sys
for d, world in ((sys.argv[1], 1), (sys.argv[2], 2)):
    lines = [json.loads(l) for f in glob.glob(d + "/log.*") for l in open(f)]
    for e in range(3):
        ls = [l for l in lines if l["epoch"] == e]
        assert len(ls) == world and {l["world"] for l in ls} == {world}, (d, e, ls)
        assert sorted(i for l in ls for i in l["seen"]) == list(range(240)), (d, e)
        assert len({l["start_checksum"] for l in ls}) == 1, (d, e)
        assert len({l["rng"] for l in ls}) == world, f"{d} epoch {e}: ranks share an RNG stream"
    print(f"{'plain' if world == 1 else 'gpurun, no --config'}: world {world}, 3 epochs, each sample once")
PY
echo "python_static: OK"
