#!/usr/bin/env bash
# Shared first step of ./run.sh and ./test.sh: installs whatever is missing, then configures
# (once) and builds one leg. Idempotent: with everything in place it costs a dpkg query, a pip
# check and a no-op ninja. Options:
#   --test        adds what only the tests need (chromium, to open the HTML report in a real
#                 headless browser; clang for the fuzz targets; PyTorch 1.13 to trace models)
#   --deps-only   installs and does not build (ci/sanitize.sh builds its own folder)
#   --leg NAME    which LibTorch to build against (docs/pytorch2.md):
#     debian      Debian's libtorch-dev 1.13 into build/ (the default; what ./run.sh uses)
#     torch2      PyTorch 2.13.0's LibTorch (pip, CPU build) into build-torch2/, every target
#     cuda        PyTorch 2.14.1's LibTorch (pip, CUDA build) and the machine's nvcc into
#                 build-cuda/: the CUDA kernels, the device layer, the CUDA allocator hooks and
#                 the nccl backend, compiled and linked (nothing runs without a GPU)
# The PyTorch 2.x legs install their PyTorch into a virtual environment of their own under
# SB_VENV_ROOT (default ~/.cache/stratbench), made with the Python 3.11 first on PATH (or
# SB_PYTHON); the versions are pinned (a version-less `pip install torch` downloads a CUDA
# build of several GB).
#
# Another LibTorch (e.g. a CUDA build inside PyTorch) is used on the debian leg when
# CMAKE_PREFIX_PATH points at it: CMAKE_PREFIX_PATH=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)').
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(build-essential cmake ninja-build ccache git pkg-config
          libtorch-dev libgloo-dev libopenblas0-openmp coinor-libcbc-dev libre2-dev
          libbenchmark-dev libgtest-dev googletest
          libyaml-cpp-dev nlohmann-json3-dev libcli11-dev libfccp-dev
          python3 python3-matplotlib)
test_deps=0 build=1 leg=debian
while [ $# -gt 0 ]; do
  case "$1" in
    --test) test_deps=1 ;;
    --deps-only) build=0 ;;
    --leg) leg=${2:-}; shift ;;
    --leg=*) leg=${1#--leg=} ;;
    *) echo "setup: unknown option '$1' (expected --test, --deps-only or --leg NAME)" >&2; exit 2 ;;
  esac
  shift
done
case "$leg" in
  debian|torch2|cuda) ;;
  *) echo "setup: unknown leg '$leg' (expected debian, torch2 or cuda)" >&2; exit 2 ;;
esac
if [ "$test_deps" = 1 ]; then
  # python3-torch / -torchvision trace the models the debian leg's import tests read (Debian's,
  # sharing the libtorch1.13 runtime); the torch2 leg traces with its own PyTorch.
  packages+=(chromium iproute2 procps clang libclang-rt-14-dev python3-torch python3-torchvision)
fi
# Debian's LibTorch is only needed when no other LibTorch was given. Gloo's headers stay: the
# torch2 leg's ProcessGroupGloo.hpp needs them (harness/CMakeLists.txt, "The gloo backend").
if [ -n "${CMAKE_PREFIX_PATH:-}" ] && [ "$leg" = debian ]; then
  packages=("${packages[@]/libtorch-dev/}")
  packages=("${packages[@]/libgloo-dev/}")
fi

missing=()
for p in "${packages[@]}"; do
  [ -z "$p" ] && continue
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
fi

