#!/usr/bin/env bash
# End-to-end checks of imported models (reference/torchscript): suites/imported.yaml (every
# row passes against the module's own forward and backward, checkpointed ResNet-18, DenseNet-121,
# ViT and GPT-2 (a chain from ids) bitwise and to the predicted byte; Megatron and chunking unsupported,
# saying why; training over optimizer steps against the module and torch::optim: plans, FSDP /
# ZeRO / HSDP with every rank's peak to the byte, pipelines and checkpointing; batch norm under
# FSDP and context parallelism unsupported, saying why, named by id or by pattern), a planted
# fault on an imported model's FSDP step, the chain `graph --model --stages` prints,
# the coverage table of `stratbench graph --model`, `solve shard --model`, and malformed input
# (a file that is not TorchScript, scripted control flow, ids of the wrong rank): exit 2 naming
# the file and the node. Needs the models the ctest fixture trace_models writes to
# BUILD_DIR/models. Usage: ci/import_test.sh BUILD_DIR SOURCE_DIR [PART]
#
# PART (default all) runs one third of the suite's cases and the checks that read them, so that
# each is a ctest entry of its own (CMakeLists.txt): the whole took 600 s on the torch2 leg of a
# 2-core AMD host (CI's, timed out), the thirds run beside other tests and each has its deadline.
#   plans       the plans of auto-sharding on every model; graph, solve and the malformed input
#   checkpoint  checkpointing (and the chunkers' rows) on ResNet-18, DenseNet-121, ViT, GPT-2
#   training    training over steps: plans, FSDP / ZeRO / HSDP, context parallelism, pipelines,
#               checkpointing; the planted FSDP fault
# Every case of suites/imported.yaml is in exactly one part (the check below fails otherwise).
set -uo pipefail
build=$1
src=$2
part=${3:-all}
# Each part's cases, by name (`run --case`).
declare -A parts=([plans]='^(gpt2|llama|llama-seeded-params|mlp-cumsum|vit|resnet18|densenet121)-mesh'
                  [checkpoint]='^[a-z0-9]+-checkpoint' [training]='-steps-' [all]='.')
cases=${parts[$part]:-}
if [ -z "$cases" ]; then
  echo "import_test.sh: unknown part '$part' (expected plans, checkpoint, training or all)" >&2
  exit 2
fi
sb="$build/stratbench"
models="$build/models"
source "$src/ci/test_lib.sh"
serve_core "$build"
ids='{"shape": [4, 16], "dtype": "int64", "low": 0, "high": 64}'

# The suite names its files as build/models/...: run it from the source folder, with this
# build's models there.
suite="$tmp/imported.yaml"
sed "s#build/models/#$models/#g" "$src/suites/imported.yaml" > "$suite"
# Each part's rows: pass, fail, error, unsupported (the whole: 73 pass, 22 unsupported; where
# this CPU's oneDNN convolution backward holds more than every other stage's tapes, the 5
# schedules of vit-checkpoint-budget are unsupported too: below).
declare -A totals=([plans]="21 +0 +0 +4" [checkpoint]="32 +0 +0 +12|27 +0 +0 +17"
                   [training]="20 +0 +0 +6" [all]="73 +0 +0 +22|68 +0 +0 +27")
check "imported suite ($part): every row passes but those unsupported, saying why" 0 \
  "total +(${totals[$part]}) +0$" -- \
  "$sb" run "$suite" --case "$cases" --out "$tmp/suite" --repetitions 1 --min-time 0.0001
check "unsupported rows say why; communication, plans' and checkpointed peaks as predicted" 0 "ok" -- \
  python3 - "$tmp/suite/results.csv" "$part" "$suite" "${parts[plans]}" "${parts[checkpoint]}" \
  "${parts[training]}" <<'PY'
import csv, re, sys
rows = list(csv.DictReader(open(sys.argv[1])))
part = sys.argv[2]
# Every case of the suite in exactly one part, and this part's cases all ran.
parts = dict(zip(("plans", "checkpoint", "training"), sys.argv[4:7]))
names = re.findall(r"^  - name: (\S+)", open(sys.argv[3]).read(), re.M)
for n in names:
    owners = [p for p, rx in parts.items() if re.search(rx, n)]
    assert len(owners) == 1, f"case {n} is in parts {owners}: ci/import_test.sh must name it once"
