#!/usr/bin/env bash
# On a GPU machine: builds stratbench against the CUDA LibTorch of its PyTorch, with the Debian
# packages ci/gpu/fetch_deps.sh downloaded into .debs (carried with the checkout; unpacked with
# `dpkg -x` into a private prefix, never into /), then runs the GPU checks:
#   1. the CUDA kernels' tests (label gpu) against their CPU implementations;
#   2. the unit tests (every family's executors and the harness, on this LibTorch);
#   3. suites/gpu.yaml on `threads` (every rank of a mesh on the one GPU, each on its own
#      stream) and on `nccl` (one process per GPU through `stratbench launch`);
#   4. the report of both runs;
#   5. (step `trace`) the rows of the threads run whose memory was mispredicted, rerun with
#      SB_MEMORY_TRACE=0: what is live at each one's peak, by the operator that allocated it
#      (reports/memory_trace.py), the terms the GPU's memory models lack.
# Logs, results and the report go to out/gpu; where $OUT is set (a lent GPU machine returns
# what is under it, a few files), only the archive gpu-run.tgz of all of them and the summary
# tables, summary.txt, go there. Every step runs under its own time limit, so that a hung step still
# leaves the others' results.
#
# Usage: ci/gpu/run.sh [STEPS]   STEPS: any of build,kernels,unit,threads,nccl,report,trace
#                                 (default: all, in that order)
# SB_GPU_DEADLINE (seconds, default 560) bounds the whole script: each step's limit is cut to
# what is left of it less a reserve for the report and the archive, so a lent machine's call
# limit never kills the script before it has packed what it has.
set -uo pipefail
started=$SECONDS
deadline=${SB_GPU_DEADLINE:-560}
# limit SECONDS: the step's own limit, or what is left before the deadline less 30 s.
limit() {
  local left=$((deadline - (SECONDS - started) - 30))
  ((left < 5)) && left=5
  echo $(($1 < left ? $1 : left))
}
cd "$(dirname "$0")/../.."
src=$PWD
out=$src/out/gpu
mkdir -p "$out"
steps=${1:-build,kernels,unit,threads,nccl,report,trace}
has() { [[ ",$steps," == *",$1,"* ]]; }
log=$out/logs
mkdir -p "$log"
step() { echo "=== $* ($(date +%T))"; }

