#!/usr/bin/env bash
# libFuzzer targets for the readers of untrusted input (ci/fuzz/*_fuzz.cpp): built with clang,
# libFuzzer, AddressSanitizer and UndefinedBehaviorSanitizer, each run for SECONDS from its
# corpus in ci/fuzz/corpus/TARGET (kept in the repository; what a run finds new stays in the
# build folder). A crash, a sanitizer report or a broken property is a failure: its input is
# kept as BUILD/fuzz/crash-TARGET-*, to be added to the corpus and to a test once fixed.
#
#   ci/fuzz.sh BUILD_DIR SECONDS [TARGET...]     # ./test.sh (fuzz.Short): every target, 5 s
#                                                 # each; ci/nightly.sh --fuzz 600: every one
#   ci/fuzz.sh BUILD_DIR build [TARGET...]       # builds them and runs nothing (fuzz.Build:
#                                                 # ctest's fixture, so that a cold compile of
#                                                 # twelve instrumented binaries is not charged
#                                                 # to the fuzzing run's deadline)
#
# Targets: chain (the checkpoint chain reader and the solvers on what it accepts), numbers (the
# command line's numbers), suite (the suite reader), profile (the cost-profile reader), results
# (the result-file reader of `report`), plan (the sharding-plan reader), graph (the graph
# workloads' --shape reader, through the strict JSON parser), pipeline (the schedule CSV and its
# dry run), pt2 (the torch.export reader: a program and weights config), noise (`report
# --noise`'s file), golden (a suite's golden losses), model (the checks of every model file
# before LibTorch opens it: the zip directory). The readers' own files are compiled with
# instrumentation; what they call in the built libraries (LibTorch, the harness) is not.
set -euo pipefail
build=$(cd "$1" && pwd)
secs=$2
shift 2
build_only=0
if [ "$secs" = build ]; then
  build_only=1
elif ! [[ "$secs" =~ ^[1-9][0-9]*$ ]]; then
  echo "fuzz: SECONDS must be a whole number of seconds above 0 or 'build' (got '$secs')" >&2; exit 2
