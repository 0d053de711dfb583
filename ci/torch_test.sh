#!/usr/bin/env bash
# End-to-end checks of PyTorch's own strategies as executors (strategies/torch/,
# docs/torch-strategies.md). Where this build's SB_TORCH_PYTHON has PyTorch 2.x (the torch2 leg):
# suites/torch.yaml passes with every row verified (every step's loss and gradient norm, every
# shard of every parameter and optimizer state; outputs and gradients in the one-step case),
# each multi-rank row's collectives counted and its peak measured; the side-by-side table of
# PyTorch's executors and stratbench's twins is written; each planted misuse of PyTorch's API
# fails its row naming the tensor; a user's strategy file with a syntax error is a row error
# naming the file. On every leg: a Python without PyTorch 2.x makes every torch/* row
# `unsupported`, saying what it found, and nothing else; a malformed SB_TORCH_TIMEOUT_S is exit 2
# naming it. Usage: ci/torch_test.sh BUILD SOURCE
set -uo pipefail
build=$1
src=$2
sb="$build/stratbench"
source "$src/ci/test_lib.sh"
serve_core "$build"
cd "$src"
py=$(sed -n 's/^SB_TORCH_PYTHON:FILEPATH=//p' "$build/CMakeCache.txt")
models="$build/torch-models"
# The suite's models, traced by this leg's tracing Python (what the fixture trace_models does).
trace=$(sed -n 's/^SB_TRACE_PYTHON:FILEPATH=//p' "$build/CMakeCache.txt")
"$trace" reference/models/trace_models.py --out "$models" --only meta_llama gpt2 gpt2_dropout encoder_pre >/dev/null ||
  { echo "FAIL tracing the suite's models with $trace"; exit 1; }
suite="$tmp/torch.yaml"
sed "s#build-torch2/models/#$models/#g" suites/torch.yaml > "$suite"

# A missing PyTorch: every row unsupported, saying so (the debian leg's python3 has 1.13).
check "no PyTorch 2.x: every torch/* row unsupported, naming the Python and what it said" 0 \
  "total +0 +0 +0 +[1-9]" -- env SB_TORCH_PYTHON=/usr/bin/python3 "$sb" run "$suite" \
  --filter '^torch/' --out "$tmp/missing" --repetitions 1
check "the unsupported rows say what is missing" 0 "ok" -- python3 - "$tmp/missing/results.csv" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
assert rows and all(r["status"] == "unsupported" and "/usr/bin/python3" in r["message"]
                    and "PyTorch 2.x" in r["message"] for r in rows), rows
print("ok")
PY
check "a malformed SB_TORCH_TIMEOUT_S: exit 2 naming it, before any row" 2 \
  "SB_TORCH_TIMEOUT_S='5abc': expected a number of seconds" -- \
  env SB_TORCH_TIMEOUT_S=5abc "$sb" run "$suite" --filter '^torch/ddp$' --out "$tmp/timeout"
check "a Python that does not exist: unsupported, 'cannot be started'" 0 "cannot be started" -- \
  bash -c "SB_TORCH_PYTHON=/nonexistent/python '$sb' run '$suite' --filter '^torch/ddp$' \
    --out '$tmp/none' --repetitions 1 >/dev/null && grep -h 'cannot be started' '$tmp/none/results.csv'"

# A model that draws random numbers, said or not (every leg: the import is LibTorch's).
sed 's#, random: true##' "$suite" > "$tmp/unsaid.yaml"
check "a dropout model without random: true: exit 2 naming the node and the key" 2 \
  "dropout with p = 0.1.* in training .*say shape key random: true" -- \
  "$sb" run "$tmp/unsaid.yaml" --case '^gpt2-dropout-checkpointed$' --out "$tmp/unsaid"
sed 's#gpt2_dropout.pt, random: true#gpt2.pt, random: true#' "$suite" > "$tmp/nodraw.yaml"
check "random: true on a model that draws nothing: exit 2" 2 \
  "gpt2.pt: shape key random: true, but the model draws nothing" -- \
  "$sb" run "$tmp/nodraw.yaml" --case '^gpt2-dropout-checkpointed$' --out "$tmp/nodraw"
sed 's#random: true#random: 1#' "$suite" > "$tmp/badrandom.yaml"
check "random: 1: exit 2 naming the key" 2 "shape key 'random' must be true or false" -- \
  "$sb" run "$tmp/badrandom.yaml" --case '^gpt2-dropout-checkpointed$' --out "$tmp/badrandom"

