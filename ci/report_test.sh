#!/usr/bin/env bash
# End-to-end checks of `stratbench report` on real runs: a baseline, a clean rerun and a rerun
# with one planted fault; gating and its exit codes, the files and plots written, the nightly
# history, malformed inputs, and the HTML opened in a real headless browser (Debian's
# chromium). Usage: ci/report_test.sh BUILD_DIR SOURCE_DIR
set -uo pipefail
build=$1
src=$2
sb="$build/stratbench"
source "$src/ci/test_lib.sh"
serve_core "$build"

# Two Linear strategies of the smoke suite, in every case of it they apply to: one splits the
# contraction (so it can lose its all-reduce), one does not. Ten repetitions: the U test needs
# nine a side.
filter='^sharding/linear/(RR=RS01\.S01R|RS01=RR\.RS01)$'
faulty='sharding/linear/RR=RS01.S01R'
run() { "$sb" run "$src/suites/smoke.yaml" --filter "$filter" --repetitions 10 --min-time 0.002 "$@"; }

check "baseline run passes" 0 "total +[0-9]+ +0 +0" -- run --out "$tmp/base"
check "clean rerun passes" 0 "total +[0-9]+ +0 +0" -- run --out "$tmp/clean"
check "rerun with a planted fault fails" 1 "fail" -- \
  run --out "$tmp/faulty" --plant-fault "$faulty=skip_forward_all_reduce"
check "a fault the strategy cannot have is bad input" 2 "has no fault 'ignore_placements'" -- \
  run --out "$tmp/x" --plant-fault "$faulty=ignore_placements"

# Gating.
check "clean rerun against the baseline passes the gate" 0 "gate: passed" -- \
  "$sb" report "$tmp/clean" --baseline "$tmp/base" --gate
check "planted fault against a passing baseline fails the gate, naming the strategy" 1 \
  "GATE: smoke/.* $faulty \[threads\]: numerics: was pass, now fail" -- \
  "$sb" report "$tmp/faulty" --baseline "$tmp/base" --gate --out "$tmp/rep"
grep -qE "^smoke,.*,$faulty,.*,fail,pass,.*,regressed,fail," "$tmp/rep/summary.csv" &&
  pass "summary.csv marks the faulty strategy regressed" || fail "summary.csv verdict"
# Its time may move on a shared machine (time gates softly: verdict regressed, gate warn), its
# numerics must not.
grep -qE "RS01=RR\.RS01,.*,pass,pass,.*,ok,[a-z]+,(ok|warn)," "$tmp/rep/summary.csv" &&
  pass "summary.csv keeps the healthy strategy's numerics ok" || fail "summary.csv healthy row"
check "without --gate the same report exits 0" 0 "report: " -- \
  "$sb" report "$tmp/faulty" --baseline "$tmp/base" --out "$tmp/rep2"

# Files and plots: one time, memory and error plot per case, and the predicted-vs-measured one.
for f in report.md report.html summary.csv tensors.csv; do
  [ -s "$tmp/rep/$f" ] && pass "report wrote $f" || fail "report wrote no $f"
done
cases=$(tail -n +2 "$tmp/rep/summary.csv" | cut -d, -f3 | sort -u | wc -l)
for kind in time memory errors; do
  n=$(find "$tmp/rep/plots" -name "${kind}_*.png" -size +1k | wc -l)
  [ "$n" -eq "$cases" ] && pass "$n $kind plots for $cases cases" ||
    fail "$kind plots: $n for $cases cases"
done
[ -s "$tmp/rep/plots/predicted_vs_measured.png" ] && pass "predicted-vs-measured plot" ||
  fail "predicted-vs-measured plot"
grep -q "plots/time_smoke__" "$tmp/rep/report.md" && pass "report.md links the plots" ||
  fail "report.md links no plot"
# The plot scripts by themselves, headless (no DISPLAY), on the report's CSV files.
py=/usr/bin/python3
[ -x "$py" ] || py=python3
rm -f "$tmp/rep/plots/"*.png
check "plot scripts run headless" 0 "" -- env -u DISPLAY "$py" "$src/reports/plots/make_plots.py" "$tmp/rep"
# No warning on the console: every warning shown (once per place), the scripts run again,
# nothing on stderr.
check "the plot scripts warn of nothing" 0 "^quiet$" -- bash -c \
  'env -u DISPLAY PYTHONWARNINGS=default "$1" "$2" "$3" 2>"$3/plot-stderr" >/dev/null &&
   [ ! -s "$3/plot-stderr" ] && echo quiet || cat "$3/plot-stderr"' _ "$py" \
  "$src/reports/plots/make_plots.py" "$tmp/rep"
# The error plot: a finite ratio far past the old ceiling (2.9e5) drawn as a value, not as
# inf/NaN; the time plot's bars never below 0 (min-max, not +-stddev).
check "plots: finite errors drawn as values, time bars from 0" 0 "^drawn$" -- "$py" - \
  "$src/reports/plots" "$tmp/rep" <<'PY'