fi
src=$(cd "$(dirname "$0")/.." && pwd)
targets=("$@")
all="chain numbers suite profile results plan graph pipeline pt2 noise golden model"
# shellcheck disable=SC2206
[ ${#targets[@]} -eq 0 ] && targets=($all)

command -v clang++ > /dev/null || { echo "fuzz: clang++ not found (apt-get install clang)"; exit 2; }
out="$build/fuzz"
mkdir -p "$out"
# The LibTorch the build was configured with (Debian's, or a pip wheel's on the torch2 leg):
# its headers, its libraries and the version number the sources test (SB_TORCH_VERSION_NUM).
torch_dir=$(sed -n 's/^Torch_DIR:PATH=//p' "$build/CMakeCache.txt")
version_num=$(grep -o -m1 'SB_TORCH_VERSION_NUM=[0-9]*' "$build/compile_commands.json" | cut -d= -f2)
[ -n "$torch_dir" ] && [ -n "$version_num" ] ||
  { echo "fuzz: $build is not a configured stratbench build (no Torch_DIR or SB_TORCH_VERSION_NUM)"; exit 2; }
if [ -f "$torch_dir/../../../include/torch/csrc/api/include/torch/torch.h" ]; then
  torch_root=$(cd "$torch_dir/../../.." && pwd)  # a wheel's torch/: include/ and lib/ inside
  libdir=$torch_root/lib
  torch=(-isystem "$torch_root/include" -isystem "$torch_root/include/torch/csrc/api/include")
else
  libdir=/usr/lib/$(gcc -print-multiarch)
  torch=(-isystem /usr/include/torch/csrc/api/include)
fi
flags=(-std=c++17 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
       -fno-omit-frame-pointer -D_GLIBCXX_USE_CXX11_ABI=1 -DSB_TORCH_VERSION_NUM="$version_num"
       -I"$src" -Wno-unused-command-line-argument)
ccache=$(command -v ccache || true)
rpath=(-Wl,-rpath,"$build/harness" -Wl,-rpath,"$build/strategies" -Wl,-rpath,"$build/reference"
       -Wl,-rpath,"$build/kernels" -Wl,-rpath,"$libdir")
harness=(-L"$build/harness" -lstratbench_harness -L"$build/reference" -lstratbench_reference
         -L"$build/kernels" -lstratbench_kernels -L"$libdir" -lc10 -ltorch -ltorch_cpu)

build_target() {
  local t=$1 bin="$out/$1_fuzz"
  local srcs=("$src/ci/fuzz/${t}_fuzz.cpp")
  local extra=() tflags=()
  case "$t" in
    chain) srcs+=("$src/strategies/checkpointing/chain.cpp" "$src/strategies/checkpointing/solvers.cpp") ;;
    numbers) ;;
    suite) srcs+=("$src/harness/run/suite.cpp" "$src/harness/comm/mesh.cpp")
           extra=("${torch[@]}" "${harness[@]}" -lyaml-cpp "${rpath[@]}") ;;
    profile) srcs+=("$src/harness/dist/cost_profile.cpp")
             extra=("${torch[@]}" "${harness[@]}" "${rpath[@]}") ;;
    results) srcs+=("$src/reports/results_file.cpp")
             extra=("${torch[@]}" "${harness[@]}" "${rpath[@]}") ;;
    # The plan reader, the model it reads plans of and the operator strategies it resolves
    # (instrumented; the last registers its executors, unused here); the integer program
    # (gcc's build, not instrumented) only because the model's translation unit refers to it.
    plan) srcs+=("$src/strategies/sharding/auto/"{cost_model,liveness,plan_json,plan_memory,plan_memory_backward,plan_memory_solve,program}.cpp
                 "$src/strategies/sharding/ops/"*.cpp)
          extra=("${torch[@]}" "${harness[@]}" -L"$build/strategies" -lstratbench_layout
                 "$build/strategies/libstratbench_autoshard_ilp.a"
                 $(pkg-config --libs cbc) "${rpath[@]}") ;;
    # The graph builder (instrumented) and the strict JSON parser (a header); the rest of the
    # reference library (the operators the graph names) from the build.
    graph) srcs+=("$src/reference/graph.cpp")
           extra=("${torch[@]}" "${harness[@]}" "${rpath[@]}") ;;
    # The torch.export reader (instrumented); the importer's error type from import.h.
    # UBSan's vptr check is off here: it needs the typeinfo of LibTorch's JIT types
    # (c10::DynamicType), which the library does not export.
    pt2) srcs+=("$src/reference/torchscript/export.cpp" "$src/reference/tensor_bundle.cpp")
         tflags=(-fno-sanitize=vptr)
         extra=("${torch[@]}" "${harness[@]}" "${rpath[@]}") ;;
    # The pipeline schedule reader and its dry run (no LibTorch).
    pipeline) srcs+=("$src/strategies/pipeline/schedule.cpp" "$src/strategies/pipeline/simulate.cpp") ;;
    # The noise file of `report --noise` (the comparison's reader, instrumented; the rest of
    # the report library from the build).
    noise) srcs+=("$src/reports/compare.cpp")
           extra=("$build/reports/libstratbench_reports.a" "${torch[@]}" "${harness[@]}" "${rpath[@]}") ;;
    # A suite's golden losses (`golden:`).
    golden) srcs+=("$src/harness/run/golden.cpp")
            extra=("${torch[@]}" "${harness[@]}" "${rpath[@]}") ;;
    # What every model file passes before LibTorch opens it (the zip directory's reader).
    model) srcs+=("$src/reference/torchscript/export.cpp" "$src/reference/tensor_bundle.cpp")
           tflags=(-fno-sanitize=vptr)
           extra=("${torch[@]}" "${harness[@]}" "${rpath[@]}") ;;
    *) echo "fuzz: unknown target '$t' ($all)"; exit 2 ;;
  esac
  # Rebuilt only when a source is newer than the binary.
  local newest
  newest=$(ls -t "${srcs[@]}" "$src/ci/fuzz.sh" | head -1)
  if [ ! -x "$bin" ] || [ "$newest" -nt "$bin" ]; then
    # One object a source, through ccache where it is installed (the build's own cache): a
    # clean clone's ./test.sh then spends seconds here instead of a minute and more. Paths
    # relative to the checkout (base dir, debug prefix map), so that any clone hits.
    local objs=() obj
    mkdir -p "$out/obj-$t"
    for s in "${srcs[@]}"; do
      obj="$out/obj-$t/$(basename "$s" .cpp).o"
      (cd "$src" && CCACHE_BASEDIR="$src" CCACHE_NOHASHDIR=1 $ccache clang++ "${flags[@]}" "${tflags[@]}" \
        "${torch[@]}" -fdebug-prefix-map="$src"=. -c "$s" -o "$obj")
      objs+=("$obj")
    done
    clang++ "${flags[@]}" "${tflags[@]}" "${objs[@]}" -o "$bin" "${extra[@]}" -lpthread
  fi
}

status=0
for t in "${targets[@]}"; do
  start=$SECONDS
  build_target "$t"
  if [ "$build_only" = 1 ]; then
    echo "fuzz: $t built ($((SECONDS - start)) s)"
    continue
  fi
  corpus="$src/ci/fuzz/corpus/$t"
  found="$out/corpus-$t"
  mkdir -p "$found"
  if [ "$t" = model ]; then
    # Seeds made here, not kept as binaries in the repository: a zip of stored records (as
    # torch.jit.save writes) and one with a deflated record.
    mkdir -p "$corpus"
    python3 - "$found" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1] + "/stored.pt", "w", zipfile.ZIP_STORED) as z:
    z.writestr("archive/data.pkl", b"\x80\x02}q\x00.")
    z.writestr("archive/version", b"3\n")
with zipfile.ZipFile(sys.argv[1] + "/deflated.pt", "w", zipfile.ZIP_DEFLATED) as z:
    z.writestr("archive/data/0", bytes(20000))
PY
  fi
  echo "fuzz: $t for ${secs}s ($(ls "$corpus" 2>/dev/null | wc -l) corpus inputs)"
  # Leaks are not what these targets look for: LibTorch's static state reads as leaked.
  if ! ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
      "$out/${t}_fuzz" -max_total_time="$secs" -max_len=65536 -timeout=10 -rss_limit_mb=4096 \
      -artifact_prefix="$out/crash-$t-" -print_final_stats=0 "$found" "$corpus" \
      > "$out/$t.log" 2>&1; then
    echo "fuzz: $t FAILED; the input is $out/crash-$t-*; log $out/$t.log"
    tail -30 "$out/$t.log"
    status=1
  else
    grep -E "^#[0-9]+.*DONE|Done [0-9]+ runs" "$out/$t.log" | tail -1 || true
  fi
done
exit $status
