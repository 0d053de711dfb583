#!/usr/bin/env bash
# An AddressSanitizer + UndefinedBehaviorSanitizer build of stratbench and its unit tests, run
# on the unit tests and a small suite. Its own build folder (default build-asan/); about three
# times the normal build's time on 2 cores, so it is not part of ./test.sh.
#
#   ci/sanitize.sh [BUILD_DIR]
#
# LibTorch itself is not instrumented (Debian's build); everything of stratbench is. Leak
# reports are off: LibTorch's static state reads as leaked. Any other report fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-asan}
ci/setup.sh --deps-only > /dev/null
if [ ! -f "$build/build.ninja" ]; then
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG=-g1 -DSB_WITH_CUDA=OFF \
    -DCMAKE_CXX_FLAGS="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -O1" \
    -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" \
    -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=address,undefined" > /dev/null
fi
cmake --build "$build" -j "$(nproc)"
export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:detect_odr_violation=0
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
# The unit tests (GoogleTest binaries), then a small suite end to end on threads.
status=0
for t in harness/dist_env_tests harness/harness_tests kernels/kernels_tests \
         strategies/checkpoint_solver_tests strategies/autoshard_ilp_tests strategies/layout_tests \
         strategies/strategies_tests strategies/pipeline_schedule_tests reports/reports_tests; do
  echo "sanitize: $t"
  "$build/$t" --gtest_brief=1 > "$build/sanitize-$(basename "$t").log" 2>&1 || {
    echo "sanitize: $t FAILED (log: $build/sanitize-$(basename "$t").log)"
    tail -40 "$build/sanitize-$(basename "$t").log"
    status=1
  }
done
echo "sanitize: suites/smoke.yaml"
"$build/stratbench" run suites/smoke.yaml --out "$build/sanitize-smoke" --repetitions 1 \
  --min-time 0.0001 > "$build/sanitize-smoke.log" 2>&1 || {
  echo "sanitize: the smoke suite FAILED (log: $build/sanitize-smoke.log)"
  tail -40 "$build/sanitize-smoke.log"
  status=1
}
exit $status
