#!/usr/bin/env bash
# End-to-end checks of locating a failing row (harness/run/divergence.h): every planted fault of
# the families that capture their intermediate values is named at the node it was planted in,
# and a correct executor's every traced value is within its tolerance (`run --capture`), on
# threads and on gloo; the record, the failure message and the HTML report carry it.
# Usage: ci/divergence_test.sh BUILD_DIR SOURCE_DIR
set -uo pipefail
build=$1
src=$2
sb="$build/stratbench"
source "$src/ci/test_lib.sh"

# `located RESULTS.json CHECK`: every row of the file is checked by CHECK, a Python expression
# over the record `r` and its first divergence `d` (None where there is none); prints each
# row's verdict and fails on the first false one.
located() {
  python3 - "$1" "$2" <<'PY'
import json, sys
records = json.load(open(sys.argv[1]))["records"]
assert records, "no rows"
bad = 0
for r in records:
    d = r["details"].get("first_divergence")
    ok = eval(sys.argv[2], {"r": r, "d": d})
    where = f'{d.get("node")} {d.get("phase")} {d.get("tensor")} ranks {d.get("ranks")}' \
        if d and d.get("found") else json.dumps(d)
    print(("ok  " if ok else "BAD ") + f'{r["case"]} {r["strategy_id"]} {r["status"]}: {where}')
    bad += not ok
print(f"{len(records)} rows, {bad} not as expected")
sys.exit(1 if bad else 0)
PY
}

# 1. Plans (sharding/auto/*): the autoshard suite's GPT-2 and LLaMA cases. Captured on passing
# rows, every traced value of every rank is within its tolerance: the capture's layouts,
# reductions and gradients are right, so that a divergence found below is the fault's.
python3 - "$src/suites/autoshard.yaml" "$tmp/plans.yaml" <<'PY'
import sys
text = open(sys.argv[1]).read()
head, cases = text.split("\ncases:\n")
keep = [c for c in cases.split("  - name: ") if c.split("\n")[0] in
        ("gpt2-L2-mesh2x2", "gpt2-L2-mesh4", "gpt2-L2-mesh2x2-adamw-steps", "llama-L2-mesh2x2")]
assert len(keep) == 4, "autoshard.yaml lost a case this test runs"
open(sys.argv[2], "w").write(head + "\ncases:\n" + "".join("  - name: " + c for c in keep))
PY
check "plans, --capture: every row passes" 0 "total +16 +0 +0 +0" -- \
  "$sb" run "$tmp/plans.yaml" --out "$tmp/capture" --repetitions 1 --min-time 0.0001 --capture
check "plans, --capture: no traced value leaves its tolerance, hundreds compared a row" 0 \
  "16 rows, 0 not" -- located "$tmp/capture/results.json" \
  '(d is not None and d["found"] is False and d["compared"] >= 4 * 80
    and "missing" not in d and "untraced" not in d)'
check "a passing row without --capture is not captured" 0 "total +4 +0 +0 +0" -- \
  "$sb" run "$tmp/plans.yaml" --out "$tmp/plain" --repetitions 1 --filter '^sharding/auto/ilp$'
check "... and its record has no first_divergence" 0 "4 rows, 0 not" -- \
  located "$tmp/plain/results.json" 'd is None'

# The planted fault skip_edge_redistribution, in every plan algorithm: the first edge that needs
# a redistribution does none. Its consumer's operand, as read, is the first value off, forward,
# at the edge the plan lists first (details.case.edge_reads, from the plan, not the capture).
faults=()
for algo in ilp megatron data-parallel replicated; do
  faults+=(--plant-fault "sharding/auto/$algo=skip_edge_redistribution")
done
check "planted, every plan algorithm: each row fails, naming its first divergence" 1 \
  "first divergence: node h0\.attn\.[a-z_]+ \(forward\)" -- \
  "$sb" run "$tmp/plans.yaml" --out "$tmp/fault" --repetitions 1 --min-time 0.0001 "${faults[@]}"
check "planted: the named value is the plan's first redistributed read, on every row" 0 \
  "16 rows, 0 not" -- located "$tmp/fault/results.json" \
  'r["status"] == "pass" if not r["details"]["case"]["edge_reads"] else (
     r["status"] == "fail" and d["found"] and d["phase"] == "forward"
     and d["tensor"] == r["details"]["case"]["edge_reads"][0]
     and d["node"] == d["tensor"].split(" -> ")[1].split("[")[0]
     and "first divergence: node " + d["node"] in r["message"])'
check "report on the failing rows" 1 "" -- \
  "$sb" report "$tmp/fault" --out "$tmp/report" --no-plots --gate
check "report: the HTML's table of where rows diverge names each failing row's node" 0 \
  "([4-9]|[1-9][0-9]) located of the \\1 failing" -- \
  python3 - "$tmp/report/report.html" "$tmp/fault/results.json" <<'PY'
import json, re, sys
html = open(sys.argv[1]).read()
table = re.search(r'<table[^>]*id="divergence".*?</table>', html, re.S)
assert table, "no table with id divergence"
rows = re.findall(r"<tr>(.*?)</tr>", table.group(0), re.S)[1:]
cells = [re.findall(r"<td[^>]*>(.*?)</td>", row, re.S) for row in rows]
located = {(c[0], c[1]): c[3] for c in cells}
n = failing = 0
for r in json.load(open(sys.argv[2]))["records"]:
    d = r["details"].get("first_divergence")
    failing += r["status"] == "fail"
    if not d or not d.get("found"):
        continue
    assert located.get((r["case"], r["strategy_id"])) == d["node"], (r["case"], r["strategy_id"])
    n += 1
print(f"{n} located of the {failing} failing")
PY

# On gloo, 4 processes: each rank captures in its own process and rank 0 takes the earliest.
if "$sb" run --help | grep -q gloo; then
  python3 - "$tmp/plans.yaml" "$tmp/one.yaml" <<'PY'
import sys
head, cases = open(sys.argv[1]).read().split("\ncases:\n")
open(sys.argv[2], "w").write(head + "\ncases:\n  - name: " + cases.split("  - name: ")[1])
PY
  check "gloo, planted: the first divergence over 4 processes" 1 "first divergence: node" -- \
    "$sb" launch -n 4 -- run "$tmp/one.yaml" --backend gloo --out "$tmp/gloo" --repetitions 1 \
    --min-time 0.0001 --filter '^sharding/auto/megatron$' \
    --plant-fault 'sharding/auto/megatron=skip_edge_redistribution'
  check "gloo, planted: at the plan's first redistributed read" 0 "1 rows, 0 not" -- \
    located "$tmp/gloo/results.json" \
    'd["found"] and d["tensor"] == r["details"]["case"]["edge_reads"][0] and len(d["ranks"]) >= 1'
else
  echo "SKIP: this build has no gloo backend"
fi

finish
