#!/usr/bin/env bash
# End-to-end checks of expert parallelism (docs/moe.md): suites/moe.yaml passes (dropless and
# with a capacity, both drop policies, k = 1 and 2, E = 4 and 8, EP 2 and 4, EP x DP on 2x2 and
# 2x4, EP x TP on 2x2, DP x EP x TP on 2x2x2, EP x FSDP on 2x2 and FSDP x EP x TP on 2x2x2,
# over 3 optimizer steps), the capacity cases drop assignments, communication is counted as
# predicted from each step's routing; each planted field fault fails its rows naming the tensor
# it got wrong (the experts' gradients scaled by the EP degree, the router's gradient left
# partial, the experts' gradients reduced over the data-parallel group, the capacity from a
# rank's own tokens: only the cases with a capacity fail; the experts' rows' gradient not summed
# over tp); two cases on gloo across 4 processes; a malformed shape or params.axes is exit 2
# naming the key; experts that do not divide over the ranks are unsupported. Where this build's
# SB_TORCH_PYTHON has PyTorch 2.x: torch/ep (PyTorch's MoE layer under DTensor expert
# parallelism) passes the dropless [ep] and [dp, ep] cases, one step and over steps, with its
# all-to-alls counted; a user's own layer from a file passes, the same layer with a bug fails
# naming the tensor; each planted fault fails; a capacity case is unsupported saying why.
# Elsewhere every torch/ep row is unsupported.
# Usage: ci/moe_test.sh BUILD SOURCE
set -uo pipefail
build=$1
src=$2
sb="$build/stratbench"
source "$src/ci/test_lib.sh"
serve_core "$build"
cd "$src"

check "moe suite: every case passes" 0 "total +17 +0 +0 +0 +0$" -- \
  "$sb" run suites/moe.yaml --filter '^sharding/' --out "$tmp/suite" --repetitions 1
check "routing checked, drops happen, communication as predicted" 0 "ok" -- \
  python3 - "$tmp/suite/results.csv" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
assert len(rows) == 17, len(rows)
for r in rows:
    assert r["status"] == "pass", (r["case"], r["message"])
    assert r["comm_bytes"] == r["predicted_comm_bytes"] and int(r["comm_bytes"]) > 0, r["case"]
print("ok")
PY
check "a rank whose expert gets no row (and one whose tokens are all dropped) still passes" 0 "ok" -- \
  python3 - "$tmp/suite/results.json" <<'PY'
import json, sys
for case in ("sparse-k1-e8-ep8-capacity", "sparse-k1-e8-ep8-dropless"):
    r = [r for r in json.load(open(sys.argv[1]))["records"] if r["case"] == case][0]
    assert r["status"] == "pass" and r["params"]["least_rows_received"] == "0", (case, r["params"])
print("ok")
PY
check "every case with a capacity drops assignments, no dropless one does" 0 "ok" -- \
  python3 - "$tmp/suite/results.json" <<'PY'
import json, sys
recs = json.load(open(sys.argv[1]))["records"]
for r in recs:
    dropped = int(r["params"]["dropped_total"])
    assert (dropped > 0) == (r["params"]["capacity"] != "dropless"), (r["case"], dropped)
print("ok")
PY
# Each fault with the rows it must fail (pass / fail): capacity_local only the 8 with a capacity,
# tp_rows_grad_unsummed only the 2 one-step rows with tp (over steps only the parameters are
# checked, and the layer's input gradient reaches none of them).
for fault in grads_scaled_by_ep:grad_w:0:17 experts_reduced_over_dp:grad_w:0:17 \
             router_grad_partial:grad_router:0:17 capacity_local:output:9:8 \
             tp_rows_grad_unsummed:grad_input:15:2; do
  IFS=: read -r name tensor passing failing <<<"$fault"
  want="total +$passing +$failing +0 +0 +0$"
  check "planted $name: fails, naming $tensor" 1 "$want" -- \
    "$sb" run suites/moe.yaml --filter '^sharding/' --out "$tmp/f-$name" --repetitions 1 \
    --plant-fault "sharding/moe/ep=$name"
  grep -q "sharding/moe/ep: .*$tensor" "$tmp/out" && pass "$name names $tensor" ||
    fail "$name: no failure names $tensor"
done
# A sample across processes: 4 ranks under launch on gloo (its uneven all-to-alls), one step
# with a capacity on EP 4 and 3 AdamW steps of EP x FSDP.
cat > "$tmp/gloo.yaml" <<'YAML'
suite: moe-gloo
defaults: {dtype: float32, inputs: random, seed: 1234, repetitions: 1, min_time_s: 0.002}
cases:
  - name: capacity-k2-e8-ep4-probability
    workload: moe
    shape: {batch: 4, seq: 16, d_model: 32, ffn: 64, experts: 8, top_k: 2, capacity_factor: 1.0}
    mesh: 4
    strategies: ["sharding/moe/ep"]
  - name: train-fsdp2xep2-position
    workload: moe
    shape: {batch: 4, seq: 16, d_model: 32, ffn: 64, experts: 8, top_k: 2, capacity_factor: 1.0,
            drop: position}
    mesh: 2x2
    params: {axes: [dp_shard, ep]}
    steps: 3
    optimizer: {kind: adamw, lr: 0.001, weight_decay: 0.01, clip_grad_norm: 1.0}
    strategies: ["sharding/moe/ep"]
