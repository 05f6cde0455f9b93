#!/usr/bin/env bash
# Runs clang-tidy (Debian: clang-tidy) with the repository's .clang-tidy over launcher/'s sources,
# using build/compile_commands.json (scripts/setup.sh writes it). Run by hand, not (yet) by
# scripts/test.sh: the 39 launcher sources take about 80 s on 2 cores (it prints the timing).
# Usage: scripts/tidy.sh [build-dir] [files...]    (default: build, every launcher/ *.cpp)
# Exit status 1 when clang-tidy reports anything.
set -euo pipefail
cd "$(dirname "$0")/.."

CLANG_TIDY=${CLANG_TIDY:-clang-tidy}
build=${1:-build}
shift || true
command -v "$CLANG_TIDY" >/dev/null || { echo "tidy: $CLANG_TIDY not found (Debian: clang-tidy)" >&2; exit 2; }
[[ -f $build/compile_commands.json ]] || { echo "tidy: no $build/compile_commands.json (run scripts/setup.sh)" >&2; exit 2; }

if (($#)); then
  files=("$@")
else
  mapfile -t files < <(git ls-files --cached --others --exclude-standard -- 'launcher/*.cpp' | sort)
fi
start=$SECONDS
log=$(mktemp)
trap 'rm -f "$log"' EXIT
# GCC-only flags in the compile database are unknown to clang; -Wno-unknown-warning-option
# keeps them quiet. -quiet: no per-file banner.
printf '%s\0' "${files[@]}" |
  xargs -0 -n 1 -P "$(nproc)" "$CLANG_TIDY" -quiet -p "$build" \
    --extra-arg=-Wno-unknown-warning-option 2>/dev/null | tee "$log" || true
n=$(grep -c ': warning: \|: error: ' "$log" || true)
echo "tidy: ${#files[@]} files, $n findings, $((SECONDS - start)) s"
((n == 0))
