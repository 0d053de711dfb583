#!/usr/bin/env bash
# End-to-end checks of auto-sharding: suites/autoshard.yaml on threads (every plan of every
# algorithm passes against the plain model, communication counted == predicted, every rank's
# peak predicted to the byte, `report --gate` passes), a memory limit that data parallel cannot
# meet while the ILP's plan fits it (and its measured peak does), a limit under which the ILP
# stores a parameter split (ZeRO-3) and that plan on 4 gloo processes, a gloo sample with 4
# processes, LLaMA on 2x2x2 over 8 gloo processes, planted faults in the executor (an edge that skips its redistribution fails) and in
# the memory model (rows without the parameters, a replay freeing values early: both flagged),
# and malformed input (exit 2 naming the file and key; exit 1 when no plan fits).
# Usage: ci/autoshard_test.sh BUILD_DIR SOURCE_DIR
set -uo pipefail
build=$1
src=$2
sb="$build/stratbench"
source "$src/ci/test_lib.sh"
serve_core "$build"

# 1. The suite on threads.
check "autoshard suite on threads" 0 "total +[0-9]+ +0 +0 +[0-9]+" -- \
  "$sb" run "$src/suites/autoshard.yaml" --out "$tmp/threads" --repetitions 1 --min-time 0.0001
check "threads: every row passes, comm exact, memory exact" 0 "worst memory error 0.00%" -- \
  verify_rows "$tmp/threads/results.csv" 0
# Every rank's peak, not only the largest, against its own prediction; the plan's replay claims
# the byte (tolerance 0), so the gate would flag a row a byte off.
every_rank_exact() {
  python3 - "$1" <<'PY'
import json, sys
rows = [r for r in json.load(open(sys.argv[1]))["records"] if r["status"] == "pass"]
bad = []
for r in rows:
    d = r["details"]
    m, p = d.get("peak_mem_bytes_per_rank"), d.get("predicted_peak_mem_bytes_per_rank")
    if not m or m != p or r.get("mispredicted"):
        bad.append((r["case"], r["strategy"], m, p))
    # The solve's own replay (threads), in the plan: what a memory limit is checked with.
    solved = d.get("executor", {}).get("predicted", {}).get("peak_bytes_by_rank")
    if "steps" not in r.get("params", {}) and r["backend"] == "threads" and solved != m:
        bad.append((r["case"], r["strategy"], "solve's replay", solved, m))
print(f"{len(rows)} passing rows, {len(bad)} with a rank not predicted to the byte")
for b in bad[:5]:
    print("  ", b)
sys.exit(1 if bad or not rows else 0)
PY
}
check "threads: every rank's peak predicted to the byte" 0 " 0 with a rank not" -- \
  every_rank_exact "$tmp/threads/results.json"
check "report --gate passes on the suite" 0 "gate: passed" -- \
  "$sb" report "$tmp/threads" --gate
check "the memory-limited case: data parallel and Megatron unsupported, the ILP fits and passes" 0 "fits" -- \
  python3 - "$tmp/threads/results.csv" <<'PY'
import csv, sys
rows = [r for r in csv.DictReader(open(sys.argv[1])) if r["case"].endswith("max-memory")]
cases = sorted({r["case"] for r in rows})
assert len(cases) == 2, cases  # GPT-2's and LLaMA's
for case in cases:
    by = {r["strategy_id"]: r for r in rows if r["case"] == case}
    dp, ilp = by["sharding/auto/data-parallel"], by["sharding/auto/ilp"]
    for r in (dp, by["sharding/auto/megatron"]):
        assert r["status"] == "unsupported" and "no plan fits" in r["message"], r["message"]
    assert ilp["status"] == "pass", ilp["message"]
    limit = {"gpt2-L2-mesh2x2-max-memory": 120000, "llama-L2-mesh2x2-max-memory": 150000}[case]
    assert float(ilp["predicted_mem_bytes"]) <= limit, ilp["predicted_mem_bytes"]
    assert float(ilp["peak_mem_bytes"]) <= limit, ilp["peak_mem_bytes"]
    print(case, "ilp fits", ilp["peak_mem_bytes"], "<=", limit, "; data parallel:",
          dp["message"][:80])
PY

