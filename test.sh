#!/usr/bin/env bash
# Set up and build as ./run.sh does, then run every test through ctest.
# Extra arguments go to ctest, e.g. ./test.sh -R strategies_tests (GoogleTest binaries run as
# shards; for one case: build/strategies/strategies_tests --gtest_filter='PlantedFault.*').
set -euo pipefail
cd "$(dirname "$0")"
# The rooms include only rooms below them (docs/architecture.md): seconds, before the build.
ci/check_includes.sh
ci/setup.sh --test
cd build
exec ctest --output-on-failure -j "$(nproc)" --timeout 600 "$@"