YAML
check "gloo across 4 processes: both pass" 0 "total +2 +0 +0 +0 +0$" -- \
  "$sb" launch -n 4 -- run "$tmp/gloo.yaml" --backend gloo --out "$tmp/gloo"
cat > "$tmp/bad.yaml" <<'YAML'
suite: bad
cases:
  - name: bad-k
    workload: moe
    shape: {experts: 4, top_k: 5}
    mesh: 2
    strategies: ["sharding/moe/ep"]
YAML
check "top_k over the experts: exit 2 naming it" 2 "top_k" -- "$sb" run "$tmp/bad.yaml" --out "$tmp/bad"
cat > "$tmp/uneven.yaml" <<'YAML'
suite: uneven
cases:
  - name: e6-ep4
    workload: moe
    shape: {experts: 6, top_k: 2}
    mesh: 4
    strategies: ["sharding/moe/ep"]
YAML
cat > "$tmp/axes.yaml" <<'YAML'
suite: axes
cases:
  - name: bad-axes
    workload: moe
    shape: {experts: 4, top_k: 2}
    mesh: 2x2
    params: {axes: [tp, ep]}
    strategies: ["sharding/moe/ep"]
YAML
check "params.axes out of order: exit 2 naming it" 2 "params.axes" -- \
  "$sb" run "$tmp/axes.yaml" --out "$tmp/axes"
check "6 experts over 4 ranks: unsupported" 0 "total +0 +0 +0 +1 +0$" -- \
  "$sb" run "$tmp/uneven.yaml" --out "$tmp/uneven"
grep -q "6 experts do not divide over 4 EP ranks" "$tmp/uneven/results.csv" &&
  pass "the row says why" || fail "the unsupported row does not say why"
# ---- torch/ep: PyTorch's MoE layer under expert parallelism (docs/moe.md) ----------------------
py=$(sed -n 's/^SB_TORCH_PYTHON:FILEPATH=//p' "$build/CMakeCache.txt")
if ! "$py" -c "from torch.distributed.tensor import distribute_module" 2>/dev/null; then
  check "no PyTorch 2.x: every torch/ep row unsupported, saying so" 0 "total +0 +0 +0 +6 +0$" -- \
    "$sb" run suites/moe.yaml --filter '^torch/ep$' --out "$tmp/torch-missing" --repetitions 1
  finish
  exit
fi
check "torch/ep: PyTorch's MoE layer passes every dropless [ep] and [dp, ep] case" 0 \
  "total +6 +0 +0 +0 +0$" -- \
  "$sb" run suites/moe.yaml --filter '^torch/ep$' --out "$tmp/torch" --repetitions 1
check "torch/ep: routing and the aux loss checked, all-to-alls counted, replicas bitwise" 0 "ok" -- \
  python3 - "$tmp/torch/results.json" <<'PY'
import json, sys
recs = json.load(open(sys.argv[1]))["records"]
assert len(recs) == 6, len(recs)
for r in recs:
    assert r["status"] == "pass", (r["case"], r["message"])
    checked = set(r["tensor_err_ratio"])
    need = {"expert_index", "kept", "tokens_per_expert"}
    need |= {"param/router", "param/w1", "loss"} if r["case"].startswith("train") else \
            {"aux_loss", "output", "grad_input", "grad_router", "grad_w1", "grad_w2", "grad_w3"}
    assert need <= checked, (r["case"], need - checked)
    # The uneven all-to-alls PyTorch ran, counted by its dispatch, are the bytes and calls
    # stratbench's twin predicts from the reference's routing, on every rank.
    for p in r["details"]["comm_per_rank"]:
        got, want = p["counted"].get("all_to_all"), p["predicted"].get("all_to_all")
        assert got and got == want, (r["case"], p["rank"], got, want)
print("ok")
PY
cat > "$tmp/user_moe.py" <<'PY'
# A user's MoE layer written its own way (its own names, a Parameter for the router, the experts
# called on rows sorted by expert), under the contract torch/ep reads (moe_layer.py).
import torch, torch.nn as nn, torch.nn.functional as F
import torch.distributed as dist

class Experts(nn.Module):
    def __init__(self, e, d, h):
        super().__init__()
        self.gate_proj = nn.Parameter(torch.empty(e, h, d))
        self.up_proj = nn.Parameter(torch.empty(e, h, d))
        self.down_proj = nn.Parameter(torch.empty(e, d, h))
    def forward(self, rows, counts):
        w = [p.to_local() if hasattr(p, "to_local") else p
             for p in (self.gate_proj, self.up_proj, self.down_proj)]
        out = []
        for e, x in enumerate(rows.split(counts.tolist())):
            out.append((F.silu(x @ w[0][e].t()) * (x @ w[1][e].t())) @ w[2][e].t())
        return torch.cat(out)

