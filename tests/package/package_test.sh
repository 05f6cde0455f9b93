#!/usr/bin/env bash
# The installed CMake package, as a user meets it (docs/architecture.md#the-cmake-package):
#   1. cmake --install <build> --prefix <tmp>/prefix
#   2. configure, build and run tests/package/consumer (copied out of the tree) with
#      find_package(gpurun CONFIG REQUIRED) + gpurun::worker_runtime, on the same LibTorch;
#      its main catches gpurun::CommError;
#   3. the consumer's compile line (compile_commands.json) names no launcher/ directory, no
#      directory of the gpurun source tree and no BOOST_ definition.
# Usage: package_test.sh BUILD_DIR CONSUMER_SRC [extra cmake args for the consumer]
# Works in a fresh directory under $TMPDIR (outside any source tree), removed on success.
set -euo pipefail
build=$1 consumer=$2
shift 2
src_dir=$(cd "$consumer/../../.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/gpurun-package-test.XXXXXX")

# The compile-line check, run first on a line that breaks each rule: a check that cannot
# fail proves nothing.
leaks() {  # prints every rule the compile command in $1 breaks
  local cmd=$1
  if grep -qE -- '-I[^ ]*launcher(/| |$)|-isystem [^ ]*launcher(/| |$)' <<<"$cmd"; then echo "a launcher/ include directory"; fi
  if grep -qE -- '-DBOOST_' <<<"$cmd"; then echo "a BOOST_ definition"; fi
  if grep -qF -- "$src_dir/" <<<"$cmd"; then echo "a path into the gpurun source tree ($src_dir)"; fi
}
bad="c++ -DBOOST_ASIO_NO_DEPRECATED -I$src_dir/launcher -c main.cpp"
if [[ $(leaks "$bad" | wc -l) -ne 3 ]]; then
  echo "package_test: the compile-line check misses a leak in: $bad" >&2
  exit 1
fi

cp -r "$consumer" "$work/src"
t0=$(date +%s)
cmake --install "$build" --prefix "$work/prefix" >"$work/install.log"
test -x "$work/prefix/bin/gpurun" || { echo "package_test: no bin/gpurun in the prefix" >&2; exit 1; }
cmake -S "$work/src" -B "$work/build" -DCMAKE_PREFIX_PATH="$work/prefix" \
  -DCMAKE_BUILD_TYPE=Release "$@" >"$work/configure.log" ||
  { cat "$work/configure.log" >&2; exit 1; }
cmake --build "$work/build" >"$work/build.log" 2>&1 || { cat "$work/build.log" >&2; exit 1; }
t1=$(date +%s)

cmd=$(python3 -c 'import json,sys; print(next(e["command"] for e in json.load(open(sys.argv[1])) if e["file"].endswith("main.cpp")))' \
  "$work/build/compile_commands.json")
problems=$(leaks "$cmd")
if [[ -n $problems ]]; then
  echo "package_test: the consumer's compile line has:" >&2
  echo "$problems" | sed 's/^/  - /' >&2
  echo "compile line: $cmd" >&2
  echo "(left in $work)" >&2
  exit 1
fi

"$work/build/consumer"
echo "package_test: install + consumer configure/build took $((t1 - t0)) s"
rm -rf "$work"
