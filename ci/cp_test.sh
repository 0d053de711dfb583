#!/usr/bin/env bash
# End-to-end checks of context parallelism (strategies/sharding/cp): suites/context-parallel.yaml
# on threads (every row passes against the whole-sequence reference, communication counted ==
# predicted per collective, load balancing evens the causal work and its absence shows), a
# sample on gloo through `launch` (the ring's point-to-point over c10d), and the planted faults
# (the backward reading its own keys and values at every ring step, dK/dV kept a rank short of
# home, a causal mask that ignores the load-balanced order, Ulysses' output with heads and
# sequence swapped, CP x TP's input gradient not summed over the tensor-parallel ranks): each
# fails naming the tensor that differs. Usage: ci/cp_test.sh BUILD_DIR
# SOURCE_DIR
set -uo pipefail
build=$1
src=$2
sb="$build/stratbench"
source "$src/ci/test_lib.sh"
serve_core "$build"

check "context-parallel suite on threads: every row passes" 0 "total +35 +0 +0 +0" -- \
  "$sb" run "$src/suites/context-parallel.yaml" --out "$tmp/threads" --repetitions 1 \
  --min-time 0.0001
check "bytes as predicted; memory per rank to the byte; balanced causal work even" 0 "ok 35" -- \
  python3 - "$tmp/threads/results.json" <<'PY'
import json, sys
recs = json.load(open(sys.argv[1]))["records"]
for r in recs:
    assert r["status"] == "pass", (r["case"], r["strategy_id"], r["message"])
    assert r["comm_bytes"] == r["predicted_comm_bytes"], (r["case"], r["strategy_id"])
    # The memory model (cp_memory.h; the chunking estimator for the one-rank rows) predicts
    # every rank's peak to the byte, and is judged so.
    d = r["details"]
    assert d["predicted_peak_mem_bytes_per_rank"] == d["peak_mem_bytes_per_rank"], \
        (r["case"], r["strategy_id"], d["predicted_peak_mem_bytes_per_rank"],
         d["peak_mem_bytes_per_rank"])
    assert not r["mispredicted"], (r["case"], r["strategy_id"])
    if r["strategy_id"].startswith("sharding/cp/"):
        assert d["prediction"]["memory"]["tolerance"] == 0, d["prediction"]
    if r["case"] == "tradeoff-1024-cp4-unbalanced" and r["strategy_id"] == "sharding/cp/ring/p2p":
        p = d["peak_mem_bytes_per_rank"]  # rank 0 skips every received block
        assert p[0] < min(p[1:]), p
    if not r["strategy_id"].startswith("sharding/cp/"):
        continue
    d = r["details"]["case"]
    if r["case"] == "gpt2-train-4":
        assert d["load_balanced"] and d["attention_imbalance"] == 1.0, d
    if r["case"] == "gpt2-train-4-unbalanced":
        # Contiguous quarters of a causal sequence: rank 3 sees 7x the pairs of rank 0.
        assert not d["load_balanced"] and d["attention_imbalance"] > 1.5, d
        p = d["attention_pairs_per_rank"]
        assert p == sorted(p) and p[3] > 6 * p[0], p
    calls = {c: v["calls"] for c, v in r["details"]["comm_per_rank"][0]["counted"].items()}
    if r["case"] == "gpt2-train-4" and r["strategy_id"] == "sharding/cp/ring/p2p":
        # 2 layers x (3 forward + 3 backward + 1 home) ring steps.
        assert calls.get("send_recv") == 14, calls
    if r["case"] == "gpt2-train-4" and r["strategy_id"] == "sharding/cp/ulysses":
        assert calls.get("all_to_all") == 8, calls  # 2 layers x (2 forward + 2 backward)
print("ok", len(recs))
PY

cat >"$tmp/gloo.yaml" <<'YAML'
suite: cp-gloo
defaults: {repetitions: 1, min_time_s: 0.0001, seed: 1234}
cases:
  - name: gpt2-train-4
    workload: gpt2_prefill
    shape: {batch: 2, seq: 64, d_model: 64, heads: 4, layers: 2, mode: training}
    mesh: 4
    strategies: ["sharding/cp/.*"]
  - name: cp-tp-2x2
    workload: gpt2_prefill
    shape: {batch: 2, seq: 64, d_model: 64, heads: 4, layers: 2, mode: training}
    mesh: 2x2
    strategies: ["sharding/cp/.*"]
YAML
if "$sb" run --help | grep -q gloo; then
  check "gloo: ring, all-gather and ulysses on 4 processes, 1-D and CP x TP" 0 "total +6 +0 +0 +0" -- \
    "$sb" launch -n 4 -- run "$tmp/gloo.yaml" --backend gloo --out "$tmp/gloo"
  check "gloo: bytes as predicted, memory per rank to the byte" 0 "ok 6" -- \
    python3 - "$tmp/gloo/results.json" <<'PY'
