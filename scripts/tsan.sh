#!/usr/bin/env bash
# ThreadSanitizer over the launcher's threaded parts (issue 45 item 5): builds the launcher alone
# (no LibTorch, like scripts/test.sh's sanitizer build) with -fsanitize=thread into build-tsan/
# and runs there every test of that build that runs gpurun code: the store server and its
# reactor threads (store_tests), the snapshot library and its hashing threads (snapshot_tests),
# the elastic controller, status writer, config watcher and lease keeper (control_*, sharing_*:
# the real gpurun with fake workers), the energy monitor's sampling thread (energy_*, with the
# fake NVML), the console writer, node sync, notifier and health check (supervisor_*, nodes_*,
# torchrun_cli_*), the file readers' watchdog (common_tests). Every process of those tests,
# gpurun and the fake workers included, is instrumented and writes its reports under
# build-tsan/tsan-reports/; any report fails the run, and is printed. No suppressions: none
# was needed (a third-party false positive would go in a scripts/tsan.supp, one reason a line).
#   scripts/tsan.sh                  build, then run those tests (-j4)
#   scripts/tsan.sh -R store_tests   ctest's arguments replace the selection
# Not run under TSan: the Python tests (their workers load libgpurun_worker.so, and the TSan
# runtime cannot be loaded into an uninstrumented python3), the LibTorch ones (not configured
# without LibTorch, itself uninstrumented), the package and Slurm script checks (no gpurun
# thread). Within the tests run, the RSS bounds of the store tests and the reader test's
# RLIMIT_AS cap are left out, as under ASan (gpurun/sanitizers.hpp: TSan's shadow memory).
# Under TSan two places of gpurun take another path than in every other build: a worker starts
# with a fork instead of clone(CLONE_VM | CLONE_VFORK), which TSan cannot follow (the runtime
# aborts), and a --master-addr host name is looked up by a blocking getaddrinfo instead of
# getaddrinfo_a, whose glibc thread TSan cannot see (it crashed), so without its timeout.
# Time on the 2-core CI machine, and why it is not part of CI: scripts/test.sh's header.
set -euo pipefail
cd "$(dirname "$0")/.."
stage() { echo "tsan: $1 after $SECONDS s"; }

# clang++ (setup.sh installs it), as for scripts/test.sh's ASan build (60 % of g++'s CPU time
# there); g++ where there is no clang++ or no clang TSan runtime.
cxx=c++
compiler=()
if command -v clang++ >/dev/null &&
  [[ $(clang++ -print-file-name=libclang_rt.tsan-x86_64.a) == /* ]]; then
  cxx=clang++
  compiler=(-DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang)
fi
# A build-tsan/ of the other compiler starts afresh (CMake would drop the cache and its -Ds).
if [[ -f build-tsan/CMakeCache.txt ]] &&
  ! grep -q "^CMAKE_CXX_COMPILER:[A-Z]*=.*/$cxx\$" build-tsan/CMakeCache.txt; then
  rm -rf build-tsan
fi
mkdir -p build-tsan
# -O1: clang's ThreadSanitizer page asks for -O1 or higher "to get a reasonable performance";
# -g1 (line tables) is what its reports need.
cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "${compiler[@]}" \
  -DGPURUN_SANITIZE=thread -DGPURUN_BUILD_BENCH=OFF \
  "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" \
  -DCMAKE_DISABLE_FIND_PACKAGE_Torch=ON > build-tsan/configure.log 2>&1 ||
  { cat build-tsan/configure.log; exit 1; }
nice -n 19 cmake --build build-tsan -j"$(nproc)" > build-tsan/build.log 2>&1 ||
  {
    tail -50 build-tsan/build.log
    echo "tsan: the build failed (build-tsan/build.log)" >&2
    exit 1
  }
stage "build"

reports=$PWD/build-tsan/tsan-reports
rm -rf "$reports"
mkdir -p "$reports"
# Every test of this launcher-only build but those that run no gpurun thread: the Python tests
# (their workers load libgpurun_worker.so into an uninstrumented python3), the package checks,
# the Slurm scripts (examples are not configured without LibTorch).
select=(-LE '^(python|package|slurm|examples)$')
(($#)) && select=("$@")
# log_path: each process (a test, gpurun, a fake worker) writes its reports to tsan.<pid>, so
# a race in a gpurun that a test only waits for still fails the run. halt_on_error=0: every
# race of a run is reported, not only the first.
rc=0
TSAN_OPTIONS="log_path=$reports/tsan halt_on_error=0 second_deadlock_stack=1" \
  ctest --test-dir build-tsan --output-on-failure -j4 --timeout 300 "${select[@]}" || rc=$?
stage "tests"
shopt -s nullglob
logs=("$reports"/tsan.*)
if ((${#logs[@]})); then
  cat "${logs[@]}"
  echo "tsan: ${#logs[@]} processes reported (files under $reports)" >&2
  ((rc)) || rc=1
fi
exit "$rc"