deps=${SB_GPU_DEPS:-/tmp/sbdeps}
lib=$deps/usr/lib/x86_64-linux-gnu
if [[ ! -d $deps/usr ]]; then
  step "unpacking $(ls .debs/*.deb 2>/dev/null | wc -l) carried packages into $deps"
  mkdir -p "$deps"
  for f in .debs/*.deb; do dpkg -x "$f" "$deps"; done
  # What Debian's alternatives and multiarch symlinks would have made.
  for l in blas lapack; do
    ln -sf "$l/lib$l.so.3" "$lib/lib$l.so.3"
    ln -sf "lib$l.so.3" "$lib/lib$l.so"
    ln -sf "$l-netlib.pc" "$lib/pkgconfig/$l.pc"
  done
fi
export LD_LIBRARY_PATH=$lib:$lib/blas:$lib/lapack${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PKG_CONFIG_SYSROOT_DIR=$deps
export PKG_CONFIG_LIBDIR=$lib/pkgconfig:$deps/usr/share/pkgconfig
torch_prefix=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')
build=${SB_GPU_BUILD:-$src/build-gpu}
suite=${SB_GPU_SUITE:-suites/gpu.yaml}
sb=$build/stratbench

if has build; then
  step "configure (LibTorch $(python3 -c 'import torch; print(torch.__version__)'))"
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader
  cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_PREFIX_PATH="$torch_prefix;$deps/usr" -DPKG_CONFIG_EXECUTABLE="$deps/usr/bin/pkgconf" \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_CUDA_COMPILER="$(command -v nvcc)" \
    >"$log/configure.log" 2>&1
  rc=$?
  grep -E "stratbench:|CUDA|Error|error" "$log/configure.log" | head -30
  if ((rc != 0)); then
    tail -40 "$log/configure.log"
    exit 1
  fi
  step "build"
  # What the GPU checks use (not the fuzzers, benchmarks and report tests).
  timeout "$(limit "${SB_GPU_BUILD_TIMEOUT:-420}")" cmake --build "$build" -j "$(nproc)" --target stratbench \
    stratbench-core kernels_gpu_tests harness_gpu_tests strategies_gpu_tests kernels_tests harness_tests \
    strategies_tests layout_tests -- -k 0 >"$log/build.log" 2>&1
  rc=$?
  grep -E "error|FAILED" "$log/build.log" | head -40
  tail -3 "$log/build.log"
  ((rc == 0)) || echo "build failed ($rc); the steps below use whatever was built"
fi

if has kernels; then
  step "GPU tests: the CUDA kernels against their CPU implementations, the device layer, executors"
  for t in kernels/kernels_gpu_tests harness/harness_gpu_tests strategies/strategies_gpu_tests; do
    [[ -x $build/$t ]] || { echo "missing $t"; continue; }
    timeout "$(limit 180)" "$build/$t" >"$log/$(basename "$t").log" 2>&1
    echo "$t: exit $?"
    grep -E '^\[  (FAILED|PASSED|SKIPPED) ' "$log/$(basename "$t").log" | head -12
  done
fi

if has unit; then
  step "unit tests"
  for t in strategies/strategies_tests strategies/layout_tests harness/harness_tests kernels/kernels_tests; do
    [[ -x $build/$t ]] || { echo "missing $t"; continue; }
    timeout "$(limit 240)" "$build/$t" --gtest_brief=1 >"$log/$(basename "$t").log" 2>&1
    echo "$t: exit $? ($(grep -cE '^\[  FAILED  \]' "$log/$(basename "$t").log") failed)"
    grep -E '^\[  FAILED  \]' "$log/$(basename "$t").log" | head -10
  done
fi

if has threads; then
  step "suites/gpu.yaml on threads"
  timeout "$(limit "${SB_GPU_THREADS_TIMEOUT:-600}")" "$sb" run "$suite" --timeout 60 ${SB_GPU_RUN_ARGS:-} --out "$out/threads" \
    >"$log/threads.log" 2>&1
  echo "exit $?"
  tail -25 "$log/threads.log"
fi

if has nccl; then
  step "suites/gpu.yaml on nccl ($(nvidia-smi -L | wc -l) GPU)"
  n=$(nvidia-smi -L | wc -l)
  timeout "$(limit "${SB_GPU_NCCL_TIMEOUT:-300}")" "$sb" launch -n "$n" -- run "$suite" --backend nccl --timeout 60 ${SB_GPU_RUN_ARGS:-} \
    --out "$out/nccl" \
    >"$log/nccl.log" 2>&1
  echo "exit $?"
  tail -15 "$log/nccl.log"
fi

if has report; then
  step "report"
  "$sb" list >/dev/null 2>&1
  echo "stratbench list: exit $?"
  for r in threads nccl; do
    [[ -f $out/$r/results.csv || -f $out/$r/results.partial.csv ]] || continue
    if [[ ! -f $out/$r/results.csv ]]; then
      cp "$out/$r/results.partial.csv" "$out/$r/results.csv"
      [[ -f $out/$r/results.partial.json ]] && cp "$out/$r/results.partial.json" "$out/$r/results.json"
    fi
    timeout 120 "$sb" report "$out/$r" --no-plots >"$log/report-$r.log" 2>&1
    echo "report $r: exit $?"
  done
  python3 "$src/ci/gpu/summary.py" "$out" | tee "$out/summary.txt"
fi

if has trace && [[ -f $out/threads/results.csv || -f $out/threads/results.partial.csv ]]; then
  step "memory traces of the mispredicted rows"
  res=$out/threads/results.csv
  [[ -f $res ]] || res=$out/threads/results.partial.csv
  mkdir -p "$out/trace"
  python3 - "$res" >"$out/trace/ids.txt" <<'PY'
import csv, re, sys
rows = [r for r in csv.DictReader(open(sys.argv[1])) if "memory" in (r.get("mispredicted") or "")]
for i in sorted({r["strategy_id"] for r in rows}):
    print(i)
PY
  echo "$(wc -l <"$out/trace/ids.txt") strategies with a mispredicted row"
  n=0
  while read -r id; do
    n=$((n + 1))
    # One run per strategy, every case of the suite that has it, rank 0 traced.
    SB_MEMORY_TRACE=0 timeout "$(limit 120)" "$sb" run "$suite" --timeout 60 \
      --filter "^$(printf '%s' "$id" | sed 's/[][\.*^$+?(){}|]/\\&/g')\$" --repetitions 1 \
      --min-time 0.001 --out "$out/trace/run$n" >/dev/null 2>"$out/trace/trace$n.txt"
    echo "$id: exit $?"
    python3 "$src/reports/memory_trace.py" "$out/trace/trace$n.txt" \
      --results "$out/trace/run$n/results.csv" >"$out/trace/peaks$n.txt" 2>&1
    # The traces themselves are large; what is live at the peaks is what comes back.
    gzip -f "$out/trace/trace$n.txt"
  done <"$out/trace/ids.txt"
  cat "$out"/trace/peaks*.txt >"$out/trace-peaks.txt" 2>/dev/null
fi

tar -C "$out" -czf "$src/out/gpu-run.tgz" . && mv "$src/out/gpu-run.tgz" "$out/"
if [[ -n ${OUT:-} ]]; then
  cp "$out/gpu-run.tgz" "$OUT/"
  [[ -f $out/summary.txt ]] && cp "$out/summary.txt" "$OUT/"
  [[ -f $out/trace-peaks.txt ]] && cp "$out/trace-peaks.txt" "$OUT/"
fi
ls -la "$out"