# 2. A gloo sample, 4 processes: the first case of the suite, every algorithm (and its first
# LLaMA case, in a sample of its own).
python3 - "$src/suites/autoshard.yaml" "$tmp/sample.yaml" "$tmp/sample-llama.yaml" <<'PY'
import sys
text = open(sys.argv[1]).read()
head, cases = text.split("\ncases:\n")
cases = ["  - name: " + c for c in cases.split("  - name: ")[1:]]
llama = [c for c in cases if "workload: llama" in c]
assert llama, "autoshard.yaml lost its LLaMA cases"
open(sys.argv[2], "w").write(head + "\ncases:\n" + cases[0])
open(sys.argv[3], "w").write(head + "\ncases:\n" + llama[0])
PY
if "$sb" run --help | grep -q gloo; then
  check "launch -n 4 gloo autoshard sample" 0 "4 ranks on gloo" -- \
    "$sb" launch -n 4 -- run "$tmp/sample.yaml" --backend gloo --out "$tmp/gloo" \
    --repetitions 1 --min-time 0.0001
  check "gloo: every row passes, comm exact, memory exact" 0 "worst memory error 0.00%" -- \
    verify_rows "$tmp/gloo/results.csv" 0
  check "gloo: every rank's peak predicted to the byte" 0 " 0 with a rank not" -- \
    every_rank_exact "$tmp/gloo/results.json"
  check "launch -n 4 gloo LLaMA sample: every plan passes" 0 "4 ranks on gloo" -- \
    "$sb" launch -n 4 -- run "$tmp/sample-llama.yaml" --backend gloo --out "$tmp/gloo-llama" \
    --repetitions 1 --min-time 0.0001
  check "gloo LLaMA: every rank's peak predicted to the byte" 0 " 0 with a rank not" -- \
    every_rank_exact "$tmp/gloo-llama/results.json"
else
  echo "SKIP: this build has no gloo backend"
fi

# 3. A planted fault: the first edge that needs a redistribution skips it (Megatron's plan of
# LLaMA on 4 ranks redistributes its keys and values; on the sample's 2x2 it redistributes on
# no edge, and the fault, with nothing to skip, is unsupported, never a silent pass).

# `one_case NAME OUT`: the suite with its case NAME alone (its defaults kept), written to OUT.
one_case() {
  python3 - "$src/suites/autoshard.yaml" "$1" "$2" <<'PY'
import sys
text = open(sys.argv[1]).read()
head, cases = text.split("\ncases:\n")
case = [c for c in cases.split("  - name: ") if c.split("\n")[0] == sys.argv[2]]
assert len(case) == 1, f"autoshard.yaml lost its case {sys.argv[2]}"
open(sys.argv[3], "w").write(head + "\ncases:\n  - name: " + case[0])
PY
}

one_case llama-L2-mesh4 "$tmp/mesh4.yaml"
check "planted: an edge without its redistribution fails" 1 "fail: " -- \
  "$sb" run "$tmp/mesh4.yaml" --out "$tmp/fault" --repetitions 1 \
  --filter '^sharding/auto/megatron$' --plant-fault 'sharding/auto/megatron=skip_edge_redistribution'
"$sb" run "$tmp/sample.yaml" --out "$tmp/nofault" --repetitions 1 --filter '^sharding/auto/megatron$' \
  --plant-fault 'sharding/auto/megatron=skip_edge_redistribution' >/dev/null 2>&1
check "planted on a plan that redistributes nowhere: unsupported, saying so" 0 "nothing to skip" -- \
  python3 -c 'import csv, sys; r = next(csv.DictReader(open(sys.argv[1]))); \
print(r["status"], r["message"]); sys.exit(r["status"] != "unsupported")' "$tmp/nofault/results.csv"

# 3a. A 3-D mesh (2x2x2): the LLaMA case over 8 gloo processes, every plan passing with every
# rank's peak to the byte; the ILP's plan without one edge's redistribution (its first: the
# block's input gathered over axis 2) fails. (Megatron's plan on 2x2x2 redistributes nothing.)
one_case llama-L2-mesh2x2x2 "$tmp/mesh3d.yaml"
if "$sb" run --help | grep -q gloo; then
  check "launch -n 8 gloo LLaMA on 2x2x2: every plan passes" 0 "total +4 +0 +0 +0" -- \
    "$sb" launch -n 8 -- run "$tmp/mesh3d.yaml" --backend gloo --out "$tmp/gloo3d" \
    --repetitions 1 --min-time 0.0001
  check "gloo 2x2x2: every rank's peak predicted to the byte" 0 " 0 with a rank not" -- \
    every_rank_exact "$tmp/gloo3d/results.json"
