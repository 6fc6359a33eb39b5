#!/usr/bin/env bash
# The reliability stages of CI (issue 8, docs/reliability.md), run by .ci/run after the main
# suite (tests/run-all.sh, which has set up the machine):
#   asan  AddressSanitizer + UndefinedBehaviorSanitizer (clang), the whole ctest suite but the
#         Python tests and the long soak, leak detection on;
#   tsan  ThreadSanitizer (gcc), the tests labelled `concurrency`;
#   fuzz  the libFuzzer targets for STRATA_FUZZ_SECONDS each (60).
# The ASan build is also the fuzz build: clang, with libFuzzer's coverage instrumentation in the
# whole tree (STRATA_FUZZ=ON), so one sanitizer build serves the test suite and the fuzzers. Clang
# builds it in about half the CPU time gcc takes with the same sanitizers, which is what keeps CI
# under 30 minutes on 2 cores. The TSan build has its own directory (build-tsan).
# Each stage prints its wall time. STRATA_RELIABILITY_STAGES picks stages ("asan tsan fuzz" by
# default; fuzz alone builds what it needs in build-asan).
#
# Why the Python tests are left out of the sanitizer runs: they load libstrata.so into Debian's
# uninstrumented python3 (and torch), where the sanitizer runtimes would have to be preloaded and
# would report the interpreter's own allocations; the library code they reach is the C API the
# C++ tests drive directly under the sanitizers.
set -euo pipefail
cd "$(dirname "$0")/.."

stages=${STRATA_RELIABILITY_STAGES:-"asan tsan fuzz"}
fuzz_seconds=${STRATA_FUZZ_SECONDS:-60}
# A fixed seed by default, so that CI explores the same inputs on every run (a failure is
# reproducible, not a lottery); STRATA_FUZZ_SEED=0 lets libFuzzer pick one.
fuzz_seed=${STRATA_FUZZ_SEED:-1}
jobs=$(nproc)
# -O1: the sanitizers' recommended level, and quicker to build than -O2. Assertions stay as in
# the main build (STRATA_ASSERT does not depend on NDEBUG).
common=(-G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
        "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG"
        "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG"
        -DSTRATA_CUDA=OFF -DSTRATA_BUILD_BENCHMARKS=OFF)
summary=()

timed() {
  local name=$1
  shift
  local start=$SECONDS
  echo "strata: == $name"
  "$@"
  summary+=("$name: $((SECONDS - start)) s")
  echo "strata: == $name done in $((SECONDS - start)) s"
}

clang=(-DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++)
asan_configure() {
  # A build-asan configured with gcc by an older version of this script: start it afresh.
  if [[ -f build-asan/CMakeCache.txt ]] && ! grep -q '^CMAKE_CXX_COMPILER:.*clang' build-asan/CMakeCache.txt; then
    rm -rf build-asan
  fi
  # STRATA_OPTIM_CODE_PAD: the CPU AdamW kernels with a placement pad (bench/adam_placement.sh)
  # must compute what they compute without it, and its jump must assemble with clang too: the
  # CpuAdam tests of this build check both.
  cmake -S . -B build-asan "${common[@]}" "${clang[@]}" -DSTRATA_SANITIZE=address,undefined \
    -DSTRATA_FUZZ=ON -DSTRATA_OPTIM_CODE_PAD=64 >/dev/null
}
asan_build() {
  asan_configure
  cmake --build build-asan -j "$jobs"
}
asan_test() {
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1 \
  UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1:suppressions=$PWD/.ci/ubsan.supp \
    ctest --test-dir build-asan --output-on-failure -j "$jobs" --timeout 900 -LE 'python|soak-long' \
      -E "$asan_excluded"
}
# Measures pinned memory as the OS reports locked pages, which ASan's no-op mlock leaves at 0.
asan_excluded='^FinetuneBench\.JsonHasEveryKeyFromOneProcessPerContender$'

# The concurrency-labelled test binaries (tests/*/CMakeLists.txt: LABELS concurrency); only these
# are built, which keeps the stage short.
tsan_targets=(api_test fault_training_test sched_test io_test memory_test optim_test telemetry_test
  storage_test model_test)
tsan_build() {
  cmake -S . -B build-tsan "${common[@]}" -DSTRATA_SANITIZE=thread >/dev/null
  cmake --build build-tsan -j "$jobs" --target "${tsan_targets[@]}"
}
tsan_test() {
  TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
    ctest --test-dir build-tsan --output-on-failure -j "$jobs" --timeout 900 -L concurrency \
      -E "$tsan_excluded"
}
# The simulator (in sched_test) is single-threaded planning code whose tests bound its CPU time;
# under TSan's slowdown those bounds fail (25 s against 10 s) without saying anything about races.
tsan_excluded='^Simulator\.'


fuzz_build() {
  asan_configure
  cmake --build build-asan -j "$jobs" --target c_api_fuzz config_fuzz
}
fuzz_run() {
  local target=$1
  local corpus=build-asan/corpus/$target artifacts=build-asan/artifacts/$target/
  mkdir -p "$corpus" "$artifacts" build-asan/test-scratch
  cp -n tests/fuzz/corpus/${target}_seeds/* "$corpus"/
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
  STRATA_TEST_DIR=$PWD/build-asan/test-scratch \
    "build-asan/tests/fuzz/$target" -max_total_time="$fuzz_seconds" -seed="$fuzz_seed" -timeout=60 \
      -rss_limit_mb=4096 -print_final_stats=1 -artifact_prefix="$artifacts" "$corpus"
}

for stage in $stages; do
  case $stage in
    asan) timed "asan build" asan_build; timed "asan tests" asan_test ;;
    tsan) timed "tsan build" tsan_build; timed "tsan tests" tsan_test ;;
    fuzz)
      timed "fuzz build" fuzz_build
      timed "fuzz c_api_fuzz ${fuzz_seconds}s" fuzz_run c_api_fuzz
      timed "fuzz config_fuzz ${fuzz_seconds}s" fuzz_run config_fuzz
      ;;
    *) echo "strata: unknown stage '$stage' (asan, tsan, fuzz)" >&2; exit 2 ;;
  esac
done
printf 'strata: reliability stages: %s\n' "${summary[@]}"
