#!/usr/bin/env bash
# End-to-end checks of single-operator sharding: suites/sharding-ops.yaml on threads (every
# strategy passes or is unsupported naming a dimension, predicted == counted communication,
# predicted peak memory equal to the measured peak on every row), a sample on gloo with 4
# processes (every row passes, memory within 5%, the same errors and bytes as threads), and
# planted faults through `run --plant-fault` (exit 1, status fail), Megatron's blocks included;
# then suites/sharding-ops-3d.yaml (2x2x2) on threads, exact, and a sample on 8 gloo processes.
# Usage: ci/sharding_ops_test.sh BUILD_DIR SOURCE_DIR
set -uo pipefail
build=$1
src=$2
sb="$build/stratbench"
source "$src/ci/test_lib.sh"
serve_core "$build"

# Every passing row of a gloo run ($2) has the threads run's ($1) errors and bytes.
agree() {
  python3 - "$1" "$2" <<'PY'
import csv, sys
key = lambda r: (r["case"], r["strategy_id"])
t = {key(r): r for r in csv.DictReader(open(sys.argv[1]))}
g = [r for r in csv.DictReader(open(sys.argv[2])) if r["status"] == "pass"]
assert len(g) > 40, len(g)
for r in g:
    o = t[key(r)]
    for col in ("mismatches", "comm_bytes", "comm_calls"):
        assert r[col] == o[col], (key(r), col, r[col], o[col])
print(len(g), "rows agree")
PY
}

# 1. The whole suite on threads.
check "sharding-ops suite on threads" 0 "total +[0-9]+ +0 +0" -- \
  "$sb" run "$src/suites/sharding-ops.yaml" --out "$tmp/threads" --repetitions 1 --min-time 0.0001
check "threads: every row passes, comm exact, memory exact" 0 "worst memory error 0.00%" -- \
  verify_rows "$tmp/threads/results.csv" 0.0

# 2. A sample on gloo, 4 processes: the operators with communication of every kind.
sample='^sharding/(op/(addmm|bmm|matmul|embedding|layer_norm|batch_norm|dropout|sum)/|megatron/)'
if "$sb" run --help | grep -q gloo; then
  check "launch -n 4 gloo sample" 0 "4 ranks on gloo" -- \
    "$sb" launch -n 4 -- run "$src/suites/sharding-ops.yaml" --backend gloo --out "$tmp/gloo" \
    --repetitions 1 --min-time 0.0001 --filter "$sample"
  check "gloo: every row passes, comm exact, memory within 5%" 0 "rows" -- \
    verify_rows "$tmp/gloo/results.csv" 0.05
  check "gloo agrees with threads on the same rows" 0 "rows agree" -- \
    agree "$tmp/threads/results.csv" "$tmp/gloo/results.csv"
else
  echo "SKIP: this build has no gloo backend"
fi

# 3. Planted faults, end to end: the row fails and the run exits 1.
fault() {  # name case strategy-id fault
  check "planted: $1" 1 "fail: " -- \
    "$sb" run "$src/suites/sharding-ops.yaml" --out "$tmp/fault" --repetitions 1 \
    --filter "^$3\$" --plant-fault "$3=$4"
}
fault "layer norm over a split hidden dim without the statistics all-reduce" \
  "layer-norm-4x16-mesh2x2" "sharding/op/layer_norm/RS0=RS0.S0.S0" skip_stats_all_reduce
fault "softmax over a sharded dim" "softmax-8x16-mesh2x2" "sharding/op/softmax/S0R=S0R" \
  softmax_over_sharded_dim
fault "vocabulary-split embedding without the mask" "embedding-4x16x16-mesh2x2" \
  "sharding/op/embedding/RR=R.S0R" skip_vocab_mask
fault "bmm with the batch split on one operand" "bmm-4x8x16-mesh2x2" \
  "sharding/op/bmm/Sb01=Sb01.Sb01" batch_split_one_operand
fault "batched matmul with the heads split on one operand (batch on axis 1, heads on axis 0)" \
  "matmul-batched-4x4x8x16-mesh2x2" "sharding/op/matmul/S1S0RR=S1S0RR.S1S0RR" \
  heads_split_one_operand
fault "dropout masks that differ per rank" "dropout-8x16-mesh2x2" "sharding/op/dropout/RR=RR" \
  per_rank_dropout_seed
check "planted: sequence parallel all-reducing where it should reduce-scatter" 1 \
  "communicated .*but the strategy predicts" -- \
  "$sb" run "$src/suites/sharding-ops.yaml" --out "$tmp/fault" --repetitions 1 \
  --filter '^sharding/megatron/tp_sp$' \
  --plant-fault 'sharding/megatron/tp_sp=all_reduce_instead_of_reduce_scatter'
# torchtitan#1373's bug over steps: sequence parallel's layer norm gradients (partial over the
# sequence shards) never summed across the tensor-parallel ranks. The replicas drift apart,
# which the replica check names, and the losses after the first step differ.
check "planted, over steps: a replicated layer norm's gradient not summed across TP ranks" 1 \
  "megatron-block-mesh2-adamw-steps sharding/megatron/tp_sp: replicas: param/ln_" -- \
  "$sb" run "$src/suites/sharding-ops.yaml" --out "$tmp/fault" --repetitions 1 \
  --filter '^sharding/megatron/tp_sp$' \
  --plant-fault 'sharding/megatron/tp_sp=skip_shared_grad_all_reduce'

# Linear over steps: the forward's partial sums never all-reduced. Every loss is off.
check "planted, over steps: a Linear's forward all-reduce skipped" 1 \
  "fail: linear-4x4x16-mesh2x2-adamw-steps sharding/linear/RR=RS01.S01R: loss" -- \
  "$sb" run "$src/suites/sharding-ops.yaml" --out "$tmp/fault" --repetitions 1 \
  --filter '^sharding/linear/RR=RS01.S01R$' \
  --plant-fault 'sharding/linear/RR=RS01.S01R=skip_forward_all_reduce'

# 4. A 3-D mesh (2x2x2): every operator's expanded strategies (suites/sharding-ops-3d.yaml) on
# threads, each row exact, and a sample over 8 gloo processes (sums over one and two axes,
# statistics, a vocabulary split, batched products) agreeing with it.
check "sharding-ops-3d suite on threads (2x2x2)" 0 "total +[0-9]+ +0 +0" -- \
  "$sb" run "$src/suites/sharding-ops-3d.yaml" --out "$tmp/threads3d" --repetitions 1 \
  --min-time 0.0001
check "2x2x2 threads: every row passes, comm exact, memory exact" 0 "worst memory error 0.00%" -- \
  verify_rows "$tmp/threads3d/results.csv" 0.0
if "$sb" run --help | grep -q gloo; then
  check "launch -n 8 gloo sample on 2x2x2" 0 "8 ranks on gloo" -- \
    "$sb" launch -n 8 -- run "$src/suites/sharding-ops-3d.yaml" --backend gloo \
    --out "$tmp/gloo3d" --repetitions 1 --min-time 0.0001 \
    --filter '^sharding/op/(addmm|layer_norm|embedding|batch_norm|bmm|matmul)/S0.*'
  check "2x2x2 gloo: every row passes, comm exact, memory within 5%" 0 "rows" -- \
    verify_rows "$tmp/gloo3d/results.csv" 0.05
  check "2x2x2 gloo agrees with threads on the same rows" 0 "rows agree" -- \
    agree "$tmp/threads3d/results.csv" "$tmp/gloo3d/results.csv"
fi

finish
