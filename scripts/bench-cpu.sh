#!/usr/bin/env bash
# CPU-machine benchmarks (run by hand; not part of CI). Builds if needed.
# Prints the store's throughput and rendezvous times; see docs/results.md.
set -euo pipefail
cd "$(dirname "$0")/.."
[[ -x build/bench/store_bench ]] || scripts/setup.sh
build/bench/store_bench --threads 8 --ops 20000 --rendezvous 2000,10000
