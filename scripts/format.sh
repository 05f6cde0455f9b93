#!/usr/bin/env bash
# Formats the project's own C++ sources with clang-format and the repository's .clang-format.
# Usage: scripts/format.sh           reformat in place
#        scripts/format.sh --check   change nothing; list the files that deviate, exit 1 if any
# Covers *.cpp/*.hpp under launcher/ worker_runtime/ examples/ tests/ bench/ (tracked or not,
# minus git-ignored paths: build dirs, .carry). CLANG_FORMAT overrides the binary.
set -euo pipefail
cd "$(dirname "$0")/.."

CLANG_FORMAT=${CLANG_FORMAT:-clang-format}
check=0
case "${1:-}" in
  --check) check=1 ;;
  "") ;;
  *) echo "usage: scripts/format.sh [--check]" >&2; exit 2 ;;
esac
command -v "$CLANG_FORMAT" >/dev/null || { echo "format: $CLANG_FORMAT not found (Debian: clang-format)" >&2; exit 2; }

mapfile -t files < <(git ls-files --cached --others --exclude-standard -- \
  'launcher/*.cpp' 'launcher/*.hpp' 'worker_runtime/*.cpp' 'worker_runtime/*.hpp' \
  'examples/*.cpp' 'examples/*.hpp' 'tests/*.cpp' 'tests/*.hpp' 'bench/*.cpp' 'bench/*.hpp' |
  while read -r f; do [[ -f $f ]] && echo "$f"; done | sort -u)

if ((check)); then
  bad=()
  for f in "${files[@]}"; do
    "$CLANG_FORMAT" --style=file "$f" | cmp -s - "$f" || bad+=("$f")
  done
  if ((${#bad[@]})); then
    echo "format: ${#bad[@]} of ${#files[@]} files deviate from .clang-format (run scripts/format.sh):" >&2
    printf '  %s\n' "${bad[@]}" >&2
    exit 1
  fi
  echo "format: ${#files[@]} files match .clang-format"
else
  printf '%s\0' "${files[@]}" | xargs -0 -n 50 "$CLANG_FORMAT" --style=file -i
  echo "format: formatted ${#files[@]} files"
fi