mine = {n for n in names if part == "all" or re.search(parts[part], n)}
assert {r["case"] for r in rows} == mine, sorted(mine ^ {r["case"] for r in rows})
why = {"sharding/auto/megatron": "not recognised", "checkpointing/none": "no none schedule fits",
       "chunking/": "not searched for yet",
       "sharding/fsdp/hsdp": "needs a 2-D mesh", "sharding/fsdp/": "batch norm (bn1.batch_norm)",
       "sharding/cp/": "does not find yet"}
checkpointed, exact, cp, floored = 0, 0, [], []
peak = {}
floor = re.compile(r"no \w+ schedule fits a budget of (\d+) bytes .*checkpointing every stage "
                   r"needs (\d+)")
for r in rows:
    m = floor.search(r["message"])
    if (r["status"] == "unsupported" and r["case"] == "vit-checkpoint-budget" and m and
            r["strategy_id"] != "checkpointing/none"):
        # The host's floor: the solver proves no schedule fits (every stage checkpointed needs
        # at least the budget), as it does on a CPU whose oneDNN convolution backward (stage 0)
        # holds more than the other stages' tapes; named, counted, never silently passed.
        assert int(m.group(2)) > int(m.group(1)), r["message"]
        floored.append(r["strategy_id"])
        continue
    if r["status"] == "unsupported":
        reason = [v for k, v in why.items() if r["strategy_id"].startswith(k)]
        assert reason and reason[0] in r["message"], r
        if r["strategy_id"].startswith("sharding/cp/"):
            cp.append(r["strategy_id"])
        continue
    assert r["status"] == "pass", r
    assert r["predicted_mem_bytes"], r
    if r["family"] == "checkpointing":
        # Bitwise against the module, the peak predicted to the byte.
        assert r["max_abs_err"] == "0" and r["peak_mem_bytes"] == r["predicted_mem_bytes"], r
        checkpointed += 1
        continue
    assert r["comm_bytes"] == r["predicted_comm_bytes"], r
    if r["strategy_id"].startswith(("sharding/fsdp/", "pipeline/")):
        # FSDP's and the pipeline's peaks to the byte (their profiles run the imported graph).
        assert r["peak_mem_bytes"] == r["predicted_mem_bytes"], r
        peak[(r["case"], r["strategy_id"].split("/")[-1])] = int(r["peak_mem_bytes"])
        exact += 1
    else:
        # The plan's replay within the 5% it claims, on this LibTorch's own allocations
        # (what an imported operator's node saves is learned, not assumed).
        assert "memory" not in r["mispredicted"], r
# Checkpointed rows: 32 of the checkpoint part (six solvers on four models, five under a
# budget on three: ResNet-18, DenseNet-121, GPT-2's ids), 3 of training (ViT over steps).
want = {"plans": 0, "checkpoint": 32, "training": 3, "all": 35}[part]
assert checkpointed + len(floored) == want and len(floored) in (0, 5), (checkpointed, floored)
if floored:
    print("note: vit-checkpoint-budget below this host's floor (oneDNN's convolution backward):",
          ", ".join(floored))
if part in ("training", "all"):
    assert exact == 13, exact
    # Context parallelism named by id and matched by a pattern: one row each, none vanished.
    assert sorted(cp) == ["sharding/cp/ring/allgather", "sharding/cp/ring/p2p",
                          "sharding/cp/ulysses"], cp
    for case in ("gpt2-steps-fsdp-mesh4", "llama-steps-fsdp-mesh2x2"):
        assert peak[(case, "ddp")] > peak[(case, "zero1")] >= peak[(case, "zero2")] > peak[(case, "zero3")], case
print("ok", len(rows), "rows")
PY
if [ "$part" = checkpoint ] || [ "$part" = all ]; then
# The chain from ids, wrong: a recomputation reading the slot of the stage before (stale_input)
# fails on the gradients; a schedule solved without the budget peaks over its promise.
check "planted: GPT-2's chain from ids, a recomputation reading a stale input, fails" 1 \
  "fail: gpt2-checkpoint-chunk checkpointing/full: grad/" -- \
  "$sb" run "$suite" --case '^gpt2-checkpoint' --out "$tmp/ids-fault" --repetitions 1 \
  --min-time 0.0001 --filter '^checkpointing/(full|rotor)$' \
  --plant-fault 'checkpointing/full=stale_input' --plant-fault 'checkpointing/rotor=ignore_budget'
