#!/usr/bin/env bash
# End-to-end checks of `stratbench solve parallel` (docs/compose.md#the-degree-search): the
# search over a LLaMA-3-8B-shaped graph on 64 ranks (every listed configuration fits the limit
# and the list is ranked by step time; the JSON holds the model's summary and the counts), a
# limit nothing fits (exit 1 naming the least memory), malformed input (exit 2 naming the
# option), and --verify without a PyTorch module (exit 2). The verified run of the top K is
# ci/compose_test.sh's (it needs PyTorch 2.x).
# Usage: ci/solve_parallel_test.sh BUILD SOURCE
set -uo pipefail
build=$1
src=$2
sb="$build/stratbench"
source "$src/ci/test_lib.sh"
serve_core "$build"
cd "$src"
llama3='{"layers": 32, "d_model": 4096, "heads": 32, "kv_heads": 8, "ffn": 14336, "vocab": 128256, "seq": 8192, "batch": 64}'
prices=(--ranks-per-node 8 --gflops 400000 --copy-bandwidth 2000 --intra-node-bandwidth 200
        --inter-node-bandwidth 25 --dtype bfloat16)

check "LLaMA-3-8B on 64 ranks in 80 GB: ranked" 0 "210 degree assignments" -- \
  "$sb" solve parallel --workload llama --shape "$llama3" --ranks 64 --max-memory 80e9 \
  "${prices[@]}" --top 50 --out "$tmp/search.json"
check "every listed configuration fits, fastest first, on 64 ranks" 0 "ok" -- \
  python3 - "$tmp/search.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
s = j["search"]
ranked = s["ranked"]
assert len(ranked) == 50, len(ranked)
steps = [p["step_us"] for p in ranked]
assert steps == sorted(steps), "not ranked by step time"
for p in ranked:
    c = p["config"]
    assert c["pp"] * c["dp_replicate"] * c["dp_shard"] * c["cp"] * c["tp"] == 64, c
    assert p["peak_bytes"] <= 80e9, p
    parts = p["memory"]
    assert abs(sum(parts.values()) - p["peak_bytes"]) <= 1e-6 * p["peak_bytes"], p
    assert 32 % c["tp"] == 0 and 8 % c["tp"] == 0, c
units = j["model"]["units"]
assert len(units) == 34 and sum(u["block"] for u in units) == 32, len(units)
# LLaMA-3-8B's parameters: 8.03 billion.
params = sum(u["tp_params"] + u["replicated_params"] for u in units)
assert abs(params - 8.03e9) < 0.01e9, params
assert s["fitting"] + s["over_memory"] + sum(s["refused"].values()) == s["configurations"], s
print("ok")
PY
check "a limit nothing fits: exit 1 with the least memory" 1 "least memory is [0-9]+ bytes" -- \
  "$sb" solve parallel --workload llama --shape "$llama3" --ranks 8 --max-memory 1e9 "${prices[@]}"
check "a rank count no configuration takes: exit 1" 1 "no configuration of 7 ranks" -- \
  "$sb" solve parallel --workload llama --shape "$llama3" --ranks 7 --no-cp --no-pp "${prices[@]}"
check "malformed --shape: exit 2 naming it" 2 "shape" -- \
  "$sb" solve parallel --workload llama --shape '{"layers": 0}' --ranks 8
check "an unknown schedule: exit 2" 2 "schedules" -- \
  "$sb" solve parallel --workload llama --ranks 8 --schedules zigzag
check "mlp has no heads to cut: exit 2" 2 "no attention" -- \
  "$sb" solve parallel --workload mlp --ranks 8
check "--verify without a module: exit 2" 2 "--model" -- \
  "$sb" solve parallel --workload llama --ranks 8 --verify 2 --verify-out "$tmp/v"
finish