if ! "$py" -c "from torch.distributed.fsdp import fully_shard" 2>/dev/null; then
  echo "note: $py has no PyTorch 2.x (this leg's LibTorch is $(sed -n 's/^Torch_DIR:PATH=//p' \
    "$build/CMakeCache.txt")): the suite itself runs on the torch2 leg"
  finish
  exit $?
fi

check "torch suite: every row passes (context_parallel unsupported on the CPU; stratbench's checkpointing on the dropout model)" 0 \
  "total +[0-9]+ +0 +0 +2 +0$" -- \
  "$sb" run "$suite" --out "$tmp/suite" --repetitions 3
check "every row verified, measured and counted; twins side by side" 0 "ok" -- \
  python3 - "$tmp/suite/results.json" "$src" <<'PY'
import json, subprocess, sys
records = json.load(open(sys.argv[1]))["records"]
torch_rows = [r for r in records if r["strategy_id"].startswith("torch/")]
# context_parallel: PyTorch 2.13 has no sharding strategy for the CPU's SDPA kernel.
cp = [r for r in torch_rows if r["strategy_id"] == "torch/cp"]
assert cp and all(r["status"] == "unsupported" and "context_parallel does not run here" in
                  r["message"] for r in cp), cp
torch_rows = [r for r in torch_rows if r["strategy_id"] != "torch/cp"]
# A model that draws random numbers: stratbench's own checkpointing cannot repeat its draws and
# says so; PyTorch's checkpointing, restoring the generator, repeats the forward's masks.
drop = [r for r in records if r["case"] == "gpt2-dropout-checkpointed"]
assert {r["strategy_id"]: r["status"] for r in drop} == {
    "torch/checkpoint": "pass", "torch/sac": "pass", "checkpointing/full": "unsupported"}, drop
assert all("draws random numbers" in r["message"] for r in drop if r["status"] != "pass"), drop
for r in drop:
    if r["status"] == "pass":
        # The reference's own rounding, measured in float64 from the same seeds: rounding only
        # (a shadow drawing other masks would be off by the masks, and loosen every tolerance).
        rr = r["details"].get("reference_rounding")
        norm = [t for t in r["details"]["tensors"] if t["tensor"] == "grad_norm"][0]
        assert rr["grad_norm"] < 1e-5 * abs(norm["worst_expected"]), (rr, norm)
# A schedule from a file: PyTorch's runtime and stratbench's pipeline/csv on the same CSV.
csv_rows = {r["strategy_id"]: r for r in records if r["case"] == "meta-llama-pipeline-csv"}
assert set(csv_rows) == {"torch/pipeline-csv", "pipeline/csv"}, list(csv_rows)
assert all(r["status"] == "pass" for r in csv_rows.values()), csv_rows
# GPT-2's fused qkv under TP and SP: each rank's rows of q, k and v (a strided shard) checked
# against the plan's per-part layout, as one box of the view [3, D, D].
gpt2_tp = [r for r in records if r["case"] in ("gpt2-tp2-sgd", "gpt2-tp2-one-step")]
assert {(r["case"], r["strategy_id"], r["status"]) for r in gpt2_tp} == {
    (c, s, "pass") for c in ("gpt2-tp2-sgd", "gpt2-tp2-one-step")
    for s in ("torch/tp", "torch/sp")}, [(r["case"], r["strategy_id"], r["status"]) for r in gpt2_tp]
for r in gpt2_tp:
    if r["case"] == "gpt2-tp2-sgd":
        assert any("_StridedShard" in s for s in r["details"]["spec_check"]["specs"]), r["details"]["spec_check"]
        assert not r["details"]["spec_check"]["problems"], r["details"]["spec_check"]
        assert "param/h.0.attn.c_attn.weight" in r["tensor_err_ratio"], r
    else:
        assert "grad/h.0.attn.c_attn.weight" in r["tensor_err_ratio"], r