import csv, os, shutil, sys, tempfile
sys.path.insert(0, sys.argv[1])
import error_plot, time_plot
import matplotlib.axes
d = tempfile.mkdtemp()
rows = list(csv.DictReader(open(os.path.join(sys.argv[2], "tensors.csv"))))
rows[0]["err_ratio"] = "290000"
rows[1]["err_ratio"] = "inf"
with open(os.path.join(d, "tensors.csv"), "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
    w.writeheader()
    w.writerows(rows)
drawn = []
real = matplotlib.axes.Axes.scatter
def spy(self, x, y, marker=None, **kw):
    drawn.extend((yy, marker) for yy in y)
    return real(self, x, y, marker=marker, **kw)
matplotlib.axes.Axes.scatter = spy
os.makedirs(os.path.join(d, "plots"))
error_plot.plot(d, os.path.join(d, "plots"))
assert (290000.0, "o") in drawn, drawn[:5]
assert any(m == "x" and y > 290000 for y, m in drawn), drawn[:5]
rows = list(csv.DictReader(open(os.path.join(sys.argv[2], "summary.csv"))))
lower, upper = time_plot.spread(rows)
for r, lo in zip(rows, lower):
    med = float(r["time_us_median"] or 0)
    assert 0 <= lo <= med and r["time_us_min"] != "", (r["time_us_min"], lo, med)
print("drawn")
PY
n=$(find "$tmp/rep/plots" -name '*.png' -size +1k | wc -l)
[ "$n" -eq $((3 * cases + 1)) ] && pass "make_plots.py drew $n non-empty PNGs" ||
  fail "make_plots.py drew $n PNGs, expected $((3 * cases + 1))"

# A pipeline row: its measured step's actions per rank beside the dry run's, as a timeline plot
# and a Chrome trace (Perfetto) of both.
check "pipeline rows run" 0 "total +2 +0 +0 +0" -- "$sb" run /dev/stdin --out "$tmp/pipe" <<'YAML'
suite: pipe
defaults: {dtype: float32, seed: 1, repetitions: 1, min_time_s: 0.0001}
cases:
  - {name: mlp, workload: mlp_chain, mesh: 2, strategies: ["pipeline/(1f1b|zb-h1)"],
     shape: {batch: 16, width: 32, depth: 4, dropout: 0, microbatches: 4}}
YAML
check "report of pipeline rows" 0 "report: " -- "$sb" report "$tmp/pipe" --out "$tmp/piperep"
check "pipeline timelines: a plot and a trace of both runs per row, linked" 0 "ok 2" -- \
  python3 - "$tmp/piperep" <<'PY'
import glob, json, os, sys
d = sys.argv[1]
traces = sorted(glob.glob(os.path.join(d, "pipeline", "*.trace.json")))
assert len(traces) == 2, traces
for t in traces:
    name = os.path.basename(t)[:-len(".trace.json")]
    runs = json.load(open(os.path.join(d, "pipeline", name + ".json")))
    ev = json.load(open(t))["traceEvents"]
    spans = [e for e in ev if e["ph"] == "X"]
    for pid, side in ((0, "measured"), (1, "predicted")):
        acts = [a for r in runs[side]["per_rank"] for a in r["actions"]]
        mine = [e for e in spans if e["pid"] == pid]
        # Every action of every rank, F and B (or I and W) for 4 micro-batches on 2 stages.
        assert len(mine) == len(acts) == (16 if "1f1b" in name else 24), (name, side, len(mine))
        assert {e["tid"] for e in mine} == {0, 1}, name
        assert all(e["dur"] > 0 for e in mine), (name, side)
    assert os.path.getsize(os.path.join(d, "plots", "pipeline_" + name + ".png")) > 1000, name
    assert ("plots/pipeline_" + name + ".png") in open(os.path.join(d, "report.md")).read(), name
print("ok", len(traces))
PY

# History: two nightly runs in a folder.
mkdir -p "$tmp/hist"
cp -r "$tmp/base" "$tmp/hist/2026-11-20"
cp -r "$tmp/faulty" "$tmp/hist/2026-11-21"
check "report --history reports the newest run with trend plots" 0 "report: " -- \
  "$sb" report --history "$tmp/hist" --out "$tmp/hrep"
[ "$(tail -n +2 "$tmp/hrep/history.csv" | cut -d, -f1 | sort -u | wc -l)" -eq 2 ] &&
  pass "history.csv holds both runs" || fail "history.csv"
[ -s "$tmp/hrep/plots/history_status.png" ] && pass "history status plot" || fail "history plot"
n=$(find "$tmp/hrep/plots" -name 'history_smoke__*.png' | wc -l)
[ "$n" -eq "$cases" ] && pass "a time trend per case" || fail "time trends: $n for $cases"

# The HTML in a real browser: the summary table is there and every embedded plot decodes.
browser=$(command -v chromium || command -v chromium-browser || true)
if [ -z "$browser" ]; then
  fail "chromium is not installed (./test.sh installs it through ci/setup.sh --test)"
else
  for r in rep hrep; do
    timeout 120 "$browser" --headless --no-sandbox --disable-gpu --virtual-time-budget=10000 \
      --dump-dom "file://$tmp/$r/report.html" >"$tmp/dom.html" 2>/dev/null
    total=$(grep -o 'data-images-total="[0-9]*"' "$tmp/dom.html" | grep -o '[0-9]*')
    loaded=$(grep -o 'data-images-loaded="[0-9]*"' "$tmp/dom.html" | grep -o '[0-9]*')
    if [ -n "$total" ] && [ "$total" -gt 0 ] && [ "$total" = "$loaded" ]; then
      pass "$r: chromium loaded all $total plot images"
    else
      fail "$r: chromium loaded '${loaded:-?}' of '${total:-?}' images"
    fi
    grep -q '<table id="summary">' "$tmp/dom.html" && pass "$r: summary table rendered" ||
      fail "$r: no summary table in the DOM"
  done
  timeout 120 "$browser" --headless --no-sandbox --disable-gpu --dump-dom \
    "file://$tmp/rep/report.html" 2>/dev/null >"$tmp/dom.html"
  grep -qE "Gate failed: [0-9]+ finding" "$tmp/dom.html" && grep -qF "$faulty" "$tmp/dom.html" &&
    pass "the page shows the failed gate and the strategy" ||
    fail "the page does not show the failed gate"
fi

# The nightly job: a first night with no baseline promotes itself, a clean night passes the
# gate against it, a night with a planted fault fails the gate and keeps the old baseline.
nightly() { STRATBENCH_BUILD="$build" "$src/ci/nightly.sh" --no-setup --runs "$tmp/nightly" "$@"; }
nargs=(--filter "$filter" --repetitions 10 --min-time 0.002)
check "nightly: the first night promotes itself" 0 "promoted .* to the baseline" -- \
  nightly --promote -- "${nargs[@]}"
check "nightly: a clean night passes the gate against the baseline" 0 "gate: passed" -- \
  nightly -- "${nargs[@]}"
check "nightly: a faulty night fails the gate and keeps the baseline" 1 "baseline .* is kept" -- \
  nightly --promote -- "${nargs[@]}" --plant-fault "$faulty=skip_forward_all_reduce"
grep -q "GATE: .*$faulty" "$tmp/out" && pass "nightly: the gate names the strategy" ||
  fail "nightly: the gate does not name the strategy"
[ "$(find "$tmp/nightly" -mindepth 1 -maxdepth 1 -type d | wc -l)" -eq 3 ] &&
  pass "nightly: three dated runs kept" || fail "nightly: dated runs"
grep -q ",fail," "$tmp/nightly/baseline.csv" && fail "nightly: a failing run was promoted" ||
  pass "nightly: the baseline holds no failing row"

# Bad input: a clear error naming file and line, exit 2, and nothing written.
csv="$tmp/base/results.csv"
printf 'name,value\nx,1\n' >"$tmp/foreign.csv"
check "a foreign header is bad input" 2 "foreign.csv:1: the header lacks column" -- \
  "$sb" report "$tmp/foreign.csv" --out "$tmp/bad1"
[ ! -e "$tmp/bad1/report.html" ] && pass "bad input wrote no report" || fail "bad input wrote a report"
head -c $(($(wc -c <"$csv") - 40)) "$csv" >"$tmp/truncated.csv"
check "a truncated row is bad input" 2 "truncated.csv.*Too few columns in line" -- \
  "$sb" report "$tmp/truncated.csv" --out "$tmp/bad2"
awk -F, 'NR == 3 { sub(/,threads,4,/, ",threads,four,") } { print }' "$csv" >"$tmp/nan.csv"
check "a value that is not a number is bad input" 2 "nan.csv:3: column 'world_size': 'four'" -- \
  "$sb" report "$tmp/nan.csv" --out "$tmp/bad3"
sed '2s/^1,/9,/' "$csv" >"$tmp/schema.csv"
check "an unknown schema version is bad input" 2 "schema.csv:2: schema_version 9" -- \
  "$sb" report "$tmp/schema.csv" --out "$tmp/bad4"
sed 's/,smoke,/,nightly-cpu,/' "$csv" >"$tmp/other.csv"
check "a baseline from another suite is bad input" 2 "other.csv: the baseline is from suite" -- \
  "$sb" report "$tmp/clean" --baseline "$tmp/other.csv" --out "$tmp/bad5"
check "a missing results file is bad input" 2 "nope.csv: no such results file" -- \
  "$sb" report "$tmp/nope.csv"
cmp -s "$csv" "$tmp/base/results.csv" && pass "inputs untouched" || fail "inputs changed"

finish