cp "$tmp/out" "$tmp/ids-fault.log"
check "planted: GPT-2's chain from ids, solved without its budget, peaks over its promise" 0 "" -- \
  grep -q "fail: gpt2-checkpoint-chunk checkpointing/rotor: rank 0 peaked at .* over the" \
  "$tmp/ids-fault.log"
fi
if [ "$part" = training ] || [ "$part" = all ]; then
# A rank's optimizer passing over one parameter of an imported model: the row fails.
check "planted: the last rank skips one parameter's update on imported GPT-2 and LLaMA (zero3)" 1 \
  "fail: gpt2-steps-fsdp-mesh4 sharding/fsdp/zero3: loss" -- \
  "$sb" run "$suite" --case "${parts[training]}" --out "$tmp/fault" --repetitions 1 --min-time 0.0001 \
  --filter '^sharding/fsdp/zero3$' --plant-fault 'sharding/fsdp/zero3=rank_skips_update'
check "rank_skips_update: every imported FSDP row fails, on its numbers" 0 "ok 2" -- \
  python3 - "$tmp/fault/results.csv" <<'PY'
import csv, sys
rows = [r for r in csv.DictReader(open(sys.argv[1])) if r["status"] != "unsupported"]
for r in rows:
    assert r["status"] == "fail" and int(r["mismatches"]) > 0, r
print("ok", len(rows))
PY
fi
[ "$part" = plans ] || [ "$part" = all ] || { finish; exit; }
check "graph --model --stages: ResNet-18's chain, a residual block a stage" 0 \
  "layer1\.0 +6 nodes -> layer1\.0\.add \[2x64x8x8\]" -- \
  "$sb" graph --model "$models/resnet18.pt" --input '[2, 3, 32, 32]' --stages
# A chain from ids: the embedding is stage 0, and the head's [B*T, V] product and its view as
# [B, T, V] are one stage (a stage of views alone would hand on its input's storage).
check "graph --stages on a model of ids: the embedding first, the head's view in the head's stage" \
  0 "0 +wte +1 nodes -> wte\.embedding \[4x16x32\].*7 +lm_head +4 nodes -> lm_head\.linear\.output \[4x16x64\]$" -- \
  bash -c 'set -o pipefail; "$1" graph --model "$2" --input "$3" --stages | tr "\n" " " | sed "s/ *$//"' _ \
  "$sb" "$models/gpt2.pt" "$ids"
check "graph --model: the coverage table names the op without a strategy" 0 \
  "aten::cumsum +1 +NO +aten \(replicated\)" -- \
  "$sb" graph --model "$models/mlp_cumsum.pt" --input '[4, 16]'
check "graph --model --json: coverage in the JSON" 0 '"aten": "aten::cumsum"' -- \
  "$sb" graph --model "$models/mlp_cumsum.pt" --input '[4, 16]' --json
check "solve shard --model: a plan of the imported graph" 0 '"algo": "ilp"' -- \
  "$sb" solve shard --model "$models/gpt2.pt" --input "$ids" --mesh 2x2
check "not TorchScript: exit 2 naming the file" 2 "not_torchscript.pt: not a TorchScript file" -- \
  "$sb" graph --model "$models/not_torchscript.pt" --input '[2, 4]'
check "scripted control flow: exit 2 naming the node" 2 "scripted_if.pt: node prim::If" -- \
  "$sb" graph --model "$models/scripted_if.pt" --input '[2, 4]'
check "ids of the wrong rank: exit 2 naming the node that fails" 2 \
  "gpt2.pt: node aten::[a-z_]+ \(in .*fails on the inputs given" -- \
  "$sb" solve shard --model "$models/gpt2.pt" --input '{"shape": [4, 16, 2], "dtype": "int64", "low": 0, "high": 64}' --mesh 2
check "--model without --input: exit 2" 2 "needs --input" -- \
  "$sb" graph --model "$models/gpt2.pt"
check "a malformed --input: exit 2 naming it" 2 "inputs\[0\]" -- \
  "$sb" graph --model "$models/gpt2.pt" --input '{"shape": [4, 16], "dtype": "int8"}'
finish
