#!/usr/bin/env bash
# End-to-end checks of training over optimizer steps and the FSDP family
# (strategies/sharding/fsdp, reference/training.h): suites/fsdp.yaml on threads (every row
# passes against torch::optim on the whole batch, communication counted == predicted per
# collective, memory per rank ordered ddp > zero1 > zero2 > zero3), a sample on gloo through
# `launch`, the planted faults (a gradient divided twice, an optimizer stepping a stale shard,
# hsdp's reductions on swapped axes, replicas not summed or summed in each rank's own order:
# fail, naming the tensor that differs or the replicas that are not bit-identical), the golden
# losses beside the suite (held, a moved one caught, rewritten), one-step strategies refused on a
# training case, and malformed steps / optimizer keys (exit 2 naming the key). Every row's peak
# per rank is predicted to the byte; reshard_after_forward: false and prefetch are compared with
# the default side by side; a unit left gathered after its forward fails on its memory alone.
# Usage: ci/fsdp_test.sh BUILD_DIR SOURCE_DIR
set -uo pipefail
build=$1
src=$2
sb="$build/stratbench"
source "$src/ci/test_lib.sh"
serve_core "$build"

check "fsdp suite on threads: every row passes" 0 "total +26 +0 +0 +3" -- \
  "$sb" run "$src/suites/fsdp.yaml" --out "$tmp/threads" --repetitions 1 --min-time 0.0001
check "fsdp suite: bytes and every rank's peak as predicted, memory ordered ddp > zero1 > zero2 > zero3" 0 "ok" -- \
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
    assert r["peak_mem_bytes"] == r["predicted_mem_bytes"], r
    assert r["mispredicted"] == "", r
    peak[r["case"]][r["strategy_id"].split("/")[-1]] = (int(r["peak_mem_bytes"]), int(r["comm_bytes"]))
for case, p in peak.items():
    if case.endswith("-keep-gathered") or case.endswith("-prefetch") or case.endswith("-bf16-params"):
        continue
    assert p["ddp"][0] > p["zero1"][0] > p["zero2"][0] > p["zero3"][0], (case, p)
# Kept gathered from forward to backward: more memory, one all-gather a step fewer per unit.
keep, base = peak["gpt2-4-adamw-keep-gathered"]["zero3"], peak["gpt2-4-adamw"]["zero3"]
assert keep[0] > base[0] and keep[1] < base[1], (keep, base)
# Prefetching one unit: the same bytes moved, more memory held.
ahead = peak["gpt2-4-adamw-prefetch"]["zero3"]
assert ahead[0] > base[0] and ahead[1] == base[1], (ahead, base)
# Units gathered in bfloat16: less memory and fewer bytes than in float32.
for kind in ("zero3", "hsdp"):
    mp, fp = peak["mlp-2x2-adamw-bf16-params"][kind], peak["mlp-2x2-adamw"][kind]
    assert mp[0] < fp[0] and mp[1] < fp[1], (kind, mp, fp)
print("ok", len(rows), "rows")
PY
check "fsdp suite: every rank's peak equal to its own prediction (the promise), not only the largest" 0 "ok" -- \
  python3 - "$tmp/threads/results.json" <<'PY'
import json, sys
n = 0
for r in json.load(open(sys.argv[1]))["records"]:
    if r["status"] == "unsupported":
        continue
    peaks, limits = r["details"]["peak_mem_bytes_per_rank"], r["details"]["memory_limit_bytes_per_rank"]
    assert peaks == limits, (r["case"], r["strategy_id"], peaks, limits)
    n += len(peaks)
print("ok", n, "ranks")
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
  - name: mlp-uneven
    workload: mlp
    shape: {batch: 8, d_model: 3, layers: 1}
    mesh: 4
    steps: 2
    optimizer: {kind: adamw, lr: 0.01}
    params: {prefetch: 1}
    strategies: ["sharding/fsdp/.*"]
YAML
if "$sb" run --help | grep -q gloo; then
  check "gloo: fsdp and the ILP's plan on 2x2, over steps" 0 "gpt2-2x2-adamw +6 +0 +0 +0" -- \
    "$sb" launch -n 4 -- run "$tmp/gloo.yaml" --backend gloo --out "$tmp/gloo"
  check "gloo: every fsdp rank's peak equal to its prediction (gloo's scratch), uneven shards too" 0 "ok 9" -- \
    python3 - "$tmp/gloo/results.json" <<'PY'