assert len(torch_rows) >= 17 + 60 + 16, len(torch_rows)
linear = [r for r in torch_rows if r["workload"] == "linear"]
assert len({r["strategy_id"] for r in linear if r["case"] == "linear-mesh2"}) == 60, len(linear)
for r in torch_rows:
    assert r["status"] == "pass", (r["case"], r["strategy_id"], r["message"])
    d = r["details"]
    assert d["executor"]["torch"].startswith("2."), d["executor"]
    # Every rank measured: a peak over what was live at the step's start.
    assert all(p > s for p, s in zip(d["peak_mem_bytes_per_rank"], d["step_start_bytes_per_rank"])), r
    if r["workload"] == "linear":
        # DTensor's operator: output and every gradient, each rank's piece; an operand with
        # pending sums or a shard the op cannot use is redistributed, counted.
        assert {"output", "grad_input", "grad_weight", "grad_bias"} <= set(r["tensor_err_ratio"]), r
        # Both sharded on the batch's rows and the weight's: DTensor must gather one of them
        # (pending sums it leaves pending, lazily: no collective in the step).
        if r["strategy_id"] == "torch/dtensor/linear/S0RRxS0RxR":
            assert r["comm_calls"] > 0, r
        continue
    if r["world_size"] > 1:
        assert r["comm_bytes"] > 0 and r["comm_calls"] > 0, (r["case"], r["strategy_id"])
    else:
        assert r["comm_calls"] == 0, r
    # Training rows check the optimizer's state after the last step, every rank's shard.
    if r["strategy_id"].startswith("torch/pipeline"):
        # Every stage's parameters on their rank, every other rank holding none of them.
        assert any(t.startswith("param/layers.1") for t in r["tensor_err_ratio"]), r
    if not r["case"].endswith("one-step"):
        assert any("state/" in t for t in r["tensor_err_ratio"]), list(r["tensor_err_ratio"])[:3]
        assert "grad_norm" in r["tensor_err_ratio"], r
    else:
        assert any(t.startswith("grad/") for t in r["tensor_err_ratio"]), r
table = subprocess.run([sys.executable, sys.argv[2] + "/reports/torch_side_by_side.py",
                        sys.argv[1]], capture_output=True, text=True, check=True).stdout
for pair in ("torch/ddp | pass", "torch/fsdp2 | pass", "torch/hsdp | pass",
             "torch/checkpoint | pass", "torch/pipeline-1f1b | pass",
             "torch/pipeline-interleaved-1f1b | pass"):
    assert pair in table, (pair, table)
print(table)
print("ok")
PY
cp "$tmp/suite/results.json" "$build/torch-results.json" 2>/dev/null || true

# Planted misuses of PyTorch's API: each row fails, naming the tensor.
check "planted: FSDP2 and DDP with the gradient divided once more than the loss was scaled" 1 \
  "torch/fsdp2: grad_norm@rank0.*torch/ddp: grad_norm@rank0|torch/ddp: grad_norm@rank0.*" -- \
  "$sb" run "$suite" --filter '^torch/(ddp|fsdp2)$' --out "$tmp/f1" --repetitions 1 \
  --plant-fault torch/fsdp2=grad_divided_twice --plant-fault torch/ddp=grad_divided_twice
check "planted: HSDP with the gradient divided twice" 1 "torch/hsdp: (loss|grad_norm)@rank0" -- \
  "$sb" run "$suite" --filter '^torch/hsdp$' --out "$tmp/f2" --repetitions 1 \
  --plant-fault torch/hsdp=grad_divided_twice
check "planted: SP with the norms out of the plan: their gradients partial, the replicas apart" 1 \
  "torch/sp: replicas: param/layers.0.attention_norm.weight" -- \
  "$sb" run "$suite" --filter '^torch/sp$' --out "$tmp/f3" --repetitions 1 \
  --plant-fault torch/sp=norm_grad_partial

check "planted: plain ColwiseParallel on GPT-2's fused qkv (a run of [q; k] a rank): fails, named" 1 \
  "gpt2-tp2-sgd torch/tp: layout: param/h.0.attn.c_attn.weight on rank 0 is declared \\[0:48, 0:32\\]" -- \
  "$sb" run "$suite" --case '^gpt2-tp2' --out "$tmp/f9" --repetitions 1 \
  --plant-fault torch/tp=fused_qkv_colwise --plant-fault torch/sp=fused_qkv_colwise
check "planted: every fused-qkv row fails on its numbers too (the one-step output, the loss)" 0 "ok" -- \
  python3 - "$tmp/f9/results.json" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))["records"]
assert len(rows) == 4 and all(r["status"] == "fail" for r in rows), [(r["case"], r["status"]) for r in rows]
for r in rows:
    bad = {t for t, e in r["tensor_err_ratio"].items() if e is None or e > 1}
    assert ("output" if r["case"].endswith("one-step") else "loss") in bad, (r["case"], sorted(bad)[:5])
