#!/usr/bin/env bash
# End-to-end checks of composed parallelism (docs/compose.md). Where this build's SB_TORCH_PYTHON
# has PyTorch 2.x (the torch2 leg; skipped, exit 77, elsewhere): suites/compose.yaml passes,
# torchtitan's composition of PyTorch's own FSDP2, TP/SP, pipelining and checkpointing on 2-D,
# 3-D and 4-D meshes, every rank's shard of every parameter and optimizer state after 3 steps and
# every step's loss and gradient norm against LibTorch's reference, the plan's layout checked per
# rank, collectives counted and peaks measured on every rank; each planted field fault fails its
# row naming what it got wrong: clipping's norm not summed over the pipeline's stages, the
# norms left out of the tp plan (their gradients partial over tp), the schedule dividing a summed
# loss by the micro-batches, the loss not scaled for FSDP's mean, the output left out of the tp
# plan (every number right: the layout check names it); the 2-D case on gloo under launch; a
# rank that fails abandons its peer at once; `solve parallel --verify 3` runs the degree
# search's top three as rows.
# Usage: ci/compose_test.sh BUILD SOURCE
set -uo pipefail
build=$1
src=$2
sb="$build/stratbench"
source "$src/ci/test_lib.sh"
serve_core "$build"
cd "$src"
py=$(sed -n 's/^SB_TORCH_PYTHON:FILEPATH=//p' "$build/CMakeCache.txt")
py=${SB_TORCH_PYTHON:-$py}
if ! "$py" -c "from torch.distributed.fsdp import fully_shard; import torch.distributed.pipelining" \
    2>/dev/null; then
  echo "SKIP: $py has no PyTorch 2.x (the torch2 leg runs these checks)"
  exit 77
fi
models="$build/compose-models"
trace=$(sed -n 's/^SB_TRACE_PYTHON:FILEPATH=//p' "$build/CMakeCache.txt")
"$trace" reference/models/trace_models.py --out "$models" --only meta_llama >/dev/null ||
  { echo "FAIL tracing the suite's model with $trace"; exit 1; }
suite="$tmp/compose.yaml"
sed "s#build-torch2/models/#$models/#g" suites/compose.yaml > "$suite"

check "compose suite: every composition passes" 0 "total +6 +0 +0 +0 +0$" -- \
  "$sb" run "$suite" --out "$tmp/suite" --repetitions 1
check "every rank verified, its layout checked, measured and counted" 0 "ok" -- \
  python3 - "$tmp/suite/results.json" <<'PY'
import json, sys
records = json.load(open(sys.argv[1]))["records"]
assert len(records) == 6, len(records)
meshes = set()
for r in records:
    d = r["details"]
    assert r["status"] == "pass", (r["case"], r["message"])
    meshes.add(len(d["mesh"]) if "mesh" in d else r["mesh"].count("x") + 1)
    # Every step's loss and norm, every parameter and optimizer state.
    t = r["tensor_err_ratio"]
    assert "loss" in t and "grad_norm" in t, r["case"]
    assert any(k.startswith("state/") for k in t) and any(k.startswith("param/") for k in t), r
    # The plan's layout checked on every rank of every parameter, and nothing wrong with it.
    spec = d["spec_check"]
    assert spec["checked"] >= 2 * r["world_size"] and not spec["problems"], (r["case"], spec)
    assert all(p > s for p, s in zip(d["peak_mem_bytes_per_rank"], d["step_start_bytes_per_rank"])), r
    assert r["comm_calls"] > 0 and r["comm_bytes"] > 0, r
    if "pp" in r["case"]:
        # A pipeline stage's parameters on its ranks only: the first block's on some, not all.
        assert any("stage's pp rank only" in s for s in spec["specs"]), spec["specs"]
print(sorted(meshes))
assert {2, 3, 4} <= meshes, meshes
print("ok")
PY

# Each fault on the case it is about (one suite file a case).
python3 - "$suite" "$tmp" <<'PY'
import sys, yaml
s = yaml.safe_load(open(sys.argv[1]))
for name, out in (("meta-llama-pp2xfsdp2xtp2-adamw", "pp3"), ("meta-llama-fsdp2xtp2-nosp-sgd",
                                                               "nosp")):
    yaml.safe_dump(dict(s, cases=[c for c in s["cases"] if c["name"] == name]),
                   open(f"{sys.argv[2]}/{out}.yaml", "w"))
PY
plant() {  # plant CASE-FILE NAME FAULT PATTERN: the case fails naming PATTERN
  check "planted: $2" 1 "$4" -- "$sb" run "$tmp/$1.yaml" --out "$tmp/$3" --repetitions 1 \
    --plant-fault "torch/compose=$3"
}
plant pp3 "clipping's norm not summed over the pipeline's stages" clip_norm_one_axis \
  "meta-llama-pp2xfsdp2xtp2-adamw torch/compose: .*(loss|param/|state/)"
