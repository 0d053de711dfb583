#!/usr/bin/env bash
# Nightly job: run a suite, keep the run in a dated folder, report it against a baseline with
# the history of earlier runs, gate, and optionally promote the run to be the new baseline.
#
#   ci/nightly.sh [--suite FILE] [--runs DIR] [--baseline FILE] [--promote] [--gate-perf]
#                 [--no-setup] [-- ARGS for stratbench run...]
#
#   --suite      suite file (default suites/smoke.yaml)
#   --runs       where dated runs are kept (default $STRATBENCH_RUNS or out/nightly)
#   --baseline   baseline results.csv (default $STRATBENCH_BASELINE or RUNS/baseline.csv);
#                missing on the first night: the run is judged on its own
#   --promote    after a passing gate, copy this run's results.csv over the baseline
#   --gate-perf  time regressions fail the gate too (soft by default)
#   --no-setup   skip ci/setup.sh (already built; STRATBENCH_BUILD names the build directory)
#   --fuzz S     first run every fuzz target for S seconds (ci/fuzz.sh; 600 for the nightly
#                depth ./test.sh does not have time for); a finding fails the night with exit 1
#
# Exit codes: 0 gate passed, 1 gate failed (the report names the rows and why), 2 bad input.
set -euo pipefail
cd "$(dirname "$0")/.."

suite=suites/smoke.yaml
runs=${STRATBENCH_RUNS:-out/nightly}
baseline=${STRATBENCH_BASELINE:-}
promote=0
setup=1
fuzz=0
report_args=()
run_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --suite) suite=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --baseline) baseline=$2; shift 2 ;;
    --promote) promote=1; shift ;;
    --gate-perf) report_args+=(--gate-perf); shift ;;
    --no-setup) setup=0; shift ;;
    --fuzz) fuzz=$2; shift 2 ;;
    --) shift; run_args=("$@"); break ;;
    *) echo "nightly: unknown argument '$1' (see the header of $0)" >&2; exit 2 ;;
  esac
done
baseline=${baseline:-$runs/baseline.csv}
[ -f "$suite" ] || { echo "nightly: suite file '$suite' not found" >&2; exit 2; }

[ "$setup" -eq 1 ] && ci/setup.sh
sb=${STRATBENCH_BUILD:-./build}/stratbench
if [ "$fuzz" != 0 ]; then
  ci/fuzz.sh "${STRATBENCH_BUILD:-./build}" "$fuzz" || { echo "nightly: fuzzing found a crash" >&2; exit 1; }
fi
run_dir="$runs/$(date -u +%Y-%m-%dT%H%M%SZ)"
n=1
while [ -e "$run_dir" ]; do  # two runs in one second keep both
  n=$((n + 1))
  run_dir="$runs/$(date -u +%Y-%m-%dT%H%M%SZ)-$n"
done
mkdir -p "$runs"

echo "nightly: running $suite into $run_dir"
run_rc=0
"$sb" run "$suite" --out "$run_dir" "${run_args[@]}" || run_rc=$?
if [ "$run_rc" -eq 2 ]; then
  echo "nightly: bad input, nothing to report" >&2
  exit 2
fi

if [ -f "$baseline" ]; then
  report_args+=(--baseline "$baseline")
else
  echo "nightly: no baseline at $baseline yet; the run is judged on its own" \
       "(--promote makes it the baseline)"
fi
gate_rc=0
"$sb" report "$run_dir" --history "$runs" --gate "${report_args[@]}" || gate_rc=$?
[ "$gate_rc" -eq 2 ] && exit 2

if [ "$promote" -eq 1 ]; then
  if [ "$gate_rc" -eq 0 ]; then
    mkdir -p "$(dirname "$baseline")"
    cp "$run_dir/results.csv" "$baseline.tmp.$$"
    mv "$baseline.tmp.$$" "$baseline"  # atomic: a reader sees the old or the new baseline
    echo "nightly: promoted $run_dir/results.csv to the baseline $baseline"
  else
    echo "nightly: gate failed, the baseline $baseline is kept" >&2
  fi
fi
echo "nightly: report at $run_dir/report.html"
exit "$gate_rc"
