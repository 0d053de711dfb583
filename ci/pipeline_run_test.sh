#!/usr/bin/env bash
# End-to-end checks of the pipeline family (strategies/pipeline/):
# suites/pipeline.yaml on threads (GPipe, 1F1B, interleaved 1F1B and ZB-H1 on 2 and 4 stages,
# PP x DP on 2x2; bitwise against the same micro-batches accumulated on one rank where one
# replica accumulates in order; communication counted == predicted; the measured timeline beside
# the dry run's), a sample on gloo through `launch`, a schedule read from
# torch.distributed.pipelining's CSV (as `solve pipeline` writes it, and one that accumulates
# out of order: not bitwise, within its stated tolerance), and the planted faults: a gradient
# accumulated twice, a 1F1B warm-up one short, a W before its I, a send to the wrong stage.
# Imported models (GPT-2 with its tied embedding on 4 stages, LLaMA, ViT) run from the traced
# files the ctest fixture trace_models writes to BUILD_DIR/models.
# Usage: ci/pipeline_run_test.sh BUILD_DIR SOURCE_DIR
set -uo pipefail
build=$1
src=$2
sb="$build/stratbench"
source "$src/ci/test_lib.sh"
serve_core "$build"

# The suite names its models as build/models/...: this build's.
suite="$tmp/pipeline.yaml"
sed "s#build/models/#$build/models/#g" "$src/suites/pipeline.yaml" >"$suite"
check "pipeline suite on threads: every row passes" 0 "total +40 +0 +0 +0" -- \
  "$sb" run "$suite" --out "$tmp/threads" --repetitions 1 --min-time 0.0001
check "bitwise where one replica accumulates in order; bytes as predicted; timelines recorded" 0 \
  "ok 40" -- python3 - "$tmp/threads/results.json" <<'PY'
import json, sys
recs = json.load(open(sys.argv[1]))["records"]
for r in recs:
    key = (r["case"], r["strategy_id"])
    assert r["status"] == "pass", (key, r["message"])
    assert r["comm_bytes"] == r["predicted_comm_bytes"] > 0, key
    dp = "x" in r["mesh"]
    if r["workload"] == "torchscript":
        # Against the module's own kernels: within a tolerance that says so; where the graph's
        # operators are the module's (GPT-2, ViT), every tensor to the bit on one replica but
        # a tied parameter's (its stages' sums added).
        assert "imported graph" in r["tolerance"] or "replicas" in r["tolerance"], key
        errs = r["tensor_err_ratio"]
        if not dp and not r["case"].startswith("llama"):
            off = {k: v for k, v in errs.items() if v != 0}
            assert set(off) <= {"grad/wte.weight"}, (key, off)
        if r["case"].startswith("gpt2-12"):
            tied = [t["tolerance"] for t in r["details"]["tensors"] if t["tensor"] == "grad/wte.weight"]
            assert tied and all("tied parameter" in t for t in tied), key
    else:
        assert r["tolerance"].startswith("bitwise") != dp, (key, r["tolerance"])
    p = r["details"]["executor"]["pipeline"]
    stages = p["stages"]
    assert len(p["stage_layers"]) == stages + 1, p["stage_layers"]
    ranks = int(r["mesh"].split("x")[0])
    for side in ("measured", "predicted"):
        assert len(p[side]["idle_us_per_rank"]) == ranks, (key, side)
        assert 0 <= p[side]["bubble_fraction"] < 1, (key, side, p[side])
        assert p[side]["step_us"] > 0, (key, side)
    if r["strategy_id"] == "pipeline/interleaved-1f1b":
        assert stages == 2 * ranks, (key, stages)
    if r["case"] == "gpt2-2-stages-balanced":
        assert p["stage_layers"] == [0, 2, 5], p["stage_layers"]  # by count: [0, 3, 5]
    # Memory: the dry run on each action's profiled bytes, every rank to the byte.
    d = r["details"]
    assert d["predicted_peak_mem_bytes_per_rank"] == d["peak_mem_bytes_per_rank"], \
        (key, d["predicted_peak_mem_bytes_per_rank"], d["peak_mem_bytes_per_rank"])
    assert "memory" not in r["mispredicted"] and d["prediction"]["memory"]["tolerance"] == 0, key
    # The bubble is judged on every row (10% of the measured fraction, or 2 points of the step):
    # recorded here, not asserted, since ctest runs other tests beside this one on these cores.
    assert d["prediction"]["bubble"]["tolerance"] > 0, key
