#!/usr/bin/env bash
# No function in launcher/ over 150 lines (issue 45): scripts/longest_functions.py prints the
# longest and fails over the limit. First its self-test on a fixture with braces in literals,
# comments, default arguments and initializer lists (a scan that miscounts proves nothing).
# Usage: function_length_test.sh SOURCE_DIR
set -euo pipefail
cd "$1"
scan=scripts/longest_functions.py
fixture=tests/package/function_length
expected="   11  $fixture/sample.cpp:22  tricky
    3  $fixture/sample.cpp:18  c_entry
    3  $fixture/sample.cpp:8  Widget
    1  $fixture/sample.cpp:11  get"
got=$(python3 "$scan" "$fixture")
if [[ $got != "$expected" ]]; then
  printf 'function_length: the scan of %s says\n%s\nbut should say\n%s\n' "$fixture" "$got" "$expected"
  exit 1
fi
if python3 "$scan" --limit 10 "$fixture" >/dev/null; then
  echo "function_length: a limit of 10 lines passed $fixture, whose tricky() has 11"
  exit 1
fi
python3 "$scan" --limit 150 launcher
