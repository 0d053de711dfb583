#!/usr/bin/env bash
# End-to-end checks of imported models (reference/torchscript): suites/imported.yaml (every
# row passes against the module's own forward and backward; Megatron unsupported, saying why),
# the coverage table of `stratbench graph --model`, `solve shard --model`, and malformed input
# (a file that is not TorchScript, scripted control flow, ids of the wrong rank): exit 2 naming
# the file and the node. Needs the models the ctest fixture trace_models writes to
# BUILD_DIR/models. Usage: ci/import_test.sh BUILD_DIR SOURCE_DIR
set -uo pipefail
build=$1
src=$2
sb="$build/stratbench"
models="$build/models"
source "$src/ci/test_lib.sh"
ids='{"shape": [4, 16], "dtype": "int64", "low": 0, "high": 64}'

# The suite names its files as build/models/...: run it from the source folder, with this
# build's models there.
suite="$tmp/imported.yaml"
sed "s#build/models/#$models/#g" "$src/suites/imported.yaml" > "$suite"
check "imported suite: every row passes but Megatron's" 0 "total +21 +0 +0 +4" -- \
  "$sb" run "$suite" --out "$tmp/suite" --repetitions 1 --min-time 0.0001
check "Megatron is unsupported naming why, communication counted as predicted" 0 "ok" -- \
  python3 - "$tmp/suite/results.csv" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
for r in rows:
    if r["status"] == "unsupported":
        assert r["strategy_id"] == "sharding/auto/megatron", r
        assert "not recognised" in r["message"], r["message"]
    else:
        assert r["status"] == "pass", r
        assert r["comm_bytes"] == r["predicted_comm_bytes"], r
        assert r["predicted_mem_bytes"], r
print("ok", len(rows), "rows")
PY
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
