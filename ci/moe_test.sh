#!/usr/bin/env bash
# End-to-end checks of expert parallelism (docs/moe.md): suites/moe.yaml passes (dropless and
# with a capacity, both drop policies, k = 1 and 2, E = 4 and 8, EP 2 and 4, EP x DP on 2x2 and
# 2x4, EP x TP on 2x2, DP x EP x TP on 2x2x2, EP x FSDP on 2x2 and FSDP x EP x TP on 2x2x2,
# over 3 optimizer steps), the capacity cases drop assignments, communication is counted as
# predicted from each step's routing; each planted field fault fails its rows naming the tensor
# it got wrong (the experts' gradients scaled by the EP degree, the router's gradient left
# partial, the experts' gradients reduced over the data-parallel group, the capacity from a
# rank's own tokens: only the cases with a capacity fail; the experts' rows' gradient not summed
# over tp); two cases on gloo across 4 processes; a malformed shape or params.axes is exit 2
# naming the key; experts that do not divide over the ranks are unsupported.
# Usage: ci/moe_test.sh BUILD SOURCE
set -uo pipefail
build=$1
src=$2
sb="$build/stratbench"
source "$src/ci/test_lib.sh"
cd "$src"

check "moe suite: every case passes" 0 "total +15 +0 +0 +0$" -- \
  "$sb" run suites/moe.yaml --out "$tmp/suite" --repetitions 1
check "routing checked, drops happen, communication as predicted" 0 "ok" -- \
  python3 - "$tmp/suite/results.csv" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
assert len(rows) == 15, len(rows)
for r in rows:
    assert r["status"] == "pass", (r["case"], r["message"])
    assert r["comm_bytes"] == r["predicted_comm_bytes"] and int(r["comm_bytes"]) > 0, r["case"]
print("ok")
PY
check "a rank whose expert gets no row (and one whose tokens are all dropped) still passes" 0 "ok" -- \
  python3 - "$tmp/suite/results.json" <<'PY'
import json, sys
r = [r for r in json.load(open(sys.argv[1]))["records"] if r["case"] == "sparse-k1-e8-ep8-capacity"][0]
assert r["status"] == "pass" and r["params"]["least_rows_received"] == "0", r["params"]
print("ok")
PY
check "every case with a capacity drops assignments, no dropless one does" 0 "ok" -- \
  python3 - "$tmp/suite/results.json" <<'PY'
import json, sys
recs = json.load(open(sys.argv[1]))["records"]
for r in recs:
    dropped = int(r["params"]["dropped_total"])
    assert (dropped > 0) == (r["params"]["capacity"] != "dropless"), (r["case"], dropped)
print("ok")
PY
# Each fault with the rows it must fail (pass / fail): capacity_local only the 8 with a capacity,
# tp_rows_grad_unsummed only the 2 one-step rows with tp (over steps only the parameters are
# checked, and the layer's input gradient reaches none of them).
for fault in grads_scaled_by_ep:grad_w:0:15 experts_reduced_over_dp:grad_w:0:15 \
             router_grad_partial:grad_router:0:15 capacity_local:output:7:8 \
             tp_rows_grad_unsummed:grad_input:13:2; do
  IFS=: read -r name tensor passing failing <<<"$fault"
  want="total +$passing +$failing +0 +0$"
  check "planted $name: fails, naming $tensor" 1 "$want" -- \
    "$sb" run suites/moe.yaml --out "$tmp/f-$name" --repetitions 1 --plant-fault "sharding/moe/ep=$name"
  grep -q "sharding/moe/ep: .*$tensor" "$tmp/out" && pass "$name names $tensor" ||
    fail "$name: no failure names $tensor"
done
# A sample across processes: 4 ranks under launch on gloo (its uneven all-to-alls), one step
# with a capacity on EP 4 and 3 AdamW steps of EP x FSDP.
cat > "$tmp/gloo.yaml" <<'YAML'
suite: moe-gloo
defaults: {dtype: float32, inputs: random, seed: 1234, repetitions: 1, min_time_s: 0.002}
cases:
  - name: capacity-k2-e8-ep4-probability
    workload: moe
    shape: {batch: 4, seq: 16, d_model: 32, ffn: 64, experts: 8, top_k: 2, capacity_factor: 1.0}
    mesh: 4
    strategies: ["sharding/moe/ep"]
  - name: train-fsdp2xep2-position
    workload: moe
    shape: {batch: 4, seq: 16, d_model: 32, ffn: 64, experts: 8, top_k: 2, capacity_factor: 1.0,
            drop: position}
    mesh: 2x2
    params: {axes: [dp_shard, ep]}
    steps: 3
    optimizer: {kind: adamw, lr: 0.001, weight_decay: 0.01, clip_grad_norm: 1.0}
    strategies: ["sharding/moe/ep"]
YAML
check "gloo across 4 processes: both pass" 0 "total +2 +0 +0 +0$" -- \
  "$sb" launch -n 4 -- run "$tmp/gloo.yaml" --backend gloo --out "$tmp/gloo"
cat > "$tmp/bad.yaml" <<'YAML'
suite: bad
cases:
  - name: bad-k
    workload: moe
    shape: {experts: 4, top_k: 5}
    mesh: 2
    strategies: ["sharding/moe/ep"]
YAML
check "top_k over the experts: exit 2 naming it" 2 "top_k" -- "$sb" run "$tmp/bad.yaml" --out "$tmp/bad"
cat > "$tmp/uneven.yaml" <<'YAML'
suite: uneven
cases:
  - name: e6-ep4
    workload: moe
    shape: {experts: 6, top_k: 2}
    mesh: 4
    strategies: ["sharding/moe/ep"]
YAML
cat > "$tmp/axes.yaml" <<'YAML'
suite: axes
cases:
  - name: bad-axes
    workload: moe
    shape: {experts: 4, top_k: 2}
    mesh: 2x2
    params: {axes: [tp, ep]}
    strategies: ["sharding/moe/ep"]
YAML
check "params.axes out of order: exit 2 naming it" 2 "params.axes" -- \
  "$sb" run "$tmp/axes.yaml" --out "$tmp/axes"
check "6 experts over 4 ranks: unsupported" 0 "total +0 +0 +0 +1$" -- \
  "$sb" run "$tmp/uneven.yaml" --out "$tmp/uneven"
grep -q "6 experts do not divide over 4 EP ranks" "$tmp/uneven/results.csv" &&
  pass "the row says why" || fail "the unsupported row does not say why"
finish
