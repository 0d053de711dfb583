#!/usr/bin/env bash
# Nightly job: run a suite, keep the run in a dated folder, report it against a baseline with
# the history of earlier runs, gate on numerics, memory, predictions and (against the machine's
# own noise) time, and promote the run to be the new baseline only when it deserves it.
#
#   ci/nightly.sh [--suite FILE] [--runs DIR] [--baseline FILE] [--calibrate N]
#                 [--promote | --promote-anyway REASON] [--gate-perf] [--allow-empty-suite]
#                 [--no-plots] [--no-rerun] [--no-setup] [-- ARGS for stratbench run...]
#
#   --suite      suite file (default suites/smoke.yaml)
#   --runs       where dated runs are kept (default $STRATBENCH_RUNS or out/nightly)
#   --baseline   baseline results.csv (default $STRATBENCH_BASELINE or RUNS/baseline.csv);
#                missing on the first night: the run is judged on its own
#   --calibrate N  measure the machine's noise instead of a night: run the suite N times (>= 2;
#                3-5 is usual) with this build into RUNS/calibration/, and write RUNS/noise.json
#                (`stratbench noise`), which every later night's report judges time against: a
#                row's median must move past its own band (3 x its spread over the N runs
#                pooled with its time scale's typical spread; at least --perf-threshold) and
#                the U test to count, and a rerun of the row must reproduce it (below).
#                Recalibrate after changing the machine, the suite or a strategy's speed on
#                purpose. docs/reports.md says how, and why.
#   --promote    make this run the baseline if it is promotable: the gate passed and no row's
#                time is a regression (soft or hard); otherwise refuse, naming why
#   --promote-anyway REASON  promote whatever the findings; the reason, the findings and the
#                run are recorded beside the baseline (BASELINE.promotion.json) and every later
#                report shows them
#   --gate-perf  time regressions fail the gate too (soft by default; they always block
#                --promote)
#   --allow-empty-suite  a suite whose every row was skipped or unsupported only warns
#   --no-plots   the report without its matplotlib plots
#   --no-rerun   do not rerun the rows found slower (by default each is run once more, and a
#                time regression counts only where the rerun reproduces it)
#   --no-setup   skip ci/setup.sh (already built; STRATBENCH_BUILD names the build directory)
#   --fuzz S     first run every fuzz target for S seconds (ci/fuzz.sh; 600 for the nightly
#                depth ./test.sh does not have time for); a finding fails the night with exit 1
#
# Exit codes: 0 gate passed, 1 gate failed (the report names the rows and why; a calibration run
# that failed), 2 bad input. A refused --promote does not change the exit code (the gate's
# verdict is the night's); it says "NOT promoted" with the reasons, and the baseline is kept.
# Each night's report folder holds gate.json (verdict, promotable, findings with their time
# class) and gate.junit.xml for a CI's test view.
set -euo pipefail
caller=$PWD
cd "$(dirname "$0")/.."
# Paths the caller gave are the caller's, not the checkout's: made absolute before use.
abs() { case "$1" in /*) printf '%s' "$1" ;; *) printf '%s/%s' "$caller" "$1" ;; esac; }

suite=
runs=${STRATBENCH_RUNS:-}
baseline=${STRATBENCH_BASELINE:-}
promote=0
force_reason=
calibrate=0
reconfirm=1
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
    --promote-anyway)
      [ $# -ge 2 ] && [ -n "$2" ] || { echo "nightly: --promote-anyway needs a REASON" >&2; exit 2; }
      promote=1; force_reason=$2; shift 2 ;;
    --calibrate)
      [[ ${2:-} =~ ^[0-9]+$ ]] && [ "$2" -ge 2 ] ||
        { echo "nightly: --calibrate needs a number of runs >= 2, got '${2:-}'" >&2; exit 2; }
      calibrate=$2; shift 2 ;;
    --gate-perf) report_args+=(--gate-perf); shift ;;
    --allow-empty-suite) report_args+=(--allow-empty-suite); shift ;;
    --no-plots) report_args+=(--no-plots); shift ;;
    --no-rerun) reconfirm=0; shift ;;
    --no-setup) setup=0; shift ;;
    --fuzz) fuzz=$2; shift 2 ;;
    --) shift; run_args=("$@"); break ;;
    *) echo "nightly: unknown argument '$1' (see the header of $0)" >&2; exit 2 ;;
  esac
done
if [ -n "$suite" ]; then suite=$(abs "$suite"); else suite=$PWD/suites/smoke.yaml; fi
if [ -n "$runs" ]; then runs=$(abs "$runs"); else runs=$PWD/out/nightly; fi
if [ -n "$baseline" ]; then baseline=$(abs "$baseline"); else baseline=$runs/baseline.csv; fi
[ -f "$suite" ] || { echo "nightly: suite file '$suite' not found" >&2; exit 2; }

[ "$setup" -eq 1 ] && ci/setup.sh
build_dir=$PWD/build
[ -n "${STRATBENCH_BUILD:-}" ] && build_dir=$(abs "$STRATBENCH_BUILD")
sb=$build_dir/stratbench
if [ "$fuzz" != 0 ]; then
  ci/fuzz.sh "$build_dir" "$fuzz" || { echo "nightly: fuzzing found a crash" >&2; exit 1; }
fi
mkdir -p "$runs"
noise=$runs/noise.json

if [ "$calibrate" -gt 0 ]; then
  # Runs of one build on this machine, back to back: how far each row's median moves by itself.
  cal="$runs/calibration/$(date -u +%Y-%m-%dT%H%M%SZ)"
  [ -e "$cal" ] && cal="$cal-$$"
  mkdir -p "$cal"
  dirs=()
  for i in $(seq 1 "$calibrate"); do
    echo "nightly: calibration run $i of $calibrate into $cal/run-$i"
    rc=0
    "$sb" run "$suite" --out "$cal/run-$i" "${run_args[@]}" >"$cal/run-$i.log" 2>&1 || rc=$?
    # Exit 1 is a row that failed: the passing rows still calibrate (noise reads only those).
    if [ "$rc" -ne 0 ] && { [ "$rc" -ne 1 ] || [ ! -f "$cal/run-$i/results.csv" ]; }; then
      tail -20 "$cal/run-$i.log" >&2
      echo "nightly: calibration run $i exited $rc (log: $cal/run-$i.log) without results;" \
           "the noise file is not written" >&2
      exit "$([ "$rc" -eq 2 ] && echo 2 || echo 1)"
    fi
    dirs+=("$cal/run-$i")
  done
  "$sb" noise "${dirs[@]}" --out "$noise" || exit $?
  echo "nightly: calibrated; later nights judge time against $noise"
  exit 0
fi

run_dir="$runs/$(date -u +%Y-%m-%dT%H%M%SZ)"
n=1
while [ -e "$run_dir" ]; do  # two runs in one second keep both
  n=$((n + 1))
  run_dir="$runs/$(date -u +%Y-%m-%dT%H%M%SZ)-$n"
done

echo "nightly: running $suite into $run_dir"
run_rc=0
"$sb" run "$suite" --out "$run_dir" "${run_args[@]}" || run_rc=$?
if [ "$run_rc" -eq 2 ]; then
  echo "nightly: bad input, nothing to report" >&2
  exit 2
fi
if [ ! -f "$run_dir/results.csv" ] && [ ! -f "$run_dir/results.partial.csv" ]; then
  echo "nightly: the run exited $run_rc and wrote no results into $run_dir; nothing to report" >&2
  exit 1
fi

if [ -f "$baseline" ]; then
  report_args+=(--baseline "$baseline")
else
  echo "nightly: no baseline at $baseline yet; the run is judged on its own" \
       "(--promote makes it the baseline)"
fi
if [ -f "$noise" ]; then
  report_args+=(--noise "$noise")
else
  echo "nightly: no noise calibration at $noise: time is judged against the fixed threshold," \
       "which a shared machine's noise passes (ci/nightly.sh --calibrate 5 measures it)"
fi
gate_rc=0
"$sb" report "$run_dir" --history "$runs" --gate "${report_args[@]}" >"$run_dir/report.log" 2>&1 ||
  gate_rc=$?
[ "$gate_rc" -eq 2 ] && { cat "$run_dir/report.log"; exit 2; }

# A row found slower is rerun once: a shared machine's one-off stall is not a regression, a
# slower build is slower again. Only the rerun's verdict counts (report --confirm).
# The rerun's arguments: the night's, less its own selection (--filter, --case) and the planted
# faults and slowdowns of rows it does not rerun; then the rows found slower, by name (the whole
# night again where their names would make a pattern past the id pattern's 1000 bytes).
mapfile -d '' rerun < <(python3 - "$run_dir/gate.json" "${run_args[@]}" <<'PY' 2>/dev/null || true
import json, re, sys
rows = [f for f in json.load(open(sys.argv[1]))["findings"]
        if f["time_class"] in ("regression", "suspicious") and (f["time_change_pct"] or 0) > 0]
if not rows:
    sys.exit(0)
ids = {f["strategy_id"] for f in rows}
args, out, i = sys.argv[2:], [], 0
while i < len(args):
    a = args[i]
    name, eq, val = a.partition("=")
    if name in ("--filter", "--case", "--plant-fault", "--plant-slowdown") and a.startswith("--"):
        if not eq:
            i += 1
            val = args[i] if i < len(args) else ""
        if name == "--plant-slowdown" and val.rpartition("=")[0] in ids:
            out += [name, val]
        i += 1
        continue
    out.append(a)
    i += 1
case_re = "^(" + "|".join(sorted({re.escape(f["case"]) for f in rows})) + ")$"
id_re = "^(" + "|".join(sorted(re.escape(x) for x in ids)) + ")$"
if len(case_re) < 900 and len(id_re) < 900:
    out += ["--case", case_re, "--filter", id_re]
else:
    out = args
sys.stdout.write("".join(x + "\0" for x in out))
PY
)
if [ "${#rerun[@]}" -gt 0 ] && [ "$reconfirm" -eq 1 ]; then
  echo "nightly: rows slower than the baseline past their band: rerunning them once into" \
       "$run_dir/confirm"
  "$sb" run "$suite" "${rerun[@]}" --out "$run_dir/confirm" >"$run_dir/confirm.log" 2>&1 || true
  if [ -f "$run_dir/confirm/results.csv" ]; then
    gate_rc=0
    "$sb" report "$run_dir" --history "$runs" --gate "${report_args[@]}" \
      --confirm "$run_dir/confirm" >"$run_dir/report.log" 2>&1 || gate_rc=$?
    [ "$gate_rc" -eq 2 ] && { cat "$run_dir/report.log"; exit 2; }
  else
    tail -5 "$run_dir/confirm.log" >&2
    echo "nightly: the rerun wrote no results (log: $run_dir/confirm.log); the night's" \
         "findings stand" >&2
  fi
fi
cat "$run_dir/report.log"

if [ "$promote" -eq 1 ]; then
  # The report's own decision (gate.json): the gate passed and no time regression.
  promotable=0
  grep -q '"promotable": true' "$run_dir/gate.json" 2>/dev/null && promotable=1
  if [ ! -f "$run_dir/results.csv" ]; then
    echo "nightly: NOT promoted: $run_dir holds no complete results.csv" >&2
  elif [ "$promotable" -eq 1 ] || [ -n "$force_reason" ]; then
    mkdir -p "$(dirname "$baseline")"
    # The record first, then the baseline: a reader never sees a forced baseline unrecorded.
    python3 - "$run_dir" "$force_reason" "$promotable" >"$baseline.promotion.json.tmp.$$" <<'PY' ||
import json, sys, datetime
run, reason, promotable = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
gate = json.load(open(run + "/gate.json"))
record = {"promoted_from": run, "forced": not promotable,
          "at_utc": datetime.datetime.now(datetime.timezone.utc).isoformat()}
if not promotable:
    record.update(reason=reason, blockers=gate.get("promotion_blockers", []))
print(json.dumps(record, indent=1))
PY
      { echo "nightly: cannot record the promotion" >&2; exit 2; }
    mv "$baseline.promotion.json.tmp.$$" "$baseline.promotion.json"
    # Rows a rerun measured again (a stall it did not reproduce) enter the baseline as the
    # rerun measured them: the next night is never judged against a stalled median.
    python3 - "$run_dir/results.csv" "$run_dir/confirm/results.csv" >"$baseline.tmp.$$" <<'PY' ||
import csv, os, sys
night, rerun = sys.argv[1], sys.argv[2]
with open(night, newline="") as f:
    lines = f.read().splitlines(keepends=True)
if not os.path.exists(rerun):
    sys.stdout.write("".join(lines))
    sys.exit(0)
key = lambda r: (r["suite"], r["case"], r["strategy_id"], r["backend"])
with open(rerun, newline="") as f:
    again = {key(r): r for r in csv.DictReader(f) if r["status"] == "pass"}
with open(night, newline="") as f:
    reader = csv.DictReader(f)
    w = csv.DictWriter(sys.stdout, fieldnames=reader.fieldnames, lineterminator="\n")
    w.writeheader()
    for r in reader:
        w.writerow(again.get(key(r), r))
PY
      { echo "nightly: cannot write the baseline" >&2; exit 2; }
    mv "$baseline.tmp.$$" "$baseline"  # atomic: a reader sees the old or the new baseline
    if [ "$promotable" -eq 1 ]; then
      echo "nightly: promoted $run_dir/results.csv to the baseline $baseline"
    else
      echo "nightly: promoted ANYWAY $run_dir/results.csv to the baseline $baseline" \
           "(recorded in $baseline.promotion.json: $force_reason)"
    fi
  else
    echo "nightly: NOT promoted: the run has findings (gate.json promotion_blockers); the" \
         "baseline $baseline is kept (--promote-anyway REASON overrides, on the record)" >&2
    python3 -c 'import json,sys; [print("  " + b, file=sys.stderr) for b in json.load(open(sys.argv[1])).get("promotion_blockers", [])]' \
      "$run_dir/gate.json" || true
  fi
fi
echo "nightly: report at $run_dir/report.html"
exit "$gate_rc"