# 1F1B holds fewer micro-batches in flight than GPipe past the first stage.
peak = {(r["case"], r["strategy_id"]): r["details"]["peak_mem_bytes_per_rank"] for r in recs}
g, o = peak[("gpt2-4-stages", "pipeline/gpipe")], peak[("gpt2-4-stages", "pipeline/1f1b")]
assert all(o[k] < g[k] for k in (1, 2, 3)), (g, o)
print("ok", len(recs))
PY

cat >"$tmp/gloo.yaml" <<YAML
suite: pipeline-gloo
defaults: {dtype: float32, seed: 1234, repetitions: 1, min_time_s: 0.0001}
cases:
  - name: mlp-4-stages
    workload: mlp_chain
    shape: {batch: 64, width: 64, depth: 8, dropout: 0, microbatches: 8}
    mesh: 4
    strategies: ["pipeline/(gpipe|1f1b|interleaved-1f1b|zb-h1)"]
  - name: gpt2-pp-dp-2x2
    workload: gpt2_stack
    shape: {batch: 8, seq: 16, d_model: 32, heads: 2, layers: 3, dropout: 0, microbatches: 4}
    mesh: 2x2
    strategies: ["pipeline/(1f1b|zb-h1)"]
  # The tied embedding's parts exchanged between processes.
  - name: gpt2-12-imported-4-stages
    workload: torchscript
    shape: {file: $build/models/gpt2_12.pt, microbatches: 4,
            inputs: [{shape: [8, 16], dtype: int64, low: 0, high: 64}]}
    mesh: 4
    strategies: ["pipeline/1f1b"]
YAML
if "$sb" run --help | grep -q gloo; then
  check "gloo: four schedules on 4 processes, PP x DP, an imported model" 0 "total +7 +0 +0 +0" -- \
    "$sb" launch -n 4 -- run "$tmp/gloo.yaml" --backend gloo --out "$tmp/gloo"
  check "gloo: bytes as predicted, memory per rank to the byte" 0 "ok 7" -- \
    python3 - "$tmp/gloo/results.json" <<'PY'
import json, sys
recs = json.load(open(sys.argv[1]))["records"]
for r in recs:
    assert r["comm_bytes"] == r["predicted_comm_bytes"], r["strategy_id"]
    d = r["details"]
    assert d["predicted_peak_mem_bytes_per_rank"] == d["peak_mem_bytes_per_rank"], r["strategy_id"]
print("ok", len(recs))
PY
else
  echo "SKIP: this build has no gloo backend"
fi

# A schedule in torch.distributed.pipelining's CSV, as `solve pipeline` writes it; and GPipe
# with stage 1's backwards in reverse order (valid, but its gradients add in another order than
# the reference's: within the tolerance of a reordered sum, not bitwise).
"$sb" solve pipeline --stages 2 --microbatches 4 --schedule zb-h1 --write-csv "$tmp/zb.csv" \
  >/dev/null
printf '0F0,0F1,0F2,0F3,0B0,0B1,0B2,0B3\n1F0,1F1,1F2,1F3,1B3,1B2,1B1,1B0\n' >"$tmp/reversed.csv"
# B on micro-batch 0, I and W on micro-batch 1: both kinds' bytes profiled.
printf '0F0,0F1,0B0,0I1,0W1\n1F0,1B0,1F1,1I1,1W1\n' >"$tmp/mixed.csv"
cat >"$tmp/csv.yaml" <<YAML
suite: pipeline-csv
defaults: {dtype: float32, seed: 1234, repetitions: 1, min_time_s: 0.0001}
cases:
  - name: zb-h1-from-csv
    workload: mlp_chain
    shape: {batch: 32, width: 64, depth: 8, dropout: 0, microbatches: 4}
    mesh: 2
    params: {csv: $tmp/zb.csv}
    strategies: ["pipeline/csv"]
  - name: reversed-backwards
    workload: gpt2_stack
    shape: {batch: 4, seq: 16, d_model: 32, heads: 2, layers: 3, dropout: 0, microbatches: 4}
    mesh: 2
    params: {csv: $tmp/reversed.csv}
    strategies: ["pipeline/csv"]
  - name: mixed-backwards
    workload: mlp_chain
    shape: {batch: 16, width: 64, depth: 4, dropout: 0, microbatches: 2}
    mesh: 2
    params: {csv: $tmp/mixed.csv}
    strategies: ["pipeline/csv"]
YAML
check "CSV schedules: bitwise, out of order within its tolerance, B mixed with I and W" 0 \
  "total +3 +0 +0 +0" -- "$sb" run "$tmp/csv.yaml" --out "$tmp/csv"