import json, sys
recs = json.load(open(sys.argv[1]))["records"]
for r in recs:
    assert r["comm_bytes"] == r["predicted_comm_bytes"], r
    d = r["details"]
    assert d["predicted_peak_mem_bytes_per_rank"] == d["peak_mem_bytes_per_rank"], \
        (r["case"], r["strategy_id"], d["predicted_peak_mem_bytes_per_rank"],
         d["peak_mem_bytes_per_rank"])
print("ok", len(recs))
PY
else
  echo "SKIP: this build has no gloo backend"
fi

# Planted faults: each must fail, naming what differs.
plant() {
  "$sb" run "$src/suites/context-parallel.yaml" --out "$tmp/$1" --repetitions 1 \
    --min-time 0.0001 --filter "^sharding/cp/$2\$" --plant-fault "sharding/cp/$2=$3"
}
check "planted: the ring backward reads its own keys and values at every step" 1 \
  "fail: gpt2-train-4 sharding/cp/ring/p2p: grad_input" -- plant f1 ring/p2p stale_kv
check "planted: dK/dV never take their last hop home" 1 \
  "fail: vit-train-4 sharding/cp/ring/p2p: grad_input" -- plant f2 ring/p2p dkv_not_returned
check "planted: ring mask ignores the load-balanced order" 1 \
  "fail: gpt2-train-4 sharding/cp/ring/p2p: output" -- plant f3 ring/p2p mask_ignores_balance
check "planted: all-gather mask ignores the load-balanced order" 1 \
  "fail: gpt2-prefill-4 sharding/cp/ring/allgather: output" -- \
  plant f4 ring/allgather mask_ignores_balance
# Two heads per rank (mesh 2): with one, heads and sequence cannot be told apart.
check "planted: ulysses' output with heads and sequence swapped" 1 \
  "fail: gpt2-train-2 sharding/cp/ulysses: output" -- plant f5 ulysses ulysses_swapped
# CP x TP: Megatron's f forgotten before the attention; the tensor-parallel ranks' input
# gradients part, which the replica check names before any tolerance.
check "planted: the attention's input gradient not summed over tensor-parallel ranks" 1 \
  "fail: cp-tp-2x2 sharding/cp/ring/p2p: replicas: grad_input .* not bit-identical" -- \
  plant f6 ring/p2p tp_input_grad_unsummed
# The memory model follows each fault's own allocations (a hop fewer, a copy more): the failing
# rows still predict every rank's peak to the byte.
check "planted rows: memory still predicted to the byte" 0 "ok 6 files, 66 rows" -- \
  python3 - "$tmp" <<'PY'
import json, sys
files = rows = 0
for f in ["f1", "f2", "f3", "f4", "f5", "f6"]:
    recs = json.load(open(f"{sys.argv[1]}/{f}/results.json"))["records"]
    assert recs and any(r["status"] == "fail" for r in recs), f
    for r in recs:
        d = r["details"]
        assert d["predicted_peak_mem_bytes_per_rank"] == d["peak_mem_bytes_per_rank"], (f, r["case"])
        rows += 1
    files += 1
print("ok", files, "files,", rows, "rows")
PY

# The model's replay printed into the allocation trace, lined up against the measured step by
# reports/memory_trace.py --model, allocation for allocation: every sharding/cp row of the suite
# (the one-rank rows print no replay), and the planted rows whose faults change allocations.
SB_MEMORY_TRACE=1 "$sb" run "$src/suites/context-parallel.yaml" --out "$tmp/trace" \
  --repetitions 1 --min-time 0.0001 --filter '^sharding/cp/' 2>"$tmp/trace.err" >/dev/null
check "memory_trace.py --model: the replay agrees with every allocation of the 33 rows" 0 \
  "^33 agree" -- bash -c "python3 '$src/reports/memory_trace.py' '$tmp/trace.err' --model |
    grep -c 'model: agrees with every allocation' | sed 's/$/ agree/'"
for f in "ring/p2p dkv_not_returned" "ulysses ulysses_swapped"; do
  set -- $f
  SB_MEMORY_TRACE=1 "$sb" run "$src/suites/context-parallel.yaml" --out "$tmp/trace-$2" \
    --repetitions 1 --min-time 0.0001 --filter "^sharding/cp/$1\$" \
    --plant-fault "sharding/cp/$1=$2" 2>"$tmp/trace-$2.err" >/dev/null
  check "memory_trace.py --model: planted $2, the replay agrees with every allocation" 0 \
    "^11 agree" -- bash -c "python3 '$src/reports/memory_trace.py' '$tmp/trace-$2.err' --model |
      grep -c 'model: agrees with every allocation' | sed 's/$/ agree/'"
done
# One term of the first row's replay (the 40th line before its step) made ten times larger:
# shown where it parts.
awk '/^mem reset/ {reset = 1} /^model / && !reset && ++n == 40 {sub(/[0-9]+/, "&0")} {print}' \
  "$tmp/trace.err" >"$tmp/trace-off.err"
check "memory_trace.py --model: a replay one term off is shown where it parts" 3 \
  "model: parts from the measurement at run" -- \
  python3 "$src/reports/memory_trace.py" "$tmp/trace-off.err" --model --step 1
finish