plant pp3 "the norms out of the tp plan: their gradients partial, the tp replicas apart" \
  norm_grad_partial "pp2xfsdp2xtp2-adamw torch/compose: replicas: param/layers.0.attention_norm.weight"
plant pp3 "the schedule dividing a summed loss's gradients by the micro-batches" \
  grads_scaled_by_microbatches "pp2xfsdp2xtp2-adamw torch/compose: grad_norm@rank0"
plant pp3 "the loss not scaled for FSDP's mean over the data-parallel ranks" loss_not_mean_scaled \
  "pp2xfsdp2xtp2-adamw torch/compose: grad_norm@rank0"
plant nosp "the output left out of the tp plan: every number right, the layout check names it" \
  output_not_tp "nosp-sgd torch/compose: layout: param/output.weight on rank 0 is declared"
# A sample on gloo: four stratbench processes (launch), each starting its rank's Python runner.
python3 - "$suite" "$tmp/gloo.yaml" <<'PY'
import sys, yaml
s = yaml.safe_load(open(sys.argv[1]))
s["cases"] = [c for c in s["cases"] if c["name"] == "meta-llama-fsdp2xtp2-adamw"]
yaml.safe_dump(s, open(sys.argv[2], "w"))
PY
check "gloo: FSDP2 x TP/SP under launch -n 4, every rank verified" 0 "total +1 +0 +0 +0 +0$" -- \
  "$sb" launch -n 4 -- run "$tmp/gloo.yaml" --backend gloo --out "$tmp/gloo" --repetitions 1
# A rank that fails leaves its peers blocked in a collective with it: they are abandoned at once
# (the row an error naming the failing rank's words), not after SB_TORCH_TIMEOUT_S (600 s).
cat > "$tmp/one_rank_fails.py" <<'PY'
import torch.distributed as dist
MESH_DIM_NAMES = ("dp",)
BATCH_AXES = ("dp",)
def parallelize(model, mesh, ctx):
    if ctx.rank == 1:
        raise RuntimeError("planted: rank 1 fails before the barrier")
    dist.barrier()  # rank 0 would wait here for rank 1 until the timeout
    return model
PY
python3 - "$suite" "$tmp/one_rank_fails.yaml" "$tmp/one_rank_fails.py" <<'PY'
import sys, yaml
s = yaml.safe_load(open(sys.argv[1]))
c = dict(s["cases"][0], name="one-rank-fails", mesh=[2], strategies=["torch/file"],
         params={"strategy_file": sys.argv[3]})
yaml.safe_dump(dict(s, cases=[c]), open(sys.argv[2], "w"))
PY
start=$(date +%s)
check "a rank that fails: an error row naming it, its peer abandoned" 1 \
  "planted: rank 1 fails before the barrier" -- \
  "$sb" run "$tmp/one_rank_fails.yaml" --out "$tmp/one_rank_fails" --repetitions 1
took=$(( $(date +%s) - start ))
[ "$took" -le 120 ] && pass "the peer abandoned at once: the row ended in ${took} s" ||
  fail "the row took ${took} s: the peer waited out the timeout"
check "params with a wrong value: exit 2 naming the key" 2 "params.schedule \"zigzag\": expected" -- \
  bash -c "sed 's/schedule: interleaved-1f1b/schedule: zigzag/' '$suite' > '$tmp/bad.yaml' &&
           '$sb' run '$tmp/bad.yaml' --out '$tmp/bad' --repetitions 1"
# The degree search's top 3 on 4 ranks of this host (2 cores shared), run as torch/compose rows:
# each passes, each prediction beside its measured step time and peak.
check "solve parallel --verify 3: the top three run and pass" 0 "rank correlation" -- \
  "$sb" solve parallel --model "$models/meta_llama.pt" \
  --input '{"shape": [4, 16], "dtype": "int64", "low": 0, "high": 64}' --ranks 4 \
  --host-cores 2 --verify 3 --verify-out "$tmp/search" --out "$tmp/search.json"
check "every verified row has its prediction and its measurement" 0 "ok" -- \
  python3 - "$tmp/search.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
rows = j["verified"]
assert len(rows) == 3, rows
for r in rows:
    assert r["status"] == "pass", r
    assert r["measured_step_us"] > 0 and r["measured_peak_bytes"] > 0, r
    assert r["predicted_step_us"] > 0 and r["predicted_peak_bytes"] > 0, r
print("ok")
PY
finish