import json, sys
n = 0
for r in json.load(open(sys.argv[1]))["records"]:
    if r["status"] == "unsupported" or not r["strategy_id"].startswith("sharding/fsdp/"):
        continue
    assert r["status"] == "pass", r["message"]
    assert r["details"]["peak_mem_bytes_per_rank"] == r["details"]["memory_limit_bytes_per_rank"], r
    n += 1
print("ok", n)
PY
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

check "planted: hsdp reduce-scatters over the replica axis" 1 \
  "fail: gpt2-2x2-sgd sharding/fsdp/hsdp: replicas: .*loss@rank0" -- \
  "$sb" run "$src/suites/fsdp.yaml" --out "$tmp/f4" --repetitions 1 --min-time 0.0001 \
  --filter '^sharding/fsdp/hsdp$' --plant-fault 'sharding/fsdp/hsdp=hsdp_wrong_axis'
check "planted: hsdp leaves one gradient unsummed over the replicas" 1 \
  "fail: mlp-2x2-adamw sharding/fsdp/hsdp: replicas: .* on rank 2 is not bit-identical to rank 0's copy" -- \
  "$sb" run "$src/suites/fsdp.yaml" --out "$tmp/f5" --repetitions 1 --min-time 0.0001 \
  --filter '^sharding/fsdp/hsdp$' --plant-fault 'sharding/fsdp/hsdp=replica_unsummed'
# Each rank sums the gathered gradients from its own: every copy within tolerance of the
# reference and communication as predicted, so only the replica check can fail the row.
check "planted: ddp ranks summing in their own order fail on the replica check alone" 1 \
  "fail: mlp-4-sgd sharding/fsdp/ddp: replicas: grad_norm \[0:4\] on rank 1 is not bit-identical" -- \
  "$sb" run "$src/suites/fsdp.yaml" --out "$tmp/f6" --repetitions 1 --min-time 0.0001 \
  --filter '^sharding/fsdp/ddp$' --plant-fault 'sharding/fsdp/ddp=replica_own_order'
check "replica_own_order: every tensor within tolerance, bytes and memory as predicted" 0 "ok 5" -- \
  python3 - "$tmp/f6/results.json" <<'PY'
import json, sys
recs = json.load(open(sys.argv[1]))["records"]
for r in recs:
    assert r["status"] == "fail" and r["message"].startswith("replicas: "), r["message"]
    assert all(t["mismatches"] == 0 for t in r["details"]["tensors"]), r["case"]
    assert r["comm_bytes"] == r["predicted_comm_bytes"], r["case"]
    assert r["details"]["peak_mem_bytes_per_rank"] == r["details"]["memory_limit_bytes_per_rank"], r["case"]
    assert r["details"]["replica_check"]["checked"] > 0
print("ok", len(recs))
PY

# A unit never freed after its forward: every number and collective right, only the memory
# promise (the model's peak, per rank) broken.
check "planted: a unit not resharded after its forward breaks the memory promise" 1 \
  "fail: gpt2-4-adamw sharding/fsdp/zero3: rank 0 peaked at [0-9]+ bytes, over the [0-9]+ bytes it promised" -- \
  "$sb" run "$src/suites/fsdp.yaml" --out "$tmp/f7" --repetitions 1 --min-time 0.0001 \
  --filter '^sharding/fsdp/zero3$' --plant-fault 'sharding/fsdp/zero3=unit_not_resharded'
check "unit_not_resharded: numbers and bytes right, the peak over the prediction" 0 "ok 5" -- \
  python3 - "$tmp/f7/results.json" <<'PY'
import json, sys
recs = [r for r in json.load(open(sys.argv[1]))["records"] if r["status"] == "fail"]
for r in recs:
    assert r["message"].startswith("rank "), r["message"]
    assert all(t["mismatches"] == 0 for t in r["details"]["tensors"]), r["case"]
    assert r["comm_bytes"] == r["predicted_comm_bytes"], r["case"]
    assert r["peak_mem_bytes"] > r["predicted_mem_bytes"], r["case"]