fi
check "planted, 2x2x2: an edge without its redistribution fails" 1 "fail: " -- \
  "$sb" run "$tmp/mesh3d.yaml" --out "$tmp/fault3d" --repetitions 1 \
  --filter '^sharding/auto/ilp$' --plant-fault 'sharding/auto/ilp=skip_edge_redistribution'

# 3a'. FSDP placements in the search: under the zero case's limit the ILP's plan stores a
# parameter split over the mesh (gathered at use), passes, and on 4 gloo processes the same.
check "zero case: the ILP stores a parameter split and passes" 0 "stored split" -- \
  python3 - "$tmp/threads/results.json" <<'PY'
import json, sys
rows = [r for r in json.load(open(sys.argv[1]))["records"]
        if r["case"] == "llama-L2-mesh4-zero" and r["strategy_id"] == "sharding/auto/ilp"]
assert len(rows) == 1 and rows[0]["status"] == "pass", [r["message"] for r in rows]
nodes = rows[0]["details"]["executor"]["nodes"]
stored = [a["value"] for n in nodes for a in n["args"].values() if "stored" in a]
assert stored, "no parameter stored split"
print("stored split:", ", ".join(stored))
PY
one_case llama-L2-mesh4-zero "$tmp/zero.yaml"
if "$sb" run --help | grep -q gloo; then
  check "launch -n 4 gloo: the zero plan passes" 0 "total +1 +0 +0 +0" -- \
    "$sb" launch -n 4 -- run "$tmp/zero.yaml" --backend gloo --out "$tmp/gloozero" \
    --repetitions 1 --min-time 0.0001 --filter '^sharding/auto/ilp$'
  check "gloo zero plan: every rank's peak predicted to the byte" 0 " 0 with a rank not" -- \
    every_rank_exact "$tmp/gloozero/results.json"
fi

# 3b. Over steps: the training case alone, data parallel's first edge skipping its
# redistribution fails (and passes without the fault).
one_case gpt2-L2-mesh2x2-adamw-steps "$tmp/steps.yaml"
check "steps: data parallel trains like the plain loop" 0 "total +1 +0 +0 +0" -- \
  "$sb" run "$tmp/steps.yaml" --out "$tmp/steps" --repetitions 1 \
  --filter '^sharding/auto/data-parallel$'
if "$sb" run --help | grep -q gloo; then
  check "steps on gloo, 4 processes: every plan trains like the plain loop" 0 "total +4 +0 +0 +0" -- \
    "$sb" launch -n 4 -- run "$tmp/steps.yaml" --backend gloo --out "$tmp/stepsgloo" \
    --repetitions 1 --min-time 0.0001
fi
check "steps, planted: an edge without its redistribution fails on the losses" 1 "loss@rank0" -- \
  "$sb" run "$tmp/steps.yaml" --out "$tmp/stepsfault" --repetitions 1 \
  --filter '^sharding/auto/data-parallel$' \
  --plant-fault 'sharding/auto/data-parallel=skip_edge_redistribution'

# 3c. The memory model's planted faults. The integer program's rows without the parameters: the
# ILP takes a plan that does not fit the memory-limited case, which its measured peak flags.
one_case gpt2-L2-mesh2x2-max-memory "$tmp/limited.yaml"
check "planted: rows without the parameters: the ILP's plan peaks over the limit" 1 \
  "over the 120000 bytes it promised" -- \
  "$sb" run "$tmp/limited.yaml" --out "$tmp/rowsfault" --repetitions 1 --filter '^sharding/auto/ilp$' \
  --plant-fault 'sharding/auto/ilp=rows_without_parameters'
# A planted fault only a prediction can see: the run passes its numerics (`total` is the run's
# tally line), and the gate flags what the fault did (`finding`). The sample suite, one
# repetition; the rest of the arguments pick rows and plant faults.
numerics_pass_gate_flags() {
  local what=$1 out=$2 total=$3 finding=$4
  shift 4
  check "planted: $what: numerics pass" 0 "$total" -- \
    "$sb" run "$tmp/sample.yaml" --out "$out" --repetitions 1 "$@"
  check "planted: $what: the gate flags it" 1 "$finding" -- "$sb" report "$out" --gate
}

