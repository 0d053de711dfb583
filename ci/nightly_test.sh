#!/usr/bin/env bash
# The nightly loop end to end on this machine (issue 58): calibrate the machine's noise, then
# nights of the same build (no performance finding, each promoted), a night with a planted
# numerics fault (fails, not promoted), a night with a planted 20% slowdown in one strategy
# (found and classified, not promoted; promoted anyway only with a reason, on the record), a
# night whose suite ran nothing (fails), partial results, gone rows with why, the gate's JSON
# and JUnit XML, `launch` without a multi-process backend, the live progress line on a
# terminal, and the report's first screen in a real browser (a screenshot and the DOM).
# Usage: ci/nightly_test.sh BUILD_DIR SOURCE_DIR
set -uo pipefail
build=$1
src=$2
sb="$build/stratbench"
source "$src/ci/test_lib.sh"
serve_core "$build"

# Three strategies of one Linear, steps of 4-9 ms on 2 cores: long enough to time. The
# replicated one (every rank computes the whole product) is the steadiest.
cat >"$tmp/suite.yaml" <<'EOF'
suite: nightly-check
description: three Linear strategies with steps long enough to time (ci/nightly_test.sh)
defaults:
  dtype: float32
  inputs: random
  seed: 7
  repetitions: 10
  min_time_s: 0.02
cases:
  - name: linear-256x512x1024-mesh2
    workload: linear
    shape: {input: [256, 512], out_features: 1024, bias: true}
    mesh: 2
    strategies: ["sharding/linear/(RS0=RR\\.RS0|RR=RS0\\.S0R|RR=RR\\.RR)"]
EOF
runs=$tmp/nightly
nightly() {
  STRATBENCH_BUILD="$build" "$src/ci/nightly.sh" --no-setup --no-plots --suite "$tmp/suite.yaml" \
    --runs "$runs" "$@"
}
newest() { find "$runs" -mindepth 1 -maxdepth 1 -type d -name '20*' | sort | tail -1; }
# `classes DIR`: the rows of DIR/gate.json with a performance finding, as "class strategy".
classes() {
  python3 - "$1/gate.json" "${2:-regression suspicious insufficient data improvement}" <<'PY'
import json, sys
g = json.load(open(sys.argv[1]))
for f in g["findings"]:
    if f["time_class"] in ("regression", "suspicious", "insufficient data", "improvement") and \
            f["time_class"].split()[0] in sys.argv[2].split():
        print(f["time_class"], f["strategy_id"])
PY
}
# What a same-build night must not claim: a regression (it blocks promotion) or an improvement.
# A `suspicious` row (past the band, not significant: a note for a reader) is printed, not
# failed: on this shared machine another tenant's load moves a row 30-40% for minutes.
false_alarms() { classes "$1" "regression improvement"; }

# 1. Calibration: three runs of this build; the noise file names each row's band.
check "calibrate: five runs of one build, a noise file" 0 "calibrated" -- nightly --calibrate 5
[ -s "$runs/noise.json" ] && pass "noise.json written" || fail "no noise.json"
read -r steady band < <(python3 - "$runs/noise.json" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
r = min(rows, key=lambda r: r["band_pct"])
print(r["strategy_id"], r["band_pct"])
PY
)
echo "     the steadiest row: $steady, band $band%"
# The slowdown planted is 20%, or three times the row's band where that is more (on this
# machine when it is quiet, bands of 8-18%: docs/measurements.md; under another tenant's load
# they widen, and no method that measures time could tell 20% from that noise). Three times:
# a night's median moves against the baseline's by more than the band five calibration runs
# measured often enough that 20% over a 16.8% band went unseen in a clean clone's run on a
# 2-core AMD host (the gate's logic is the same either way; the test says what it planted).
slow=$(python3 -c "import math; print(max(20, math.ceil(3 * float('$band'))))")
[ "$slow" -eq 20 ] && pass "a row is steady enough here to see a 20% slowdown (band $band%)" ||
  echo "     NOTE: the narrowest band is $band%: planting $slow% (3x the band), not 20%"