print("ok", len(recs))
PY

# Golden losses: the suite's file holds on this host (bitwise where written on these vector
# units); a moved loss is an error naming the step; --write-golden needs the suite's key.
check "golden: every training row says how its losses compared with the file" 0 "ok 26" -- \
  python3 - "$tmp/threads/results.json" <<'PY'
import json, sys
recs = [r for r in json.load(open(sys.argv[1]))["records"] if r["status"] != "unsupported"]
for r in recs:
    assert "fsdp.golden.csv over" in r["details"]["golden"], r["details"].get("golden")
print("ok", len(recs))
PY
# The rest works on this host's own file (the suite's was written on a host whose vector units
# may differ: kept entries must be this host's, bitwise), written from the suite first.
mkdir -p "$tmp/golden"
cp "$src/suites/fsdp.yaml" "$src/suites/fsdp.golden.csv" "$tmp/golden/"
check "golden: --write-golden writes this host's file" 0 "golden losses of 8 training case" -- \
  "$sb" run "$tmp/golden/fsdp.yaml" --out "$tmp/g0" --repetitions 1 --min-time 0.0001 \
  --write-golden
cp "$tmp/golden/fsdp.golden.csv" "$tmp/host.golden.csv"
sed -i -E '0,/^mlp-4-sgd,3,/s/^(mlp-4-sgd,3,-?0x1\.)([0-9a-f])/\1f/' "$tmp/golden/fsdp.golden.csv"
check "golden: a moved loss errors every row of its case, naming the step" 1 \
  "error: mlp-4-sgd sharding/fsdp/ddp: golden losses: the reference's loss at step 3 is .*fsdp.golden.csv has" -- \
  "$sb" run "$tmp/golden/fsdp.yaml" --out "$tmp/g1" --repetitions 1 --min-time 0.0001 \
  --filter '^sharding/fsdp/ddp$'
check "golden: --write-golden restores it, keeping the case the filter left out" 0 \
  "golden losses of 5 training case.* \\(3 not run kept as the file had them\\)" -- \
  "$sb" run "$tmp/golden/fsdp.yaml" --out "$tmp/g2" --repetitions 1 --min-time 0.0001 \
  --filter '^sharding/fsdp/ddp$' --write-golden
check "golden: the rewritten file is the one written before the loss moved" 0 "" -- \
  diff "$tmp/host.golden.csv" "$tmp/golden/fsdp.golden.csv"
sed -i 's/^# cpu: .*/# cpu: avx avx2 fma/' "$tmp/golden/fsdp.golden.csv"
check "golden: another host's entries are not kept under this host's header" 2 \
  "is not run here .*other vector units or threads .*without --filter" -- \
  "$sb" run "$tmp/golden/fsdp.yaml" --out "$tmp/g3" --repetitions 1 --min-time 0.0001 \
  --filter '^sharding/fsdp/ddp$' --write-golden

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
check "--write-golden on a suite without the key: exit 2" 2 "needs the suite's key 'golden'" -- \
  "$sb" run "$tmp/gloo.yaml" --out "$tmp/b0" --write-golden
printf 'suite: bad\ncases:\n  - name: c\n    workload: mlp\n    shape: {layers: 1}\n    mesh: 2\n    steps: 2\n    params: {reshard_after_forward: 1}\n    strategies: ["sharding/fsdp/zero3"]\n' >"$tmp/bad.yaml"
check "reshard_after_forward not a boolean: exit 2 naming it" 2 "params.reshard_after_forward must be true or false, got 1" -- \
  "$sb" run "$tmp/bad.yaml" --out "$tmp/b5"
sed -i 's/reshard_after_forward: 1/prefetch: 1.5/' "$tmp/bad.yaml"
check "prefetch not a whole number of units: exit 2 naming it" 2 "params.prefetch must be a whole number of units, 0 to 8, got 1.5" -- \
  "$sb" run "$tmp/bad.yaml" --out "$tmp/b6"
bad mlp "    steps: 0\n"
check "steps: 0: exit 2 naming the key" 2 "key .steps. must be a whole number from 1" -- "$sb" run "$tmp/bad.yaml" --out "$tmp/b4"
finish
