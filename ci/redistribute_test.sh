#!/usr/bin/env bash
# End-to-end checks of redistribution: suites/redistribute.yaml on threads (every pair passes,
# predicted == counted communication, predicted peak memory within 5% of measured on every
# row), a sample of it on gloo with 4 processes (the same numbers as threads), planted faults
# through `run --plant-fault` (exit 1, status fail), and `solve redistribute` (ColossalAI's
# documented example, the comparison with the anchors, malformed layouts exit 2 naming them).
# Usage: ci/redistribute_test.sh BUILD_DIR SOURCE_DIR
set -uo pipefail
build=$1
src=$2
sb="$build/stratbench"
source "$src/ci/test_lib.sh"
serve_core "$build"


# 1. The whole suite on threads, quickly timed.
check "redistribute suite on threads" 0 "total +[0-9]+ +0 +0" -- \
  "$sb" run "$src/suites/redistribute.yaml" --out "$tmp/threads" --repetitions 1 --min-time 0.0001
check "threads: every row passes, comm exact, memory exact" 0 "worst memory error 0.00%" -- \
  verify_rows "$tmp/threads/results.csv" 0.0

# 2. A sample on gloo, 4 processes (the 2x4 and 2x2x2 cases need 8 ranks: skipped).
sample='/(S01RR|RS0RP1|RRRP0)->|/(S0R|RRP1)->|sharded_tensor/'
if "$sb" run --help | grep -q gloo; then
  check "launch -n 4 gloo sample" 0 "4 ranks on gloo" -- \
    "$sb" launch -n 4 -- run "$src/suites/redistribute.yaml" --backend gloo --out "$tmp/gloo" \
    --repetitions 1 --min-time 0.0001 --filter "$sample"
  check "gloo: every row passes, comm exact, memory within 5%" 0 "rows" -- \
    verify_rows "$tmp/gloo/results.csv" 0.05
  check "gloo equals threads on the same rows" 0 "" -- \
    python3 - "$tmp/threads/results.csv" "$tmp/gloo/results.csv" <<'PY'
import csv, sys
key = lambda r: (r["case"], r["strategy_id"])
t = {key(r): r for r in csv.DictReader(open(sys.argv[1]))}
g = [r for r in csv.DictReader(open(sys.argv[2])) if r["status"] == "pass"]
assert len(g) > 50, len(g)
for r in g:
    o = t[key(r)]
    # Gloo adds pending sums in its own order: errors equal where inputs are exact.
    cols = ("max_abs_err", "mismatches", "comm_bytes", "comm_calls")
    for col in cols if r["inputs"] == "exact" else cols[1:]:
        assert r[col] == o[col], (key(r), col, r[col], o[col])
print(len(g), "rows equal")
PY
else
  echo "SKIP: this build has no gloo backend"
fi

# 3. Planted faults, end to end: the row fails and the run exits 1.
check "planted: reduce-scatter over the wrong group fails" 1 "fail: .*RRRP1->RS1R" -- \
  "$sb" run "$src/suites/redistribute.yaml" --out "$tmp/fault1" --repetitions 1 \
  --filter 'RRRP1->RS1R$' --plant-fault 'sharding/redistribute/RRRP1->RS1R=reduce_scatter_wrong_group'
check "planted: all-to-all split off by one fails" 1 "fail: .*S0RR->RS0R" -- \
  "$sb" run "$src/suites/redistribute.yaml" --out "$tmp/fault2" --repetitions 1 \
  --filter 'S0RR->RS0R$' --plant-fault 'sharding/redistribute/S0RR->RS0R=all_to_all_split_off_by_one'
check "planted: reshuffle ignoring placements fails" 1 "fail: .*reshuffle" -- \
  "$sb" run "$src/suites/redistribute.yaml" --out "$tmp/fault3" --repetitions 1 \
  --filter 'reshuffle/dim=0->0/placements=0,1,2,3->2,0,3,1' \
  --plant-fault 'sharding/sharded_tensor/reshuffle/dim=0->0/placements=0,1,2,3->2,0,3,1=ignore_placements'

# 4. solve redistribute.
check "solve: ColossalAI's documented example, and S01 moved in one all-to-all" 0 \
  '"path": "\[R, S01, R\] -> \[S01, R, R\]"' -- \
  "$sb" solve redistribute --shape '[64, 32, 16]' --mesh 4x4 --from '[R, S01, R]' --to '[S01, R, R]'
grep -q '"path": "\[R, S01, R\] -> \[R, S0, R\] -> \[S0, R, R\] -> \[S01, R, R\]"' "$tmp/out" &&
  pass "solve: the greedy anchor takes ColossalAI's documented path" ||
  fail "solve: greedy anchor path"
for mesh in 2x2 2x4; do
  check "solve --compare-anchors $mesh: never more bytes than either anchor" 0 \
    '"plan_more_bytes_than_an_anchor": \[\]' -- \
    "$sb" solve redistribute --shape '[64, 32, 16]' --mesh "$mesh" --compare-anchors
done
check "solve: DTensor spelling" 0 '"to_dtensor": "\[Replicate\(\), Partial\(sum\)\]"' -- \
  "$sb" solve redistribute --shape '[8, 8]' --mesh 2x2 --from '[Shard(0), Shard(1)]' \
  --to '[Replicate(), Partial(sum)]'
check "solve: a dimension that does not exist is exit 2" 2 "Shard\(3\).*3 dimensions" -- \
  "$sb" solve redistribute --shape '[8, 8, 8]' --mesh 2x2 --from '[Shard(3), Replicate()]' --to RRR
check "solve: an axis used twice is exit 2" 2 "mesh axis 0 is used twice" -- \
  "$sb" solve redistribute --shape '[8, 8]' --mesh 2x2 --from '[S0, S0]' --to RR
check "solve: a malformed shape is exit 2" 2 "--shape" -- \
  "$sb" solve redistribute --shape '[8, -1]' --mesh 2x2 --from RR --to RR
check "solve: a shape whose bytes overflow is exit 2" 2 "2\^62 bytes" -- \
  "$sb" solve redistribute --shape '[1099511627776, 1099511627776]' --mesh 2x2 --from RR --to RR
check "solve: a dimension index past an int is exit 2, not a crash" 2 "dimensions" -- \
  "$sb" solve redistribute --shape '[8, 8]' --mesh 2x2 --from '[Shard(99999999999999), R]' --to RR
check "solve: priced by a calibration profile of the mesh" 0 '"kind": "profile"' -- bash -c \
  "'$sb' calibrate --mesh 2x2 --out '$tmp/p22.json' --max-bytes 4096 >/dev/null &&
   '$sb' solve redistribute --shape '[8, 8]' --mesh 2x2 --from S01R --to RS01 --profile '$tmp/p22.json'"
check "solve: a profile from another mesh is exit 2" 2 "measured on mesh" -- bash -c \
  "'$sb' calibrate --mesh 4 --out '$tmp/p4.json' --max-bytes 4096 >/dev/null &&
   '$sb' solve redistribute --shape '[8, 8]' --mesh 2x2 --from S0R --to RS0 --profile '$tmp/p4.json'"

finish
