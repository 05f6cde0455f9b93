#!/usr/bin/env bash
# ctest python_ddp_plain: an unmodified torch DDP script (ddp_plain.py, gloo, env://) under
# gpurun, with Debian 12's python3-torch 1.13 (whose TCPStore client has no VALIDATE handshake
# and its own command numbering: the store's legacy dialect, docs/store-protocol.md), against
# the same script launched by hand with torch's own store on rank 0 (the reference: Debian's
# torchrun 1.13 does not start under Python 3.11). Both runs must give identical per-epoch
# losses and identical final parameters (SHA-256), on every rank.
# Usage: run_ddp_plain.sh GPURUN
TEST=python_ddp_plain
source "$(dirname "$0")/common.sh"
mkdir -p "$TMP/gpurun" "$TMP/ref"

echo "python_ddp_plain: $("$PY" -c 'import torch; print("torch", torch.__version__)') ($PY)"
"$GPURUN" --master-port 0 --nproc 2 --device cpu "$PY" "$HERE/ddp_plain.py" "$TMP/gpurun" > "$LOG" 2>&1 \
  || { rc=$?; cat "$LOG"; fail "gpurun exited $rc"; }

# The reference: rank 0 hosts torch's own TCPStore (no TORCHELASTIC_USE_AGENT_STORE).
PORT=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
pids=()
for r in 0 1; do
  env -u TORCHELASTIC_USE_AGENT_STORE MASTER_ADDR=127.0.0.1 MASTER_PORT="$PORT" RANK=$r \
    LOCAL_RANK=$r WORLD_SIZE=2 OMP_NUM_THREADS=1 \
    "$PY" "$HERE/ddp_plain.py" "$TMP/ref" > "$TMP/ref.$r.log" 2>&1 &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p" || { cat "$TMP"/ref.*.log; fail "the reference run failed"; }; done

for r in 0 1; do
  [[ -s $TMP/gpurun/result.$r ]] || { cat "$LOG"; fail "rank $r wrote no result under gpurun"; }
  grep "^world 2 local_rank $r$" "$TMP/gpurun/result.$r" > /dev/null || fail "rank $r: $(tail -1 "$TMP/gpurun/result.$r")"
  diff <(grep -v '^world' "$TMP/gpurun/result.$r") <(grep -v '^world' "$TMP/ref/result.$r") \
    || fail "rank $r: gpurun's run differs from the reference"
done
diff <(grep -v '^world' "$TMP/gpurun/result.0") <(grep -v '^world' "$TMP/gpurun/result.1") \
  || fail "the two ranks' parameters differ"
first=$(awk '/^epoch 0/{print $4}' "$TMP/gpurun/result.0")
last=$(awk '/^epoch 3/{print $4}' "$TMP/gpurun/result.0")
awk -v a="$first" -v b="$last" 'BEGIN{exit !(b < a / 4)}' || fail "loss did not fall: $first -> $last"
cat "$TMP/gpurun/result.0"
echo "python_ddp_plain: OK (loss $first -> $last; identical to the reference on both ranks)"
