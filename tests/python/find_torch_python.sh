#!/usr/bin/env bash
# Prints a python3 that imports torch: Debian's /usr/bin/python3 (python3-torch, installed by
# scripts/setup.sh) first, since a python3 earlier in PATH (pyenv, a venv) may lack torch.
for py in /usr/bin/python3 "$(command -v python3 || true)"; do
  [[ -n $py && -x $py ]] && "$py" -c 'import torch' 2>/dev/null && { echo "$py"; exit 0; }
done
echo "no python3 with torch found (scripts/setup.sh installs Debian's python3-torch)" >&2
exit 1