# The checks of what the gate does with a slower night (--gate-perf fails it, --promote-anyway
# promotes it on the record) plant a slowdown no noise hides: at least 4x the band, 100% or
# more. With twice the band they failed on a 2-core AMD host (CI's, then here) when a night
# measured a 68% slowdown under its 34% band (the baseline's night had run slow).
big=$(python3 -c "import math; print(max(100, math.ceil(4 * max(10.0, float('$band')))))")
check "calibrate refuses one run" 2 "needs a number of runs >= 2" -- nightly --calibrate 1

# 2. Three nights of the same build: the first becomes the baseline, none claims a regression or
# an improvement, each is promoted. This machine is shared: a night during which another
# tenant's load moves every timing past the band (seen: +12%, reproduced by the rerun seconds
# later) is run once more after a pause; a claim on two nights in a row fails.
for night in 1 2 3; do
  if nightly --promote >"$tmp/night.out" 2>&1; then
    found=$(false_alarms "$(newest)")
  else
    found="exit $?"
  fi
  if [ -n "$found" ]; then
    echo "     (night $night had findings on an unchanged build: $found; the host's load? once more)"
    sleep 20
  fi
  if [ -z "$found" ]; then
    cp "$tmp/night.out" "$tmp/out"
    grep -qE "promoted .* to the baseline" "$tmp/night.out" &&
      pass "night $night (same build): gate passes, promoted" ||
      fail "night $night (same build): gate passes, promoted: not promoted"
  else
    check "night $night (same build): gate passes, promoted" 0 "promoted .* to the baseline" -- \
      nightly --promote
  fi
  found=$(false_alarms "$(newest)")
  notes=$(classes "$(newest)" "suspicious")
  [ -n "$notes" ] && echo "     (night $night, noted, not failed: $notes)"
  [ -z "$found" ] && pass "night $night: no regression or improvement claimed" ||
    fail "night $night: a regression or improvement claimed on an unchanged build: $found"
done
grep -q '"forced": false' "$runs/baseline.csv.promotion.json" &&
  pass "the promotion is recorded, not forced" || fail "promotion record"
cp "$runs/baseline.csv" "$tmp/baseline.before"

# 3. A planted numerics fault: the night fails and is not promoted.
check "a night with a planted fault fails, NOT promoted" 1 "NOT promoted" -- \
  nightly --promote -- --plant-fault "sharding/linear/RR=RS0.S0R=skip_forward_all_reduce"
grep -q "GATE: .*RR=RS0.S0R.*numerics: was pass, now fail" "$tmp/out" &&
  pass "the gate names the faulty strategy" || fail "the gate does not name it"
cmp -s "$runs/baseline.csv" "$tmp/baseline.before" && pass "the baseline is kept" ||
  fail "a failing night changed the baseline"
faulty_night=$(newest)

# 4. A planted 20% slowdown in the steadiest strategy: found, classified, not promoted; with
# --gate-perf it fails the night.
check "a $slow% slower night: the gate (soft time) passes, NOT promoted" 0 "NOT promoted" -- \
  nightly --promote -- --plant-slowdown "$steady=$slow"
found=$(classes "$(newest)")
[ "$found" = "regression $steady" ] && pass "the slowdown is found and classified: $found" ||
  fail "the slowdown: expected 'regression $steady', got '$found'"
grep -q "rerunning them once" "$tmp/out" && grep -q "a rerun measured .*: reproduced" "$tmp/out" &&
  pass "the slower row was rerun and the rerun reproduced it" || fail "no rerun of the slower row"
cmp -s "$runs/baseline.csv" "$tmp/baseline.before" && pass "the slower night is no baseline" ||
  fail "a slower night became the baseline"
check "with --gate-perf a $big% slower night fails" 1 "time: median .* past its noise band" -- \
  nightly --gate-perf -- --plant-slowdown "$steady=$big"
check "--promote-anyway promotes a $big% slower night, on the record" 0 "promoted ANYWAY" -- \
  nightly --promote-anyway "new kernel accepted" -- --plant-slowdown "$steady=$big"
