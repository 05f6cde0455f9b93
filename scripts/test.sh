#!/usr/bin/env bash
# Installs dependencies if needed, checks formatting, builds, and runs every unit and integration
# test; then builds the launcher alone (no LibTorch) with AddressSanitizer + UndefinedBehavior-
# Sanitizer into build-asan/ and runs its tests there.
#   GPURUN_SKIP_SANITIZE=1 scripts/test.sh   skips the sanitizer build
# ThreadSanitizer (scripts/tsan.sh, build-tsan/) is not run here: it does not fit CI's 11 of
# 12 minutes. Measured 2026-12-06 on the 2-core machine with other jobs beside it: its clean
# build 242 s of CPU (323 s of wall time; the ASan build here is 151 s alone), its 130 tests
# 67-84 s of wall time after it (two runs). CI took 9.1-10.4 minutes without it, and the ASan
# build already takes the CPU the main tests leave (nothing of it left after them), so the
# TSan build would run on after the main tests (up to ~2 min) and its tests add 1.1-1.4:
# about 12-14 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
# Where the time goes (CI's budget is 15 minutes on 2 cores): one line per stage.
stage() { echo "test: $1 after $SECONDS s"; }

# The format check comes first (about 7 s); clang-format itself is one of setup.sh's packages,
# so on a fresh machine the check runs right after setup.sh has installed it.
format_checked=0
if command -v clang-format >/dev/null; then
  scripts/format.sh --check
  format_checked=1
fi
# bench/'s programs are not built here: no test runs them, and on the 2-core CI machine they
# were 93 s of the build's 917 s of compile CPU (~45 s of wall time). The GPU runs build them.
GPURUN_BUILD_BENCH=OFF scripts/setup.sh
((format_checked)) || scripts/format.sh --check
stage "set-up and build"

sanitize=1
[[ "${GPURUN_SKIP_SANITIZE:-0}" == 1 ]] && sanitize=0
asan_pid=
if ((sanitize)); then
  # Launcher-only: CMAKE_DISABLE_FIND_PACKAGE_Torch turns GPURUN_HAVE_TORCH off, so the worker
  # runtime's torch parts, the examples and the torch tests are not configured (and LibTorch,
  # itself built without sanitizers, stays out of the instrumented binaries).
  # -O0 -g1 (line tables): what the sanitizers need for their reports. On the 2-core CI
  # machine -O1 made this build (~470 s beside the main tests) the critical path, 160 s past
  # them; -O0 halves its compile (the largest unit 30 -> 14 s; the whole build alone 151 s)
  # and its tests took 97 s instead of 91.
  # clang (setup.sh installs it): this build took 437 s of CPU with g++ and 276 with clang++
  # (2 cores, alone); its UBSan also checks calls through function pointers. g++ where there
  # is no clang++ or no clang ASan runtime (libclang-rt-dev).
  cxx=c++
  compiler=()
  if command -v clang++ >/dev/null &&
    [[ $(clang++ -print-file-name=libclang_rt.asan-x86_64.a) == /* ]]; then
    cxx=clang++
    compiler=(-DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang)
  fi
  # A build-asan/ of the other compiler starts afresh: CMake would drop the cache, and with it
  # every -D below, for one unsanitized run.
  if [[ -f build-asan/CMakeCache.txt ]] &&
    ! grep -q "^CMAKE_CXX_COMPILER:[A-Z]*=.*/$cxx\$" build-asan/CMakeCache.txt; then
    rm -rf build-asan
  fi
  mkdir -p build-asan
  cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "${compiler[@]}" \
    -DGPURUN_SANITIZE=address,undefined -DGPURUN_BUILD_BENCH=OFF \
    "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O0 -g1 -DNDEBUG" \
    -DCMAKE_DISABLE_FIND_PACKAGE_Torch=ON > build-asan/configure.log 2>&1 ||
    { cat build-asan/configure.log; exit 1; }
  # Built while the main tests run, at the lowest priority: most of those tests wait on
  # epochs and processes, and the build takes what CPU they leave (the tests keep theirs).
  nice -n 19 cmake --build build-asan -j"$(nproc)" > build-asan/build.log 2>&1 &
  asan_pid=$!
fi

main_rc=0
# -j4: a CPU-bound test takes two slots (PROCESSORS 2, tests/CMakeLists.txt), so at most two
# of those run at once; the tests that mostly wait run beside them.
# Label "extended": cases whose mechanism another CI case covers too (elastic nodes: a lone
# leave or kill, which python_nodes_two_to_three_to_two and _global_batch also do; the same
# cases across network namespaces but the snapshot copy). Run them with
# `ctest --test-dir build -L extended` (about 70 s on 2 cores); CI leaves them out for its
# 12-minute budget.
ctest --test-dir build --output-on-failure -j4 --timeout 300 -LE extended || main_rc=$?
stage "main tests"

if ((sanitize)); then
  asan_rc=0
  wait "$asan_pid" || asan_rc=$?
  stage "sanitizer build"
  if ((asan_rc)); then
    tail -50 build-asan/build.log
    echo "test: the sanitizer build failed (exit $asan_rc; build-asan/build.log)" >&2
    exit 1
  fi
  ((main_rc == 0)) || exit "$main_rc"
  # package_consumer_test and main_job_demo need the LibTorch build (they are not configured
  # here anyway; the -E keeps it so should that change). The Python tests (label python) ran
  # in the main build: their workers load libgpurun_worker.so, which an instrumented build
  # cannot load into an uninstrumented python3.
  # -j4: most of these tests wait on processes and timers (15 s faster than -j2 on two cores).
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
    UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    ctest --test-dir build-asan --output-on-failure -j4 --timeout 300 \
    -E '^(package_consumer_test|main_job_demo)$' -LE python
  stage "sanitizer tests"
fi
exit "$main_rc"