print("ok")
PY

check "planted: a pipeline schedule left dividing a summed loss's gradients by the micro-batches" 1 \
  "torch/pipeline-1f1b: loss@rank0.*grad_norm@rank0" -- \
  "$sb" run "$suite" --filter '^torch/pipeline-1f1b$' --out "$tmp/f5" --repetitions 1 \
  --plant-fault torch/pipeline-1f1b=grads_scaled_by_microbatches

check "planted: a CSV schedule left dividing a summed loss's gradients by the micro-batches" 1 \
  "torch/pipeline-csv: loss@rank0.*grad_norm@rank0" -- \
  "$sb" run "$suite" --filter '^torch/pipeline-csv$' --out "$tmp/f7" --repetitions 1 \
  --plant-fault torch/pipeline-csv=grads_scaled_by_microbatches
check "planted: checkpointing a dropout model without restoring the generator: other masks" 1 \
  "torch/checkpoint: loss@rank0.*grad_norm@rank0.*param/" -- \
  "$sb" run "$suite" --case '^gpt2-dropout-checkpointed$' --filter '^torch/(checkpoint|sac)$' \
  --out "$tmp/f8" --repetitions 1 --plant-fault torch/checkpoint=recompute_without_rng_state \
  --plant-fault torch/sac=recompute_without_rng_state
check "planted: both checkpointing rows fail on the masks" 0 "ok" -- python3 - "$tmp/f8/results.csv" <<'PY'
import csv, sys
rows = {r["strategy_id"]: r for r in csv.DictReader(open(sys.argv[1]))}
assert {k: r["status"] for k, r in rows.items()} == {"torch/checkpoint": "fail",
                                                      "torch/sac": "fail"}, rows
print("ok")
PY
# A V-shaped file (rank 0 holds stages 0 and 3, rank 1 stages 1 and 2): PyTorch's runtime runs
# it; stratbench's pipeline/csv does not run neighbouring stages on one rank, and says so.
printf '%s\n' 0F0,0F1,0F2,0F3,3F0,3F1,3F2,3F3,3B0,3B1,3B2,3B3,0B0,0B1,0B2,0B3 \
  1F0,1F1,1F2,1F3,2F0,2F1,2F2,2F3,2B0,2B1,2B2,2B3,1B0,1B1,1B2,1B3 > "$tmp/v.csv"
sed "s#suites/schedules/zb-h1-2x4.csv#$tmp/v.csv#" "$suite" > "$tmp/v.yaml"
check "a V-shaped CSV schedule: PyTorch's runtime passes, stratbench's pipeline/csv unsupported" 0 \
  "meta-llama-pipeline-csv +1 +0 +0 +1 +0" -- \
  "$sb" run "$tmp/v.yaml" --case '^meta-llama-pipeline-csv$' --out "$tmp/v" --repetitions 1
check "a CSV schedule for 3 ranks on a mesh of 2: exit 2 naming the file" 2 \
  "params.csv: .*zb3.csv schedules 3 ranks; the mesh has 2" -- bash -c "
  '$sb' solve pipeline --stages 3 --microbatches 4 --schedule 1f1b --write-csv '$tmp/zb3.csv' \
    >/dev/null && sed 's#suites/schedules/zb-h1-2x4.csv#$tmp/zb3.csv#' '$suite' > '$tmp/zb3.yaml' &&
  '$sb' run '$tmp/zb3.yaml' --filter '^torch/pipeline-csv$' --out '$tmp/zb3' --repetitions 1"

check "planted: DTensor's linear with its pending sums handed back as whole" 1 \
  "torch/dtensor/linear/RRS0xRS0xR: replicas: output" -- \
  "$sb" run "$suite" --filter '^torch/dtensor/linear/RRS0xRS0xR$' --out "$tmp/f6" --repetitions 1 \
  --plant-fault torch/dtensor/linear/RRS0xRS0xR=partial_reported_whole

# A user's strategy file that does not import: the row is an error naming the file.
printf 'def parallelize(model, mesh, ctx:\n    return model\n' > "$tmp/broken.py"
sed "s#examples/torch_strategy/fsdp_checkpointed.py#$tmp/broken.py#" "$suite" > "$tmp/broken.yaml"
check "a user's strategy file with a syntax error: an error row naming the file" 1 "broken.py" -- \
  "$sb" run "$tmp/broken.yaml" --filter '^torch/file$' --out "$tmp/f4" --repetitions 1
finish