grep -q '"reason": "new kernel accepted"' "$runs/baseline.csv.promotion.json" &&
  grep -q '"forced": true' "$runs/baseline.csv.promotion.json" &&
  pass "the forced promotion is recorded with its reason" || fail "forced promotion record"
check "the next report says the baseline was forced" 0 "promoted by force.*new kernel accepted" -- \
  nightly
check "--promote-anyway needs a reason" 2 "needs a REASON" -- nightly --promote-anyway ""

# 5. A suite whose every row is skipped (CUDA cases on a CPU host) fails the night.
if "$sb" list 2>/dev/null | grep -q "CUDA: available"; then
  echo "     (a GPU is here: the skipped-suite night is not planted)"
else
  cat >"$tmp/gpu.yaml" <<'EOF'
suite: nightly-gpu
description: CUDA rows, every one skipped on a CPU host
defaults: {device: cuda, repetitions: 2, min_time_s: 0.001}
cases:
  - name: linear-gpu
    workload: linear
    shape: {input: [8, 16], out_features: 8, bias: true}
    mesh: 2
    strategies: ["sharding/linear/RR=RR\\.RR"]
EOF
  check "a night whose suite ran nothing fails" 1 "suite nightly-gpu ran nothing: 1 row\(s\) skipped" -- \
    env STRATBENCH_BUILD="$build" "$src/ci/nightly.sh" --no-setup --no-plots --suite "$tmp/gpu.yaml" \
    --runs "$tmp/gpu-runs"
  grep -qE "total +0 +0 +0 +0 +1" "$tmp/out" && grep -q "skipped: 1 row(s): " "$tmp/out" &&
    pass "the console counts the skipped row and says why" || fail "console skipped count"
  check "... unless told it is expected" 0 "gate: passed" -- \
    env STRATBENCH_BUILD="$build" "$src/ci/nightly.sh" --no-setup --no-plots --suite "$tmp/gpu.yaml" \
    --runs "$tmp/gpu-runs" --allow-empty-suite
fi

# 6. Partial results are read and fail the gate; rows they lack are gone "interrupted".
mkdir -p "$tmp/partial"
head -2 "$runs/baseline.csv" >"$tmp/partial/results.partial.csv"
check "report reads results.partial.csv and says it is partial" 1 "partial results: .*results.partial.csv holds 1 row" -- \
  "$sb" report "$tmp/partial" --baseline "$runs/baseline.csv" --gate --no-plots
grep -q "interrupted before it (partial results)" "$tmp/out" && pass "gone rows: the run was interrupted" ||
  fail "gone rows of a partial run"

# 7. Gone rows say why: a filtered run, another backend.
"$sb" run "$tmp/suite.yaml" --filter 'RR=RR' --out "$tmp/filtered" >/dev/null 2>&1
check "a filtered run's gone rows name the filter" 1 "its case ran without this strategy \(a --filter" -- \
  "$sb" report "$tmp/filtered" --baseline "$runs/baseline.csv" --gate --no-plots

# 8. The gate for a CI: gate.json and JUnit XML of the faulty night.
python3 - "$faulty_night" <<'PY' >"$tmp/out" 2>&1 && pass "gate.json and gate.junit.xml: the fault as a failure" || fail "gate outputs"
import json, sys, xml.etree.ElementTree as ET
d = sys.argv[1]
g = json.load(open(d + "/gate.json"))
assert g["verdict"] == "fail" and g["enforced"] and not g["promotable"], g
assert any("RR=RS0.S0R" in f for f in g["failures"]), g["failures"]
root = ET.parse(d + "/gate.junit.xml").getroot()
failed = [tc.get("name") for tc in root.iter("testcase") if tc.find("failure") is not None]
assert any(n.startswith("sharding/linear/RR=RS0.S0R") for n in failed), failed
assert int(root.get("failures")) == len(failed), (root.get("failures"), failed)
print("junit failures:", failed)
PY

# 9. launch without a multi-process backend: gloo, never a race on threads.
check "launch refuses run --backend threads" 2 "runs every rank of a mesh in one process" -- \
  "$sb" launch -n 2 -- run "$tmp/suite.yaml" --backend threads --out "$tmp/l1"