# venv NAME PACKAGE==VERSION...: a virtual environment under SB_VENV_ROOT holding exactly these
# pins (made or completed once; later calls cost one `pip list`). Prints its python.
venv() {
  local name=$1
  shift
  local root=${SB_VENV_ROOT:-${XDG_CACHE_HOME:-$HOME/.cache}/stratbench}
  local dir=$root/$name py=${SB_PYTHON:-python3}
  if [ ! -x "$dir/bin/python" ]; then
    if ! "$py" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then
      echo "setup: the $leg leg needs Python 3.11 (PyTorch's wheels on this machine are for it);" \
           "'$py' is $("$py" --version 2>&1): set SB_PYTHON" >&2
      exit 2
    fi
    mkdir -p "$root"
    "$py" -m venv "$dir" >&2
  fi
  local have
  have=$("$dir/bin/pip" list --format=freeze 2>/dev/null | sed 's/+[^ ]*$//')
  local need=()
  for pin in "$@"; do grep -qix "$pin" <<<"$have" || need+=("$pin"); done
  if [ ${#need[@]} -gt 0 ]; then
    echo "setup: installing ${need[*]} into $dir" >&2
    # (this machine's pip configuration names local indexes that may be absent: not news)
    local log rc=0
    log=$(mktemp)
    "$dir/bin/pip" install -q --disable-pip-version-check "$@" >"$log" 2>&1 || rc=$?
    grep -v "^WARNING: Location '.*' is ignored" "$log" >&2 || true
    rm -f "$log"
    [ "$rc" = 0 ] || { echo "setup: pip could not install $* (exit $rc)" >&2; exit 2; }
  fi
  echo "$dir/bin/python"
}

# torch_paths PYTHON: that PyTorch's CMake prefix and its lib/ folder, on one line each.
torch_paths() {
  "$1" -c 'import os, torch; print(torch.utils.cmake_prefix_path); print(os.path.join(os.path.dirname(torch.__file__), "lib"))'
}

[ "$build" = 1 ] || [ "$leg" != debian ] || exit 0
jobs=$(nproc)
case "$leg" in
  debian)
    if [ ! -f build/build.ninja ]; then
      cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
        ${CMAKE_PREFIX_PATH:+-DCMAKE_PREFIX_PATH="$CMAKE_PREFIX_PATH"} >/dev/null
    fi
    # ./run.sh needs the command alone; the test binaries are ./test.sh's (--test).
    names=()
    [ "$test_deps" = 1 ] || names=(stratbench stratbench-core)
    targets=()
    [ ${#names[@]} = 0 ] || targets=(--target "${names[@]}")
    if [ ! -x build/stratbench-core ]; then
      steps=$(ninja -C build -t commands "${names[@]}" 2>/dev/null | wc -l)
      # About 15 core-seconds a step on this project (LibTorch's headers; docs/measurements.md).
      echo "setup: first build: $steps compile and link steps, roughly $(( (steps * 15 / jobs + 59) / 60 ))" \
           "minutes on $jobs cores (ccache makes later ones seconds); ninja's [n/$steps] shows the progress"
    fi
    cmake --build build -j "$jobs" "${targets[@]}"
    ;;
  torch2)
    # torchvision 0.28.0 is 2.13.0's pair; PyPI's is built for a CUDA torch, so its C++ operators
    # do not load beside the CPU build: trace_models.py uses its Python models only.
    py=$(venv torch2.13 torch==2.13.0 torchvision==0.28.0)
    [ "$build" = 1 ] || exit 0
    if [ ! -f build-torch2/build.ninja ]; then
      { read -r prefix; read -r libdir; } < <(torch_paths "$py")
      # CMAKE_LIBRARY_PATH: TorchConfig's find_library would take Debian's libc10.so (in the
      # system's folders, searched before the wheel's) for the wheel's.
      cmake -S . -B build-torch2 -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSB_WITH_CUDA=OFF \
        -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_LIBRARY_PATH="$libdir" \
        -DSB_TRACE_PYTHON="$py" >/dev/null
    fi
    cmake --build build-torch2 -j "$jobs"
    ;;
  cuda)
    py=$(venv torch2.14-cuda torch==2.14.1)
    [ "$build" = 1 ] || exit 0
    # The toolkit's own nvcc (a wrapper on PATH would make PyTorch's FindCUDA look for the
    # toolkit beside the wrapper).
    nvcc=${CUDACXX:-/usr/local/cuda/bin/nvcc}
    [ -x "$nvcc" ] || nvcc=$(command -v nvcc || true)
    if [ -z "$nvcc" ] || [ ! -x "$nvcc" ]; then
      echo "setup: the cuda leg needs nvcc (the CUDA Toolkit): none in /usr/local/cuda/bin," \
           "on PATH or in CUDACXX" >&2
      exit 2
    fi
    # NVRTC, which LibTorch's CUDA side links: the wheel's (the toolkit here may lack it).
    nvrtc=$("$py" -c 'import glob, os, torch; d = os.path.join(os.path.dirname(torch.__file__), "..", "nvidia"); print(next(iter(sorted(glob.glob(d + "/*/lib/libnvrtc.so.*"))), ""))')
    if [ ! -f build-cuda/build.ninja ]; then
      { read -r prefix; read -r libdir; } < <(torch_paths "$py")
      cmake -S . -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
        -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_LIBRARY_PATH="$libdir" \
        -DCMAKE_CUDA_COMPILER="$nvcc" -DCUDA_TOOLKIT_ROOT_DIR="$(dirname "$(dirname "$nvcc")")" \
        -DCUDA_nvrtc_LIBRARY="$nvrtc" -DCUDA_NVRTC_LIB="$nvrtc" \
        -DSB_REQUIRE_CUDA=ON >/dev/null
    fi
    # What holds the GPU side: the kernels (kernels/*.cu and their CPU twins), the harness (the
    # device layer, the CUDA allocator's hooks, the nccl backend) and their GPU test binaries.
    cmake --build build-cuda -j "$jobs" --target stratbench_kernels stratbench_harness \
      kernels_gpu_tests harness_gpu_tests
    ;;
esac
