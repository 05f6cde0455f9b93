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
check launcher/snapshot 'gpurun'
check launcher/store 'gpurun|store'
check launcher/supervisor 'gpurun|supervisor'
check launcher/control 'gpurun|store|supervisor|control'
check launcher/energy 'gpurun|supervisor|energy'
check launcher/report 'gpurun|report'
check launcher/commands 'gpurun|store|supervisor|control|energy|report|commands'
check worker_runtime/include 'gpurun'
check worker_runtime/src 'gpurun|comm|state|runtime|compat|data'
# the self-test: a rule that cannot fail proves nothing
tmp=$(mktemp -d)
mkdir -p "$tmp/x"
echo '#include "supervisor/console.hpp"' >"$tmp/x/a.cpp"
(cd "$tmp" && fail=0 && check x 'gpurun' >/dev/null; [[ $fail -eq 1 ]]) ||
  { echo "layering: the check does not see a forbidden include" >&2; fail=1; }
rm -rf "$tmp"
[[ $fail -eq 0 ]] && echo "layering: ok"
exit $fail
