#!/usr/bin/env bash
# ctest python_global_batch: [batch] global = 48 kept across a resize by gradient accumulation
# (Runtime.steps, tests/python/global_batch.py). A fixed run on one slot and an elastic run on
# 3 slots shrunk to [0, 2] after epoch 1 give the same per-epoch loss (within 1e-4 relative:
# only the summation order differs).
# Usage: run_global_batch.sh GPURUN
TEST=python_global_batch
source "$(dirname "$0")/common.sh"
mkdir -p "$TMP/fixed" "$TMP/elastic"
printf 'active_gpus = [0]\n[batch]\nglobal = 48\n' > "$TMP/fixed.toml"
"$GPURUN" --master-port 0 --nproc 1 --device cpu --config "$TMP/fixed.toml" "$PY" "$HERE/global_batch.py" \
  "$TMP/fixed" 6 0 > "$TMP/fixed.log" 2>&1 || { tail -20 "$TMP/fixed.log"; fail "the fixed run failed"; }
printf 'active_gpus = [0, 1, 2]\n[batch]\nglobal = 48\n' > "$TMP/elastic.toml"
"$GPURUN" --master-port 0 --nproc 3 --device cpu --config "$TMP/elastic.toml" "$PY" "$HERE/global_batch.py" \
  "$TMP/elastic" 6 0.5 > "$LOG" 2>&1 &
pid=$!
wait_running 60 "the elastic run's first epoch ($TMP/elastic/loss)" test -s "$TMP/elastic/loss"
printf 'active_gpus = [0, 2]\n[batch]\nglobal = 48\n' > "$TMP/elastic.toml.new"
mv "$TMP/elastic.toml.new" "$TMP/elastic.toml"
wait "$pid" || fail "the elastic run failed"
paste "$TMP/fixed/loss" "$TMP/elastic/loss"
"$PY" - "$TMP/fixed/loss" "$TMP/elastic/loss" <<'PY' || fail "losses differ"
import sys
f = [l.split() for l in open(sys.argv[1])]
e = [l.split() for l in open(sys.argv[2])]
assert len(f) == len(e) == 6, (len(f), len(e))
assert {x[2] for x in e} == {"3", "2"}, f"worlds {[x[2] for x in e]}: the shrink did not happen"
for a, b in zip(f, e):
    fa, fb = float(a[1]), float(b[1])
    assert abs(fa - fb) <= 1e-4 * max(1.0, abs(fa)), f"epoch {a[0]}: fixed {fa}, elastic {fb} (world {b[2]})"
PY
echo "python_global_batch: OK"
