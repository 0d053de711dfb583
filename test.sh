#!/usr/bin/env bash
# Set up, build and test every leg (docs/pytorch2.md), each in its own build folder sharing
# ccache:
#   debian   Debian's LibTorch 1.13 (build/): every test through ctest
#   torch2   PyTorch 2.13.0's LibTorch, CPU (build-torch2/): every test through ctest
#   cuda     PyTorch 2.14.1's CUDA LibTorch and nvcc (build-cuda/): the GPU side compiled and
#            linked; nothing runs without a GPU
# SB_LEGS picks legs (default "debian torch2 cuda"; e.g. SB_LEGS=debian ./test.sh). Extra
# arguments go to each ctest, e.g. ./test.sh -R strategies_tests (GoogleTest binaries run as
# shards; for one case: build/strategies/strategies_tests --gtest_filter='PlantedFault.*').
# Every leg runs even when an earlier one failed; the exit code is 1 if any failed.
set -uo pipefail
cd "$(dirname "$0")"
# The rooms include only rooms below them (docs/architecture.md): seconds, before the build.
ci/check_includes.sh || exit 1
# ctest runs as many tests at once as there are cores, each with as many intra-op threads: an
# OpenMP thread spinning at a barrier for a sibling that another test holds off its core made
# whole tests 10-17 times slower (imported.Checkpoint 21 s alone, 304 s beside zoo.Half1, past its
# timeout in CI). Threads that sleep at once cost about 40 % alone and win that back many times
# over beside another test (docs/measurements.md). A value given here is kept.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
legs=${SB_LEGS:-debian torch2 cuda}
failed=()
summary=()
for leg in $legs; do
  case "$leg" in
    debian) dir=build ;;
    torch2) dir=build-torch2 ;;
    cuda) dir=build-cuda ;;
    *) echo "test.sh: unknown leg '$leg' in SB_LEGS (expected debian, torch2 or cuda)" >&2; exit 2 ;;
  esac
  echo "=== leg $leg ($dir)"
  start=$SECONDS
  if ! ci/setup.sh --test --leg "$leg"; then
    failed+=("$leg (setup or build)")
    summary+=("$leg: setup or build failed after $((SECONDS - start)) s")
    continue
  fi
  built=$((SECONDS - start))
  rc=0
  if [ "$leg" != cuda ]; then
    (cd "$dir" && ctest --output-on-failure -j "$(nproc)" --timeout 600 "$@") || rc=$?
  fi
  [ "$rc" = 0 ] || failed+=("$leg (tests)")
  if [ "$leg" = cuda ]; then
    summary+=("$leg: set up and built in $built s (build only: no test runs without a GPU)")
  else
    summary+=("$leg: set up and built in $built s, tested in $((SECONDS - start - built)) s$([ "$rc" = 0 ] || echo ', FAILED')")
  fi
done
echo "=== legs"
printf '%s\n' "${summary[@]}"
if [ ${#failed[@]} -gt 0 ]; then
  echo "failed: ${failed[*]}"
  exit 1
fi
