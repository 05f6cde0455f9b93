#!/usr/bin/env bash
# Runs a Python test file with a python3 that has torch (find_torch_python.sh).
set -euo pipefail
PY=$("$(dirname "$0")/find_torch_python.sh")
exec "$PY" "$@"
