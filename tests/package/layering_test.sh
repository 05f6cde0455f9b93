#!/usr/bin/env bash
# The dependency rule of docs/architecture.md, checked on the sources: each directory may
# include (as "dir/…") only the layers below it. Public libraries use only "gpurun/…" and
# their own private directories. Usage: layering_test.sh SOURCE_DIR
set -euo pipefail
cd "$1"
fail=0
# check DIR ALLOWED_REGEX: every #include "x/…" under DIR must have x matching ALLOWED_REGEX
check() {
  local dir=$1 allowed=$2 bad
  bad=$(grep -rnE '^#include "[a-z_]+/' "$dir" --include='*.cpp' --include='*.hpp' |
    grep -vE "#include \"($allowed)/" || true)
  if [[ -n $bad ]]; then
    echo "layering: $dir may include only ($allowed)/…, but:"
    echo "$bad" | sed 's/^/  /'
    fail=1
  fi
}
check launcher/common 'gpurun'
check launcher/protocol 'gpurun'
check launcher/store 'gpurun|store'
check launcher/supervisor 'gpurun|supervisor'
check launcher/cli 'gpurun|supervisor|cli'
check launcher/nodes 'gpurun|supervisor|nodes'
check launcher/control 'gpurun|store|supervisor|control'
check launcher/energy 'gpurun|supervisor|energy'
check launcher/report 'gpurun|report'
check launcher/commands 'gpurun|store|supervisor|control|energy|report|commands'
check worker_runtime/engine 'gpurun'
check worker_runtime/snapshot 'gpurun'
check worker_runtime/capi 'gpurun'
check worker_runtime/include 'gpurun'
check worker_runtime/src 'gpurun|comm|state|runtime|compat|data'
# Folders by process: what only training processes run lives under worker_runtime/, and no
# launcher source includes one of its headers (the gpurun executable never links it).
# worker_headers DIR: the "gpurun/…" names of the public headers under DIR's include trees.
worker_headers() {
  find "$1" -path '*/include/gpurun/*' -name '*.h*' | sed -E 's#^.*/include/(gpurun/.*)$#\1#' | sort -u
}
check_worker_only() {
  local tree=$1 workers=$2 bad
  bad=$(grep -rnE '^#include [<"]gpurun/' "$tree" --include='*.cpp' --include='*.hpp' |
    grep -F -f <(worker_headers "$workers") || true)
  if [[ -n $bad ]]; then
    echo "layering: $tree includes headers of code only training processes run ($workers):"
    echo "$bad" | sed 's/^/  /'
    fail=1
  fi
  # and no launcher target links one of its libraries
  bad=$(grep -rnE 'target_link_libraries\([^)]*gpurun_(worker_engine|snapshot|worker_runtime)\b' \
    "$tree" --include=CMakeLists.txt || true)
  if [[ -n $bad ]]; then
    echo "layering: a $tree target links a worker-only library:"
    echo "$bad" | sed 's/^/  /'
    fail=1
  fi
}
check_worker_only launcher worker_runtime
# every folder of launcher/ and worker_runtime/ is a known one (a new folder gets its rule here);
# in a git checkout the folders git tracks, so a stale copy's leftovers do not count
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  folders=$(git ls-files launcher worker_runtime | awk -F/ 'NF > 2 {print $1 "/" $2}' | sort -u)
else
  folders=$(for d in launcher/* worker_runtime/*; do [[ -d $d ]] && echo "$d"; done)
fi
for d in $folders; do
  case ${d#*/} in
  common | protocol | store | supervisor | cli | nodes | control | energy | report | commands | app) ;;
  engine | snapshot | capi | include | src | python) ;;
  *) echo "layering: $d has no rule in tests/package/layering_test.sh"; fail=1 ;;
  esac
done
# the self-test: a rule that cannot fail proves nothing
tmp=$(mktemp -d)
mkdir -p "$tmp/x"
echo '#include "supervisor/console.hpp"' >"$tmp/x/a.cpp"
(cd "$tmp" && fail=0 && check x 'gpurun' >/dev/null; [[ $fail -eq 1 ]]) ||
  { echo "layering: the check does not see a forbidden include" >&2; fail=1; }
mkdir -p "$tmp/l" "$tmp/w/engine/include/gpurun/worker"
echo '#pragma once' >"$tmp/w/engine/include/gpurun/worker/worker_engine.hpp"
echo '#include "gpurun/worker/worker_engine.hpp"' >"$tmp/l/b.cpp"
(cd "$tmp" && fail=0 && check_worker_only l w >/dev/null; [[ $fail -eq 1 ]]) ||
  { echo "layering: the check does not see a launcher source include a worker-only header" >&2; fail=1; }
rm -rf "$tmp"
[[ $fail -eq 0 ]] && echo "layering: ok"
exit $fail