check "launch without --backend runs on gloo" 0 "ranks run on gloo" -- \
  "$sb" launch -n 2 -- run "$tmp/suite.yaml" --filter 'RR=RR' --repetitions 2 --out "$tmp/l2"
grep -q ",gloo," "$tmp/l2/results.csv" && pass "the launched rows are gloo rows" || fail "launched rows"

# 10. Progress: on a terminal a long case says what it does; in a log nothing of it. The line
# shows from a case's third second, ticking each second: 3 strategies x 4 repetitions of 0.3 s
# keep the case timing past it.
if command -v script >/dev/null; then
  script -qec "'$sb' run '$tmp/suite.yaml' --repetitions 4 --min-time 0.3 --out '$tmp/tty'" /dev/null >"$tmp/tty.log" 2>&1
  grep -aqE "strategy [0-9]/3 sharding/linear/.*: timing, [0-9]+ steps" "$tmp/tty.log" &&
    pass "a terminal sees strategy n/m, its phase and the steps" ||
    fail "no progress line on a terminal"
  "$sb" run "$tmp/suite.yaml" --repetitions 4 --min-time 0.3 --out "$tmp/notty" >"$tmp/notty.log" 2>&1
  grep -aq "steps" "$tmp/notty.log" && fail "a log got progress lines" ||
    pass "a log gets no progress line"
else
  fail "script(1) is missing (util-linux): the terminal check cannot run"
fi

# 11. The report's first screen, in a real browser: the verdict and what changed.
browser=$(command -v chromium || command -v chromium-browser || true)
if [ -z "$browser" ]; then
  fail "chromium is not installed (./test.sh installs it through ci/setup.sh --test)"
else
  page="file://$faulty_night/report.html"
  timeout 120 "$browser" --headless --no-sandbox --disable-gpu --window-size=1280,800 \
    --virtual-time-budget=5000 --dump-dom "$page" >"$tmp/dom.html" 2>/dev/null
  first=$(grep -o 'data-first-screen="[^"]*"' "$tmp/dom.html")
  [[ $first == *verdict-fail* && $first == *what-changed* && $first == *changes* ]] &&
    pass "the first screen holds the verdict and what changed ($first)" ||
    fail "the first screen: '$first'"
  timeout 120 "$browser" --headless --no-sandbox --disable-gpu --window-size=1280,800 \
    --screenshot="$tmp/first.png" "$page" >/dev/null 2>&1
  # The screenshot's top: the red verdict banner (#a40000) is there, drawn by the browser.
  python3 - "$tmp/first.png" <<'PY' >"$tmp/out" 2>&1 && pass "the screenshot shows the red verdict banner" || fail "screenshot"
import sys, zlib, struct
data = open(sys.argv[1], "rb").read()
assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
pos, idat, w = 8, b"", 0
while pos < len(data):
    n, kind = struct.unpack(">I4s", data[pos:pos + 8])
    body = data[pos + 8:pos + 8 + n]
    if kind == b"IHDR":
        w, h, depth, ctype = struct.unpack(">IIBB", body[:10])
        assert depth == 8 and ctype in (2, 6), (depth, ctype)
        bpp = 3 if ctype == 2 else 4
    elif kind == b"IDAT":
        idat += body
    pos += 12 + n
raw = zlib.decompress(idat)
stride = w * bpp
prev = bytearray(stride)
red = 0
for y in range(min(h, 300)):  # the top 300 px, unfiltered row by row
    f = raw[y * (stride + 1)]
    line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
    for i in range(stride):
        a = line[i - bpp] if i >= bpp else 0
        b = prev[i]
        c = prev[i - bpp] if i >= bpp else 0
        if f == 1: line[i] = (line[i] + a) & 255
        elif f == 2: line[i] = (line[i] + b) & 255
        elif f == 3: line[i] = (line[i] + (a + b) // 2) & 255
        elif f == 4:
            p = a + b - c; pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
    for x in range(0, stride, bpp):
        if abs(line[x] - 0xa4) < 8 and line[x + 1] < 8 and line[x + 2] < 8:
            red += 1
    prev = line
print("red pixels in the top 300 rows:", red)
assert red > 5000, red
PY
fi

finish