class MyMoE(nn.Module):
    REFERENCE_NAMES = {"router": "wg", "w1": "experts.gate_proj", "w3": "experts.up_proj",
                       "w2": "experts.down_proj"}
    BUG = False
    def __init__(self, shape):
        super().__init__()
        self.E, self.k, self.sig = shape["experts"], shape["top_k"], shape["score"] == "sigmoid"
        self.norm = shape["norm_topk"]
        self.wg = nn.Parameter(torch.empty(self.E, shape["d_model"]))
        self.experts = Experts(self.E, shape["d_model"], shape["ffn"])
        self.aux_group, self.routing = None, {}
    def forward(self, x):
        scores = x @ self.wg.t()
        probs = scores.sigmoid() if self.sig else scores.softmax(-1)
        top, idx = probs.topk(self.k, -1)
        if self.norm:
            top = top / top.sum(-1, keepdim=True)
        order = idx.flatten().argsort(stable=True)
        counts = idx.flatten().bincount(minlength=self.E)
        y = self.experts(x[order // self.k], counts) * top.flatten()[order, None]
        out = torch.zeros_like(x).index_add(0, order // self.k, y)
        n = torch.cat([counts.double(), torch.tensor([float(x.shape[0])], dtype=torch.float64)])
        if self.aux_group is not None:
            dist.all_reduce(n, group=self.aux_group)
        p = probs if (self.BUG or not self.sig) else probs / probs.sum(-1, keepdim=True)
        aux = self.E * ((n[:-1].to(x.dtype) / (n[-1] * self.k)) * p.sum(0) / n[-1]).sum()
        self.routing = {"expert_index": idx, "kept": torch.ones(idx.shape, dtype=torch.float64),
                        "tokens_per_expert": counts.double()}
        return out, aux

class BuggyMoE(MyMoE):
    BUG = True  # sigmoid scores not normalised in the load-balancing loss
PY
sed "s#\"torch/ep\"\]#\"torch/ep\"]\n    params: {model: \"$tmp/user_moe.py:MyMoE\"}#" suites/moe.yaml |
  cat > "$tmp/user.yaml"
check "a user's own MoE layer from a file under torch/ep: every case passes" 0 \
  "total +6 +0 +0 +0 +0$" -- \
  "$sb" run "$tmp/user.yaml" --filter '^torch/ep$' --out "$tmp/user" --repetitions 1
sed "s#user_moe.py:MyMoE#user_moe.py:BuggyMoE#" "$tmp/user.yaml" > "$tmp/buggy.yaml"
check "the same layer with its sigmoid aux unnormalised fails the two sigmoid cases" 1 \
  "total +1 +2 +0 +0 +0$" -- \
  "$sb" run "$tmp/buggy.yaml" --filter '^torch/ep$' --case 'sigmoid|^dropless-k2-e4-ep2$' \
  --out "$tmp/buggy" --repetitions 1
grep -q "dropless-k1-e8-ep4-sigmoid.*aux_loss" "$tmp/buggy/results.csv" &&
  pass "the one-step row names aux_loss" || fail "no failing row names aux_loss"
grep -q "train-sgd-k1-e4-ep4-sigmoid.*state/router" "$tmp/buggy/results.csv" &&
  pass "the training row names the router's state" || fail "the training row names no router state"
# (On the one-step [ep] and [dp, ep] cases: the fault is the strategy's, the same on every case.)
for fault in grads_scaled_by_ep:grad_w experts_reduced_over_dp:grad_w router_grad_partial:grad_router; do
  IFS=: read -r name tensor <<<"$fault"
  check "torch/ep planted $name: every row fails, naming $tensor" 1 "total +0 +2 +0 +0 +0$" -- \
    "$sb" run suites/moe.yaml --filter '^torch/ep$' --case '^dropless-k2-e4-(ep2|dp2xep2)$' \
    --out "$tmp/tf-$name" --repetitions 1 --plant-fault "torch/ep=$name"
  grep -q "torch/ep: .*$tensor" "$tmp/out" && pass "torch/ep $name names $tensor" ||
    fail "torch/ep $name: no failure names $tensor"
done
cat > "$tmp/torch-capacity.yaml" <<'YAML'
suite: torch-capacity
cases:
  - name: capacity
    workload: moe
    shape: {batch: 4, seq: 16, d_model: 32, ffn: 64, experts: 4, top_k: 2, capacity_factor: 1.0}
    mesh: 2
    strategies: ["torch/ep"]
YAML
check "torch/ep with a capacity: unsupported, saying it runs dropless" 0 "total +0 +0 +0 +1 +0$" -- \
  "$sb" run "$tmp/torch-capacity.yaml" --out "$tmp/torch-capacity"
grep -q "dropless" "$tmp/torch-capacity/results.csv" && pass "the row says why" ||
  fail "the capacity row does not say why"
finish
