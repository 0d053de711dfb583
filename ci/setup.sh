#!/usr/bin/env bash
# Shared first step of ./run.sh and ./test.sh: installs whatever is missing from Debian's
# packages, then configures (once) and builds into build/. Idempotent: with everything in
# place it costs a dpkg query and a no-op ninja. `--test` adds what only the tests need
# (chromium, to open the HTML report in a real headless browser, and clang for the fuzz
# targets); `--deps-only` installs and does not build (ci/sanitize.sh builds its own folder).
#
# Another LibTorch (e.g. a CUDA build inside PyTorch) is used when CMAKE_PREFIX_PATH points at
# it: CMAKE_PREFIX_PATH=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)').
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(build-essential cmake ninja-build ccache git pkg-config
          libtorch-dev libgloo-dev libopenblas0-openmp coinor-libcbc-dev libre2-dev
          libbenchmark-dev libgtest-dev googletest
          libyaml-cpp-dev nlohmann-json3-dev libcli11-dev libfccp-dev
          python3 python3-matplotlib)
test_deps=0 build=1
for arg in "$@"; do
  case "$arg" in
    --test) test_deps=1 ;;
    --deps-only) build=0 ;;
    *) echo "setup: unknown option '$arg' (expected --test or --deps-only)" >&2; exit 2 ;;
  esac
done
if [ "$test_deps" = 1 ]; then
  # python3-torch / -torchvision trace the models the import tests read (no PyPI: Debian's,
  # sharing the libtorch1.13 runtime).
  packages+=(chromium iproute2 procps clang libclang-rt-14-dev python3-torch python3-torchvision)
fi
# Debian's LibTorch is only needed when no other LibTorch was given.
if [ -n "${CMAKE_PREFIX_PATH:-}" ]; then
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

[ "$build" = 1 ] || exit 0
jobs=$(nproc)
if [ ! -f build/build.ninja ]; then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    ${CMAKE_PREFIX_PATH:+-DCMAKE_PREFIX_PATH="$CMAKE_PREFIX_PATH"} >/dev/null
fi
cmake --build build -j "$jobs"
