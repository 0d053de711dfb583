#!/usr/bin/env bash
# The main job: set up, build, and run the smoke suite on the embedded in-process mesh.
# Results land in out/latest/ (results.csv, results.json). Extra arguments go to
# `stratbench run`, e.g. ./run.sh --filter 'S01' --repetitions 20.
set -euo pipefail
cd "$(dirname "$0")"
ci/setup.sh
exec ./build/stratbench run suites/smoke.yaml --out out/latest "$@"
