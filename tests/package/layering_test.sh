#!/usr/bin/env bash
# The dependency rule of docs/architecture.md, checked on the sources: each directory may
# include (as "dir/…", or <dir/…> for a launcher folder) only the layers below it. Public
# libraries use only "gpurun/…" and their own private directories. Usage: layering_test.sh SOURCE_DIR
set -euo pipefail
cd "$1"
root=$PWD
fail=0
# the files whose includes count: sources, headers and their inline parts
SOURCES=(--include='*.cpp' --include='*.hpp' --include='*.h' --include='*.ipp' --include='*.inl')
# gpurun's launcher folders: <control/…> compiles too (launcher/ is a public include
# directory), so the angle form of these names is checked like "control/…"; <sys/…>,
# <boost/…>, <fmt/…> and the other system headers are not
LAUNCHER_FOLDERS='common|protocol|store|supervisor|cli|nodes|control|energy|report|commands|app'
INCLUDE='#[[:space:]]*include[[:space:]]*'
# check DIR ALLOWED_REGEX: every #include "x/…" (or <x/…> with x a launcher folder) under DIR
# must have x matching ALLOWED_REGEX
check() {
  local dir=$1 allowed=$2 bad
  bad=$(grep -rnE "^[[:space:]]*$INCLUDE(\"[a-z0-9_]+/|<($LAUNCHER_FOLDERS)/)" "$dir" "${SOURCES[@]}" |
    grep -vE "${INCLUDE}[\"<]($allowed)/" || true)
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
# launcher/app (the gpurun executable: it builds and wires every part) may include every
# launcher folder, and only those
check launcher/app "gpurun|$LAUNCHER_FOLDERS"
check worker_runtime/engine 'gpurun'
check worker_runtime/snapshot 'gpurun'
check worker_runtime/capi 'gpurun'
check worker_runtime/include 'gpurun'
check worker_runtime/src 'gpurun|comm|state|runtime|compat|data'
# check_relative TREE…: no include climbs out of its folder ("../…"): it would dodge the rules above
check_relative() {
  local bad
  bad=$(grep -rnE "^[[:space:]]*${INCLUDE}[\"<]([^\">]*/)?\.\./" "$@" "${SOURCES[@]}" || true)
  if [[ -n $bad ]]; then
    echo "layering: an include climbs out of its folder (\"../…\"); include it by its folder:"
    echo "$bad" | sed 's/^/  /'
    fail=1
  fi
}
check_relative launcher worker_runtime
# Folders by process: what only training processes run lives under worker_runtime/, and no
# launcher source includes one of its headers (the gpurun executable never links it).
# worker_headers DIR: the "gpurun/…" names of the public headers under DIR's include trees.
worker_headers() {
  find "$1" -path '*/include/gpurun/*' -name '*.h*' | sed -E 's#^.*/include/(gpurun/.*)$#\1#' | sort -u
}
check_worker_includes() {
  local tree=$1 workers=$2 bad
  bad=$(grep -rnE "^[[:space:]]*${INCLUDE}[<\"]gpurun/" "$tree" "${SOURCES[@]}" |
    grep -F -f <(worker_headers "$workers") || true)
  if [[ -n $bad ]]; then
    echo "layering: $tree includes headers of code only training processes run ($workers):"
    echo "$bad" | sed 's/^/  /'
    fail=1
  fi
}
# worker_libraries DIR: the libraries DIR's CMakeLists.txt files define, aliases included
# (gpurun_worker_engine, gpurun::worker_engine, gpurun_snapshot, gpurun_worker, …)
worker_libraries() {
  find "$1" -name CMakeLists.txt -exec cat {} + |
    sed -nE 's/^[[:space:]]*add_library\([[:space:]]*([A-Za-z0-9_:]+).*/\1/p' | sort -u
}
# link_calls TREE: every target_link_libraries(…) call under TREE, read whole up to its closing
# parenthesis (the libraries are on the following lines), as "FILE:LINE:<tab>the libraries" on one
# line, the target itself left out (add_dependencies(gpurun gpurun_worker) only builds one)
link_calls() {
  find "$1" -name CMakeLists.txt -exec perl -0777 -ne '
    s/#[^\n]*//g;  # comments
    while (/\btarget_link_libraries\s*(\(((?:[^()]++|(?1))*)\))/gi) {
      my ($args, $at) = ($2, $-[0]);
      my $line = 1 + (substr($_, 0, $at) =~ tr/\n//);
      $args =~ s/^\s*\S+//;  # the target
      $args =~ s/\s+/ /g;
      print "$ARGV:$line:\t$args\n";
    }' {} +
}
check_worker_links() {
  local tree=$1 workers=$2 bad names
  names=$(worker_libraries "$workers" | sed 's/[.]/\\./g' | paste -sd'|')
  [[ -n $names ]] || { echo "layering: no libraries found under $workers"; fail=1; return; }
  bad=$(link_calls "$tree" | grep -E $'\t'"(.*[^A-Za-z0-9_])?($names)([^A-Za-z0-9_:]|\$)" || true)
  if [[ -n $bad ]]; then
    echo "layering: a $tree target links a worker-only library (one of $workers's):"
    echo "$bad" | tr '\t' ' ' | sed 's/^/  /'
    fail=1
  fi
}
check_worker_includes launcher worker_runtime
check_worker_links launcher worker_runtime
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
# The self-test: a rule that cannot fail proves nothing. Each case writes a tree that breaks
# (or keeps) one rule in $tmp and runs the check there.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# expect_report WHAT CHECK ARGS…: the check, run in $tmp, must report a breach
expect_report() {
  local what=$1
  shift
  (cd "$tmp" && fail=0 && "$@" >/dev/null; [[ $fail -eq 1 ]]) ||
    { echo "layering: the check does not see $what" >&2; fail=1; }
}
# expect_quiet WHAT CHECK ARGS…: the check, run in $tmp, must report nothing
expect_quiet() {
  local what=$1
  shift
  (cd "$tmp" && fail=0 && "$@" >/dev/null; [[ $fail -eq 0 ]]) ||
    { echo "layering: the check reports $what, which the rules allow" >&2; fail=1; }
}
# put FILE LINE…: write the lines to $tmp/FILE
put() {
  local file=$tmp/$1
  shift
  mkdir -p "$(dirname "$file")"
  printf '%s\n' "$@" >"$file"
}
put x/a.cpp '#include "supervisor/console.hpp"'
expect_report 'a forbidden include' check x 'gpurun'
put angle/a.cpp '#include <control/config.hpp>'
expect_report 'a forbidden include in the angle form <control/…>' check angle 'gpurun'
put system/a.cpp '#include <sys/stat.h>' '#include <boost/asio/post.hpp>' '#include <fmt/format.h>' \
  '#include <gpurun/error.hpp>'
expect_quiet 'system headers (<sys/…>, <boost/…>, <fmt/…>)' check system 'gpurun'
for ext in h ipp inl; do
  put "ext_$ext/a.$ext" '#  include "supervisor/console.hpp"'
  expect_report "a forbidden include in a .$ext file" check "ext_$ext" 'gpurun'
done
put app/a.cpp '#include "control/config.hpp"' '#include <energy/monitor.hpp>' '#include "app/job.hpp"'
expect_quiet 'launcher/app including a launcher folder' check app "gpurun|$LAUNCHER_FOLDERS"
put app2/a.cpp '#include "comm/gloo_comm.hpp"'
expect_report 'launcher/app including a worker_runtime private folder' check app2 "gpurun|$LAUNCHER_FOLDERS"
put up/a.hpp '#include "../control/config.hpp"'
expect_report 'an include climbing out of its folder ("../")' check_relative up
put up2/a.cpp '#include <nodes/../control/config.hpp>'
expect_report 'an include climbing out through a folder (<nodes/../…>)' check_relative up2
put w/engine/include/gpurun/worker/worker_engine.hpp '#pragma once'
put l/b.cpp '#include "gpurun/worker/worker_engine.hpp"'
expect_report 'a launcher source include a worker-only header' check_worker_includes l w
put l2/b.inl '#include <gpurun/worker/worker_engine.hpp>'
expect_report 'a launcher .inl file include a worker-only header' check_worker_includes l2 w
# the link check, against the libraries the real worker_runtime/ defines
i=0
for lib in gpurun_worker_engine gpurun_snapshot gpurun_worker_runtime gpurun::worker_engine \
  gpurun::snapshot gpurun::worker_runtime gpurun_worker '$<BUILD_INTERFACE:gpurun_snapshot>'; do
  i=$((i + 1))
  put "link$i/control/CMakeLists.txt" 'add_library(gpurun_control STATIC config.cpp)' \
    'target_link_libraries(gpurun_control' \
    '  PUBLIC gpurun_protocol gpurun_supervisor' "         $lib \${GPURUN_FMT}" \
    '  PRIVATE gpurun_warnings)'
  expect_report "a launcher target link $lib on a line after target_link_libraries(" \
    check_worker_links "link$i" "$root/worker_runtime"
done
put linkok/app/CMakeLists.txt 'add_executable(gpurun main.cpp)' \
  'add_dependencies(gpurun gpurun_worker gpurun_simulated_nvml)' \
  'target_link_libraries(gpurun PRIVATE gpurun_commands gpurun_control  # not gpurun_worker' \
  '  gpurun_store gpurun_protocol $<BUILD_INTERFACE:gpurun_warnings>)'
expect_quiet 'add_dependencies(gpurun gpurun_worker) or a comment' check_worker_links linkok "$root/worker_runtime"
[[ $fail -eq 0 ]] && echo "layering: ok"
exit $fail
