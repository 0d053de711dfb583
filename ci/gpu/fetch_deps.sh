#!/usr/bin/env bash
# Downloads, on a Debian 12 machine with network, the Debian packages a GPU machine needs to
# build stratbench against its own CUDA LibTorch, into .debs/ (git-ignored). A GPU machine of
# this project's kind has CMake, Ninja, nvcc, a C++ compiler and PyTorch with CUDA, but no
# network: carry .debs with the checkout and run ci/gpu/run.sh there, which unpacks them with
# `dpkg -x` into a private prefix (never into /).
#
# Usage: ci/gpu/fetch_deps.sh [DIR]      (DIR defaults to .debs in the checkout)
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=${1:-.debs}
mkdir -p "$dir"
# What the build finds with find_package/pkg-config and a current Ubuntu image may lack:
# RE2 (strategy patterns), COIN-OR CBC and its libraries (auto-sharding's integer program),
# LAPACK/BLAS and gfortran (CBC's), Fast C++ CSV Parser, CLI11, nlohmann-json, GoogleTest,
# Google Benchmark, and pkgconf to read their .pc files.
packages=(
  libfccp-dev libre2-dev libre2-9
  coinor-libcbc-dev coinor-libcbc3 coinor-libcgl-dev coinor-libcgl1 coinor-libclp-dev
  coinor-libclp1 coinor-libcoinutils-dev coinor-libcoinutils3v5 coinor-libosi-dev coinor-libosi1v5
  liblapack-dev liblapack3 libblas-dev libblas3 libgfortran5 libbz2-dev zlib1g-dev
  libgtest-dev libbenchmark-dev libbenchmark1debian nlohmann-json3-dev libcli11-dev
  libyaml-cpp-dev libyaml-cpp0.7
  pkgconf pkgconf-bin libpkgconf3
)
if ! apt-cache show "${packages[0]}" >/dev/null 2>&1; then
  apt-get update -qq
fi
(cd "$dir" && apt-get download "${packages[@]}")
ls -la "$dir"
du -sh "$dir"