check "CSV rows: as declared" 0 "ok" -- python3 - "$tmp/csv/results.json" <<'PY'
import json, sys
recs = {r["case"]: r for r in json.load(open(sys.argv[1]))["records"]}
assert recs["zb-h1-from-csv"]["tolerance"].startswith("bitwise"), recs["zb-h1-from-csv"]
rev = recs["reversed-backwards"]
assert not rev["tolerance"].startswith("bitwise") and "another order" in rev["tolerance"], rev
for r in recs.values():
    d = r["details"]
    assert d["predicted_peak_mem_bytes_per_rank"] == d["peak_mem_bytes_per_rank"], r["case"]
print("ok")
PY
sed "s|$tmp/zb.csv|$tmp/none.csv|" "$tmp/csv.yaml" >"$tmp/missing.yaml"
check "a schedule file that cannot be read: exit 2 naming the suite line, case and file" 2 \
  "missing.yaml:[0-9]+: case 'zb-h1-from-csv'.*cannot read .*none.csv" -- \
  "$sb" run "$tmp/missing.yaml" --out "$tmp/missing"
sed "s|$tmp/zb.csv|/dev/zero|" "$tmp/csv.yaml" >"$tmp/device.yaml"
check "a device as the schedule file: refused, not read" 2 "/dev/zero: not a regular file" -- \
  "$sb" run "$tmp/device.yaml" --out "$tmp/device"
check "virtual_stages not an integer: exit 2 naming the parameter" 2 \
  "params.virtual_stages must be an integer from 1 to 64, got 2.5" -- \
  "$sb" run /dev/stdin --out "$tmp/vs" <<'YAML'
suite: bad
cases:
  - {name: v, workload: mlp_chain, shape: {batch: 32, dropout: 0, microbatches: 4}, mesh: 2,
     params: {virtual_stages: 2.5}, strategies: ["pipeline/interleaved-1f1b"]}
YAML
check "a micro-batch count that does not divide the batch: exit 2 naming the key" 2 \
  "'microbatches' \\(3\\) must divide 'batch' \\(32\\)" -- "$sb" run /dev/stdin --out "$tmp/bad" \
  <<'YAML'
suite: bad
cases:
  - {name: b, workload: mlp_chain, shape: {batch: 32, dropout: 0, microbatches: 3}, mesh: 2,
     strategies: ["pipeline/1f1b"]}
YAML

check "an imported model's micro-batch count that does not divide its rows: exit 2 naming the key" \
  2 "stdin:[0-9]+: case 'b': torchscript: shape key 'microbatches' \\(3\\) must divide the first dimension of every input; inputs\\[0\\] has 8" -- \
  "$sb" run /dev/stdin --out "$tmp/bad-ts" <<YAML
suite: bad
cases:
  - {name: b, workload: torchscript, mesh: 4, strategies: ["pipeline/1f1b"],
     shape: {file: $build/models/gpt2_12.pt, microbatches: 3,
             inputs: [{shape: [8, 16], dtype: int64, low: 0, high: 64}]}}
YAML

# Planted faults: each must fail, naming what happened, on every case of the suite (the imported
# models' included).
# A fault that leaves a rank waiting (f4) ends at the timeout on every case: 1 s, not 3.
plant() {
  "$sb" run "$suite" --out "$tmp/$1" --repetitions 1 --min-time 0.0001 \
    --filter "^pipeline/$2\$" --plant-fault "pipeline/$2=$3" --timeout "${4:-3}"
}
caught() {
  cp "$tmp/out" "$tmp/$1.out"
  check "planted $1: no case passes, the imported models' included" 0 "" -- bash -c \
    "grep -q 'imported' '$tmp/$1.out' && ! grep -E '^\[[0-9]+/[0-9]+\] .*: [1-9][0-9]* pass' '$tmp/$1.out'"
}
check "planted: stage 0 accumulates micro-batch 1's gradients twice" 1 \
  "fail: mlp-2-stages pipeline/1f1b: grad/layer0.weight@rank0" -- plant f1 1f1b grad_twice
caught f1
check "planted: 1F1B warm-up one short: the last stage's B before its F, named with the dry run" 1 \
  "rank 1 runs 1B0 before 1F0 .*the dry run: rank 1 waits at 1B0 for 1F0" -- \
  plant f2 1f1b warmup_short
caught f2
check "planted: a W before its I" 1 "rank 0 runs 0W0 before 0I0" -- plant f3 zb-h1 w_before_i
caught f3
check "planted: interleaved, a send to the wrong stage: the receiver times out, named" 1 \
  "pipeline rank 1 at 1F0 waiting for the previous stage's activation" -- \
  plant f4 interleaved-1f1b send_wrong_stage 1
caught f4
finish
