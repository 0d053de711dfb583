#!/usr/bin/env bash
# End-to-end checks of training over optimizer steps and the FSDP family
# (strategies/sharding/fsdp, reference/training.h): suites/fsdp.yaml on threads (every row
# passes against torch::optim on the whole batch, communication counted == predicted per
# collective, memory per rank ordered ddp > zero1 > zero2 > zero3), a sample on gloo through
# `launch`, the planted faults (a gradient divided twice, an optimizer stepping a stale shard:
# fail, naming the tensor that differs), one-step strategies refused on a training case, and
# malformed steps / optimizer keys (exit 2 naming the key). Usage: ci/fsdp_test.sh BUILD_DIR
# SOURCE_DIR
set -uo pipefail
build=$1
src=$2
sb="$build/stratbench"
source "$src/ci/test_lib.sh"

check "fsdp suite on threads: every row passes" 0 "total +22 +0 +0 +3" -- \
  "$sb" run "$src/suites/fsdp.yaml" --out "$tmp/threads" --repetitions 1 --min-time 0.0001
check "fsdp suite: bytes as predicted, memory ordered ddp > zero1 > zero2 > zero3" 0 "ok" -- \
  python3 - "$tmp/threads/results.csv" <<'PY'
import csv, sys
from collections import defaultdict
rows = list(csv.DictReader(open(sys.argv[1])))
peak = defaultdict(dict)
for r in rows:
    if r["status"] == "unsupported":
        assert r["strategy_id"] == "sharding/fsdp/hsdp" and "2-D mesh" in r["message"], r
        continue
    assert r["status"] == "pass", r
    assert r["comm_bytes"] == r["predicted_comm_bytes"], r
    peak[r["case"]][r["strategy_id"].split("/")[-1]] = int(r["peak_mem_bytes"])
for case, p in peak.items():
    assert p["ddp"] > p["zero1"] > p["zero2"] > p["zero3"], (case, p)
print("ok", len(rows), "rows")
PY

cat >"$tmp/gloo.yaml" <<'YAML'
suite: fsdp-gloo
defaults: {repetitions: 1, min_time_s: 0.0001, seed: 1234}
cases:
  - name: gpt2-2x2-adamw
    workload: gpt2
    shape: {batch: 4, seq: 16, d_model: 64, heads: 4, layers: 2, vocab: 96, dropout: 0}
    mesh: 2x2
    steps: 3
    optimizer: {kind: adamw, lr: 0.001, weight_decay: 0.01, clip_grad_norm: 1.0}
    strategies: ["sharding/fsdp/.*", "sharding/auto/(ilp)"]
YAML
if "$sb" run --help | grep -q gloo; then
  check "gloo: fsdp on 2x2, one-step strategies unsupported" 0 "gpt2-2x2-adamw +5 +0 +0 +1" -- \
    "$sb" launch -n 4 -- run "$tmp/gloo.yaml" --backend gloo --out "$tmp/gloo"
else
  echo "SKIP: this build has no gloo backend"
fi

# Planted faults: each must fail, naming what differs.
check "planted: gradients divided by the world size twice (grad norm off)" 1 \
  "fail: gpt2-4-adamw sharding/fsdp/zero2: .*grad_norm" -- \
  "$sb" run "$src/suites/fsdp.yaml" --out "$tmp/f1" --repetitions 1 --min-time 0.0001 \
  --filter '^sharding/fsdp/zero2$' --plant-fault 'sharding/fsdp/zero2=grad_divided_twice'
check "planted: the optimizer steps a stale copy of the shard (later losses off)" 1 \
  "fail: mlp-4-sgd sharding/fsdp/zero3: loss" -- \
  "$sb" run "$src/suites/fsdp.yaml" --out "$tmp/f2" --repetitions 1 --min-time 0.0001 \
  --filter '^sharding/fsdp/zero3$' --plant-fault 'sharding/fsdp/zero3=stale_shard'
check "planted: ddp with the gradient divided twice" 1 "fail: mlp-4-sgd sharding/fsdp/ddp" -- \
  "$sb" run "$src/suites/fsdp.yaml" --out "$tmp/f3" --repetitions 1 --min-time 0.0001 \
  --filter '^sharding/fsdp/ddp$' --plant-fault 'sharding/fsdp/ddp=grad_divided_twice'

# Malformed training keys: exit 2 naming the key.
bad() {
  printf 'suite: bad\ncases:\n  - name: c\n    workload: %s\n    shape: {layers: 1}\n    mesh: 2\n%b    strategies: ["sharding/fsdp/.*"]\n' "$1" "$2" >"$tmp/bad.yaml"
}
bad mlp "    optimizer: {kind: sgd, lr: 0.1}\n"
check "optimizer without steps: exit 2" 2 "bad.yaml:[0-9]+: .*'optimizer' needs key 'steps'" -- \
  "$sb" run "$tmp/bad.yaml" --out "$tmp/b1"
bad mlp "    steps: 2\n    optimizer: {kind: adam, lr: 0.1}\n"
check "an unknown optimizer kind: exit 2 naming it" 2 "optimizer kind 'adam'" -- \
  "$sb" run "$tmp/bad.yaml" --out "$tmp/b2"
bad mlp "    steps: 2\n    optimizer: {kind: sgd, betas: [0.9, 0.99]}\n"
check "a key of another optimizer: exit 2 naming it" 2 "unknown optimizer key 'betas' for sgd" -- \
  "$sb" run "$tmp/bad.yaml" --out "$tmp/b3"
bad mlp "    steps: 0\n"
check "steps: 0: exit 2 naming the key" 2 "key .steps. must be a whole number from 1" -- "$sb" run "$tmp/bad.yaml" --out "$tmp/b4"
finish
