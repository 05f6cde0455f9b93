#!/usr/bin/env bash
# Installs dependencies if needed, builds, and runs every unit and integration test.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
ctest --test-dir build --output-on-failure -j2 --timeout 300