# A replay that frees each value at its last reader's forward (not after what it saved): both
# rows' predictions are off.
numerics_pass_gate_flags "a replay freeing values early" "$tmp/earlyfault" \
  "total +2 +0 +0 +0" "gate: FAILED \(2 finding" \
  --filter '^sharding/auto/(ilp|megatron)$' \
  --plant-fault 'sharding/auto/ilp=liveness_frees_early' \
  --plant-fault 'sharding/auto/megatron=liveness_frees_early'

# The rows judged at every forward point against the replay (memory_rows), where the plan
# survives them: the rows without the parameters on a case without a limit, and rows that free
# each activation one node before its last reader.
numerics_pass_gate_flags "rows wrong where the plan survives" "$tmp/rowsearly" \
  "total +2 +0 +0 +0" "gate: FAILED \(2 finding" \
  --filter '^sharding/auto/(ilp|megatron)$' \
  --plant-fault 'sharding/auto/ilp=rows_free_early' \
  --plant-fault 'sharding/auto/megatron=rows_without_parameters'
grep -q "memory_rows (the integer program's memory rows once each forward node ran" \
  "$tmp/rowsearly/results.json" || fail "the planted rows' finding does not say memory_rows"

# The program without the edges of a parameter read twice (GPT-2's tied embedding and head): a
# plan whose objective is under its step priced node by node.
numerics_pass_gate_flags "a program without the parameters' edges" "$tmp/programfault" \
  "total +1 +0 +0 +0" "integer program's objective, against the plan's step" \
  --filter '^sharding/auto/ilp$' \
  --plant-fault 'sharding/auto/ilp=program_without_parameter_edges'
check "the right program's objective is its step priced node by node" 0 "total +1 +0 +0 +0" -- \
  "$sb" run "$tmp/sample.yaml" --out "$tmp/programright" --repetitions 1 \
  --filter '^sharding/auto/ilp$'
"$sb" report "$tmp/programright" --gate >/dev/null 2>&1 || fail "the right program's row fails the gate"

# 4. Plans from files, and malformed input.
"$sb" solve shard --workload gpt2 --shape '{"layers": 2}' --mesh 2x2 --out "$tmp/plan.json" \
  >/dev/null 2>&1
cat >"$tmp/plan.yaml" <<YAML
suite: plan-file
defaults: {repetitions: 1, min_time_s: 0.0001}
cases:
  - name: stored-plan
    workload: gpt2
    shape: {layers: 2}
    mesh: 2x2
    strategies: [sharding/plan]
    params: {plan: $tmp/plan.json}
YAML
check "a stored plan runs and passes" 0 "total +1 +0 +0 +0" -- \
  "$sb" run "$tmp/plan.yaml" --out "$tmp/planrun"
python3 - "$tmp/plan.json" "$tmp/bad.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
j["nodes"][5]["strategy"] = "no such strategy"
json.dump(j, open(sys.argv[2], "w"))
PY
sed "s|$tmp/plan.json|$tmp/bad.json|" "$tmp/plan.yaml" >"$tmp/bad.yaml"
check "a plan naming a strategy its node lacks: exit 2 naming the file and key" 2 \
  "bad.json: key 'nodes\[5\].strategy'" -- "$sb" run "$tmp/bad.yaml" --out "$tmp/badrun"
check "solve shard: malformed shape names the key" 2 "'heads'" -- \
  "$sb" solve shard --workload gpt2 --shape '{"heads": 0}' --mesh 2x2
check "solve shard: malformed profile names the file" 2 "nope.json" -- \
  "$sb" solve shard --workload gpt2 --mesh 2x2 --profile "$tmp/nope.json"
check "solve shard: a tensor-parallel axis the mesh lacks: exit 2 naming it" 2 \
  "tensor-parallel axis 2 is not an axis of the 2-D mesh" -- \
  "$sb" solve shard --workload gpt2 --mesh 2x2 --algo megatron --tp-axis 2
check "solve shard: a tensor-parallel axis for another algorithm: exit 2" 2 "Megatron's placement's alone" -- \
  "$sb" solve shard --workload gpt2 --mesh 2x2 --algo ilp --tp-axis 0
check "solve shard: no plan fits: exit 1 with the least it needs" 1 "the plan of least memory needs [0-9]+ bytes by the replay" -- \
  "$sb" solve shard --workload gpt2 --shape '{"layers": 2}' --mesh 2x2 --max-memory 1000
check "graph --json" 0 '"node_count": 32' -- \
  "$sb" graph --workload gpt2 --shape '{"layers": 1}' --json

finish
