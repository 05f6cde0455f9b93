#!/usr/bin/env bash
# Prints a python3 that has torch: Debian's /usr/bin/python3 (python3-torch, installed by
# scripts/setup.sh) first, since a python3 earlier in PATH (pyenv, a venv) may lack torch.
# find_spec, not an import: every Python test calls this, and importing torch is ~1.8 s of CPU
# (~45 s over the suite on the 2-core CI machine); a torch that is there but broken fails in
# the test itself, with its traceback.
for py in /usr/bin/python3 "$(command -v python3 || true)"; do
  [[ -n $py && -x $py ]] &&
    "$py" -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("torch") is None)' \
      2>/dev/null && { echo "$py"; exit 0; }
done
echo "no python3 with torch found (scripts/setup.sh installs Debian's python3-torch)" >&2
exit 1
