#!/usr/bin/env bash
# The main job: set up, build, run the smoke suite on the embedded in-process mesh, and report.
# Results land in out/latest/ (results.csv, results.json), the report beside them (report.html
# with its plots embedded, report.md, summary.csv, plots/*.png). Extra arguments go to
# `stratbench run`, e.g. ./run.sh --filter 'S01' --repetitions 20.
# Exit code: that of `run` (0 all pass, 1 a strategy failed or errored, 2 bad input).
set -euo pipefail
cd "$(dirname "$0")"
ci/setup.sh
out=""
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  case "${args[i]}" in
    --out) out="${args[i + 1]:-}" ;;
    --out=*) out="${args[i]#--out=}" ;;
  esac
done
if [ -z "$out" ]; then
  out=out/latest
  args+=(--out "$out")
fi
rc=0
./build/stratbench run suites/smoke.yaml "${args[@]}" || rc=$?
# Bad input wrote no results; anything else is reported, failures included.
[ "$rc" -eq 2 ] && exit 2
./build/stratbench report "$out"
exit "$rc"
