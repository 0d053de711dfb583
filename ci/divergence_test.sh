#!/usr/bin/env bash
# End-to-end checks of locating a failing row (harness/run/divergence.h): every planted fault of
# the families that capture their intermediate values is named at the node it was planted in,
# and a correct executor's every traced value is within its tolerance (`run --capture`), on
# threads and on gloo; the record, the failure message and the HTML report carry it.
# Usage: ci/divergence_test.sh BUILD_DIR SOURCE_DIR
set -uo pipefail
build=$1
src=$2
sb="$build/stratbench"
source "$src/ci/test_lib.sh"
serve_core "$build"

# `located RESULTS.json CHECK`: every row of the file is checked by CHECK, a Python expression
# over the record `r` and its first divergence `d` (None where there is none); prints each
# row's verdict and fails on the first false one.
located() {
  python3 - "$1" "$2" <<'PY'
import json, sys
records = json.load(open(sys.argv[1]))["records"]
assert records, "no rows"
bad = 0
for r in records:
    d = r["details"].get("first_divergence")
    ok = eval(sys.argv[2], {"r": r, "d": d})
    where = f'{d.get("node")} {d.get("phase")} {d.get("tensor")} ranks {d.get("ranks")}' \
        if d and d.get("found") else json.dumps(d)
    print(("ok  " if ok else "BAD ") + f'{r["case"]} {r["strategy_id"]} {r["status"]}: {where}')
    bad += not ok
print(f"{len(records)} rows, {bad} not as expected")
sys.exit(1 if bad else 0)
PY
}

# 1. Plans (sharding/auto/*): the autoshard suite's GPT-2 and LLaMA cases. Captured on passing
# rows, every traced value of every rank is within its tolerance: the capture's layouts,
# reductions and gradients are right, so that a divergence found below is the fault's.
python3 - "$src/suites/autoshard.yaml" "$tmp/plans.yaml" <<'PY'
import sys
text = open(sys.argv[1]).read()
head, cases = text.split("\ncases:\n")
keep = [c for c in cases.split("  - name: ") if c.split("\n")[0] in
        ("gpt2-L2-mesh2x2", "gpt2-L2-mesh4", "gpt2-L2-mesh2x2-adamw-steps", "llama-L2-mesh2x2")]
assert len(keep) == 4, "autoshard.yaml lost a case this test runs"
open(sys.argv[2], "w").write(head + "\ncases:\n" + "".join("  - name: " + c for c in keep))
PY
check "plans, --capture: every row passes" 0 "total +16 +0 +0 +0" -- \
  "$sb" run "$tmp/plans.yaml" --out "$tmp/capture" --repetitions 1 --min-time 0.0001 --capture
check "plans, --capture: no traced value leaves its tolerance, hundreds compared a row" 0 \
  "16 rows, 0 not" -- located "$tmp/capture/results.json" \
  '(d is not None and d["found"] is False and d["compared"] >= 4 * 80
    and "missing" not in d and "untraced" not in d)'
check "a passing row without --capture is not captured" 0 "total +4 +0 +0 +0" -- \
  "$sb" run "$tmp/plans.yaml" --out "$tmp/plain" --repetitions 1 --filter '^sharding/auto/ilp$'
check "... and its record has no first_divergence" 0 "4 rows, 0 not" -- \
  located "$tmp/plain/results.json" 'd is None'

# Communication per node (details.comm_by_node): every rank of every row that communicates has
# its collectives at the plan's own nodes (forward and backward) or, outside them, in the update
# (the training loop's reductions), each node predicted by the plan.
check "plans: every rank's collectives at the plan's nodes, each predicted there" 0 \
  "16 rows, 0 not" -- located "$tmp/capture/results.json" \
  '(lambda ranks, names, comm: (len(ranks) == 4 or not comm) and all(
      rk["predicted_per_node"] and all(
        "predicted" in n and (n["node"] in names and n["phase"] in ("forward", "backward")
                              or n["node"] == "" and n["phase"] == "update")
        for n in rk["nodes"])
      for rk in ranks))(
    r["details"].get("comm_by_node", []),
    {n["name"] for n in r["details"]["case"]["nodes"]},
    any(c["counted"] for c in r["details"]["comm_per_rank"]))'

# The planted fault skip_edge_redistribution, in every plan algorithm: the first edge that needs
# a redistribution does none. Its consumer's operand, as read, is the first value off, forward,
# at the edge the plan lists first (details.case.edge_reads, from the plan, not the capture). A
# plan that redistributes on no edge (Megatron's on these cases: attention's batched matmuls
# keep its layouts) has nothing to skip: unsupported, saying so.
faults=()
for algo in ilp megatron data-parallel replicated; do
  faults+=(--plant-fault "sharding/auto/$algo=skip_edge_redistribution")
done
check "planted, every plan algorithm: each row fails, naming its first divergence" 1 \
  "first divergence: node h0\.attn\.[a-z_]+ \(forward\)" -- \
  "$sb" run "$tmp/plans.yaml" --out "$tmp/fault" --repetitions 1 --min-time 0.0001 "${faults[@]}"
check "planted: the named value is the plan's first redistributed read, on every row" 0 \
  "16 rows, 0 not" -- located "$tmp/fault/results.json" \
  '"nothing to skip" in r["message"] if r["status"] == "unsupported" else (
     r["status"] == "fail" and d["found"] and d["phase"] == "forward"
     and d["tensor"] == r["details"]["case"]["edge_reads"][0]
     and d["node"] == d["tensor"].split(" -> ")[1].split("[")[0]
     and "first divergence: node " + d["node"] in r["message"])'
# Where the skipped edge's redistribution communicates, its collectives are missing at its
# consumer: the counts part at the node the values first leave the reference (backward there,
# where only the gradient's redistribution communicates).
check "planted: where the counts part, at the node where the values first diverge" 0 \
  "^[4-9] parted$" -- python3 - "$tmp/fault/results.json" <<'PY'
import json, re, sys
n = 0
for r in json.load(open(sys.argv[1]))["records"]:
    m = re.search(r"communication: rank \d+ .*?first at node (\S+) \((forward|backward)\)",
                  r["message"])
    if not m:
        continue
    d = r["details"]["first_divergence"]
    assert m.group(1) == d["node"], (r["case"], r["strategy_id"], m.group(1), d["node"])
    n += 1
print(f"{n} parted")
PY
check "report on the failing rows" 1 "" -- \
  "$sb" report "$tmp/fault" --out "$tmp/report" --no-plots --gate
check "report: the HTML's table of where rows diverge names each failing row's node" 0 \
  "([4-9]|[1-9][0-9]) located of the \\1 failing" -- \
  python3 - "$tmp/report/report.html" "$tmp/fault/results.json" <<'PY'
import json, re, sys
html = open(sys.argv[1]).read()
table = re.search(r'<table[^>]*id="divergence".*?</table>', html, re.S)
assert table, "no table with id divergence"
rows = re.findall(r"<tr>(.*?)</tr>", table.group(0), re.S)[1:]
cells = [re.findall(r"<td[^>]*>(.*?)</td>", row, re.S) for row in rows]
located = {(c[0], c[1]): c[3] for c in cells}
n = failing = 0
for r in json.load(open(sys.argv[2]))["records"]:
    d = r["details"].get("first_divergence")
    failing += r["status"] == "fail"
    if not d or not d.get("found"):
        continue
    assert located.get((r["case"], r["strategy_id"])) == d["node"], (r["case"], r["strategy_id"])
    n += 1
print(f"{n} located of the {failing} failing")
PY
check "report: each row's communication per node on request, the rows that part marked" 0 \
  "^[1-9][0-9]* tables, [4-9] marked$" -- \
  python3 - "$tmp/report/report.html" "$tmp/fault/results.json" <<'PY'
import json, re, sys
html = open(sys.argv[1]).read()
blocks = re.findall(r'<details id="comm-by-node-\d+-d"><summary( class="fail")?>(.*?)</summary>'
                    r'\s*<table[^>]*>(.*?)</table>', html, re.S)
records = json.load(open(sys.argv[2]))["records"]
parted = {(r["case"], r["strategy_id"]) for r in records if "communication: " in r["message"]}
with_comm = [r for r in records if r["details"].get("comm_by_node")]
assert len(blocks) == len(with_comm), (len(blocks), len(with_comm))
marked = 0
for fail, summary, table in blocks:
    case, strategy = summary.split(" (")[0].split(" / ")
    assert bool(fail) == ((case, strategy) in parted), summary
    rows = re.findall(r"<tr>(.*?)</tr>", table, re.S)[1:]
    assert rows and all(len(re.findall(r"<td", row)) == 6 for row in rows), summary
    marked += bool(fail)
print(f"{len(blocks)} tables, {marked} marked")
PY

# On gloo, 4 processes: each rank captures in its own process and rank 0 takes the earliest.
if "$sb" run --help | grep -q gloo; then
  python3 - "$tmp/plans.yaml" "$tmp/one.yaml" <<'PY'
import sys
head, cases = open(sys.argv[1]).read().split("\ncases:\n")
open(sys.argv[2], "w").write(head + "\ncases:\n  - name: " + cases.split("  - name: ")[1])
PY
  check "gloo, planted: the first divergence over 4 processes" 1 "first divergence: node" -- \
    "$sb" launch -n 4 -- run "$tmp/one.yaml" --backend gloo --out "$tmp/gloo" --repetitions 1 \
    --min-time 0.0001 --filter '^sharding/auto/data-parallel$' \
    --plant-fault 'sharding/auto/data-parallel=skip_edge_redistribution'
  check "gloo, planted: at the plan's first redistributed read" 0 "1 rows, 0 not" -- \
    located "$tmp/gloo/results.json" \
    'd["found"] and d["tensor"] == r["details"]["case"]["edge_reads"][0] and len(d["ranks"]) >= 1'
  check "gloo: every process's communication per node reaches the record" 0 "1 rows, 0 not" -- \
    located "$tmp/gloo/results.json" \
    '(sorted(rk["rank"] for rk in r["details"]["comm_by_node"]) == [0, 1, 2, 3]
      and all(rk["predicted_per_node"] and rk["nodes"] for rk in r["details"]["comm_by_node"]))'
else
  echo "SKIP: this build has no gloo backend"
fi

# 2. The catalogue: every planted fault of the families that capture (checkpointing, pipeline,
# Megatron blocks, FSDP; the plans' above), each asserted where the fault was planted, or that it
# is not a numerics fault (memory, communication, a schedule that cannot run, copies that differ
# only in their bits) and so has nothing to locate. Every fault of those families in `list --json` must have an expectation here.
cat >"$tmp/catalogue.yaml" <<'YAML'
suite: catalogue
defaults: {repetitions: 1, min_time_s: 0.0001, seed: 1234}
cases:
  - name: mlp-chain
    workload: mlp_chain
    shape: {batch: 32, width: 64, depth: 8, dropout: 0.1}
    mesh: 1
    params: {budget: 0.6}
    strategies: ["checkpointing/(sqrt|rotor)"]
  # Tight enough that rotor's optimum needs long runs of forwards (short_leaf_runs bites).
  - name: mlp-chain-tight
    workload: mlp_chain
    shape: {batch: 32, width: 128, depth: 12, dropout: 0.1}
    mesh: 1
    params: {budget: 0.3}
    strategies: ["checkpointing/rotor"]
  - name: gpt2-chain
    workload: gpt2_stack
    shape: {batch: 2, seq: 16, d_model: 32, heads: 2, layers: 4, dropout: 0.1}
    mesh: 1
    params: {budget: 0.6}
    strategies: ["checkpointing/(sqrt|rotor)"]
  - name: pipe-2
    workload: mlp_chain
    shape: {batch: 32, width: 64, depth: 8, dropout: 0, microbatches: 4}
    mesh: 2
    strategies: ["pipeline/(1f1b|zb-h1|interleaved-1f1b)"]
  - name: pipe-2x2
    workload: gpt2_stack
    shape: {batch: 8, seq: 16, d_model: 32, heads: 2, layers: 4, dropout: 0, microbatches: 4}
    mesh: 2x2
    strategies: ["pipeline/(1f1b|zb-h1|interleaved-1f1b)"]
  - name: block-2x2
    workload: transformer_block
    shape: {batch: 4, seq: 16, d_model: 32, heads: 4, dropout: 0.1}
    mesh: 2x2
    strategies: ["sharding/megatron/.*"]
  - name: mlp-fsdp-4
    workload: mlp
    shape: {batch: 8, d_model: 32, layers: 2}
    mesh: 4
    steps: 2
    optimizer: {kind: sgd, lr: 0.001, momentum: 0.9}
    strategies: ["sharding/fsdp/.*"]
  - name: gpt2-fsdp-2x2
    workload: gpt2
    shape: {batch: 4, seq: 8, d_model: 32, heads: 2, layers: 1, vocab: 64, dropout: 0}
    mesh: 2x2
    steps: 2
    optimizer: {kind: sgd, lr: 0.001, momentum: 0.9}
    strategies: ["sharding/fsdp/.*"]
  # FSDP with a selective checkpointing policy in its blocks (params.sac), where the policy's
  # own fault plants.
  - name: gpt2-fsdp-sac-2x2
    workload: gpt2
    shape: {batch: 4, seq: 8, d_model: 32, heads: 2, layers: 2, vocab: 64, dropout: 0}
    mesh: 2x2
    steps: 2
    optimizer: {kind: sgd, lr: 0.001, momentum: 0.9}
    strategies: ["sharding/fsdp/.*"]
    params: {sac: recompute-all}
  - name: cp-train-4
    workload: gpt2_prefill
    shape: {batch: 2, seq: 32, d_model: 32, heads: 8, layers: 2, mode: training}
    mesh: 4
    strategies: ["sharding/cp/.*"]
  - name: cp-tp-train-2x2
    workload: gpt2_prefill
    shape: {batch: 1, seq: 32, d_model: 32, heads: 4, layers: 2, mode: training}
    mesh: 2x2
    strategies: ["sharding/cp/.*"]
  - name: prefill-chunked
    workload: gpt2_prefill
    shape: {batch: 1, seq: 64, d_model: 32, heads: 2, layers: 2}
    mesh: 1
    params: {chunk: 16}
    strategies: ["chunking/(attention|ffn|block|ln_residual)/seq"]
  - name: train-chunked
    workload: gpt2_prefill
    shape: {batch: 2, seq: 32, d_model: 32, heads: 2, layers: 2, mode: training}
    mesh: 1
    params: {chunk: 8}
    strategies: ["chunking/(attention|ffn|block|ln_residual)/seq"]
YAML
"$sb" list --json >"$tmp/list.json"
python3 - "$sb" "$tmp" <<'PY'
import json, re, subprocess, sys
sb, tmp = sys.argv[1], sys.argv[2]
strategies = json.load(open(f"{tmp}/list.json"))

def first_recompute(schedule):
    """The stage of the schedule's first forward of a stage that already ran."""
    ran = set()
    for op in schedule:
        kind, _, stage = op.partition("_")
        if kind in ("Fe", "Fn", "CF"):
            if stage in ran:
                return int(stage)
            ran.add(stage)
    return None

def recomputed(schedule):
    seen, twice = set(), set()
    for op in schedule:
        kind, _, stage = op.partition("_")
        if kind in ("Fe", "Fn", "CF"):
            (twice if stage in seen else seen).add(stage)
    return {int(s) for s in twice}

# fault -> (what the row must show). `d`: the first divergence; `r`: the record.
def located(phase, check):
    return lambda r, d: r["status"] == "fail" and d and d.get("found") and d["phase"] == phase \
        and check(r, d)
def nothing_numeric(pattern):
    # Not a numerics fault: the tensors pass (or the step never finishes), nothing is captured,
    # and the row fails on what the fault breaks (`pattern` in its message) or, where the fault
    # is harmless in this row, passes.
    return lambda r, d: d is None and (
        r["status"] == "pass" or re.search(pattern, r["message"]) is not None)
def params(r):
    return [t["tensor"][6:] for t in r["details"]["tensors"] if t["tensor"].startswith("param/")]
def param_grad(r, d):
    return d["tensor"].startswith("grad ") and d["tensor"][5:] in params(r)
def chunk_of(d):
    """'h0.ffn tokens [16:32)' -> (16, 32)"""
    s, e = d["tensor"].split("[")[1].rstrip(")").split(":")
    return int(s), int(e)
def chunked(first):  # the fault's first chunk of the first layer's region, forward
    return located("forward", lambda r, d: d["node"].startswith("h0.")
                   and first(chunk_of(d), int(dict(r["params"])["chunk"]) if isinstance(
                       r["params"], list) else int(r["params"]["chunk"])))
def stage_of(d):
    return int(d["tensor"][2:d["tensor"].index("]")]) - 1
expect = {
    "no_rng_restore": located("recompute", lambda r, d:
        stage_of(d) == first_recompute(r["details"]["executor"]["schedule"])),
    "stale_input": located("recompute", lambda r, d:
        stage_of(d) in recomputed(r["details"]["executor"]["schedule"])),
    # Every number right, only the generator state handed on is not: no traced value is off.
    "rng_left_after_recompute": lambda r, d: r["status"] == "fail" and d is not None
        and d.get("found") is False and "rng/cpu" in r["message"],
    "ignore_budget": nothing_numeric("over the [0-9]+ bytes it promised"),
    # A leak: every number right, what is held after a backward over the schedule's.
    "keep_input_to_end": nothing_numeric("over what the schedule holds|over the [0-9]+ bytes it promised"),
    # rotor's fast table missing moves: valid, slower than its reference program's optimum.
    "short_leaf_runs": nothing_numeric("against the reference program's optimum|reference program finds one"),
    # Selective checkpointing (checkpointing/sac/*, not in the catalogue's run: the stage solvers
    # stand for the family; ci/sac_test.sh plants these): a gradient off, or a promise broken.
    "recompute_without_rng": lambda r, d: r["status"] == "fail",
    "saved_freed_early": lambda r, d: r["status"] == "fail",
    "budget_ignores_view_base": nothing_numeric("over the [0-9]+ bytes it promised"),
    "grad_twice": located("backward", lambda r, d: d["node"] == "stage 0"
        and d["tensor"].startswith("grad ")
        and d["tensor"].split(" after ")[1] in ("micro-batch 1", "micro-batch 1 of replica 0",
                                                 "micro-batch 1 of replica 1")),
    "warmup_short": nothing_numeric("waiting for|dry run"),
    "w_before_i": nothing_numeric("before"),
    "send_wrong_stage": nothing_numeric("waiting for"),
    "skip_forward_all_reduce": located("forward", lambda r, d: d["node"] == "attn.proj"),
    "skip_shared_grad_all_reduce": located("backward", lambda r, d:
        d["tensor"] == "grad mlp.proj.bias"),
    "all_reduce_instead_of_reduce_scatter": nothing_numeric("communicated"),
    # FSDP: a reduced gradient wrong is named at the parameters' gradients as reduced (the
    # first the rank checks); the last parameter left unreduced, at that one.
    "grad_divided_twice": located("backward", param_grad),
    "hsdp_wrong_axis": located("backward", param_grad),
    "replica_unsummed": located("backward", lambda r, d: d["tensor"] == "grad " + params(r)[-1]),
    # The first step is right (a stale shard is stepped only after it): nothing off in it. DDP
    # steps no shard: harmless there.
    "stale_shard": lambda r, d: (r["status"] == "pass" and r["strategy_id"].endswith("/ddp")) or (
        d is not None and d.get("found") is False and "loss@" in r["message"]),
    # Every copy within tolerance, no two the same bits: the replica check names it.
    "replica_own_order": nothing_numeric("not bit-identical"),
    "unit_not_resharded": nothing_numeric("over the [0-9]+ bytes it promised"),
    # A parameter left out of the last rank's optimizer: the captured first step's forward and
    # backward are right, the update after it is not (nothing off among the traced values).
    "rank_skips_update": lambda r, d: r["status"] == "fail" and d is not None
        and d.get("found") is False,
    # Chunking: a chunk's last row left unwritten, or every chunk one row off: the first chunk
    # of the first layer's chunked region; attention within a chunk's own keys: the first chunk
    # that needs earlier keys (causal), the second.
    "off_by_one": chunked(lambda se, chunk: se == (0, chunk)),
    "wrong_offset": chunked(lambda se, chunk: se == (0, chunk)),
    "per_chunk_reduction": chunked(lambda se, chunk: se == (chunk, 2 * chunk)),
    # Context parallelism: a backward ring fault is named at the first attention backward
    # (the last layer's), the gradient it hands to the layer below; a forward fault at the
    # first layer.
    "stale_kv": located("backward", lambda r, d: d["node"] == "h1.attn"
                        and d["tensor"] == "grad h0 out"),
    "dkv_not_returned": located("backward", lambda r, d: d["node"] == "h1.attn"
                                and d["tensor"] == "grad h0 out"),
    "tp_input_grad_unsummed": lambda r, d: (r["status"] == "pass" and r["mesh"] != "2x2") or (
        located("backward", lambda r, d: d["node"] == "h1.attn"
                and d["tensor"] == "grad h0 out")(r, d)),
    "mask_ignores_balance": located("forward", lambda r, d: d["node"].split(".")[0] == "h0"),
    "ulysses_swapped": lambda r, d: r["status"] == "pass" or located(
        "forward", lambda r, d: d["node"].split(".")[0] == "h0")(r, d),
}
families = ("checkpointing/", "pipeline/", "sharding/megatron/", "sharding/fsdp/",
            "chunking/attention/seq", "chunking/ffn/seq", "chunking/block/seq",
            "chunking/ln_residual/seq", "sharding/cp/")
faults = [(s["id"], f) for s in strategies if s["id"].startswith(families)
          for f in s.get("planted_faults", [])]
missing = sorted({f for _, f in faults if f not in expect})
assert not missing, f"faults without an expectation here: {missing}"
bad = total = 0
failed = {}  # fault -> whether some row of it failed or errored (a fault that never bites is
             # not tested)
# Two solvers stand for checkpointing (the faults are the runner's, not a solver's).
faults = [(sid, f) for sid, f in faults if not sid.startswith("checkpointing/")
          or sid in ("checkpointing/sqrt", "checkpointing/rotor")]
# One process per round: the k-th fault of every strategy planted at once (a fault acts only on
# its own strategy's rows, each of which starts from the case's seed), instead of one process a
# fault: the start-up was most of the time.
by_sid = {}
for sid, fault in faults:
    by_sid.setdefault(sid, []).append(fault)
rows_of = {}
for k in range(max(len(f) for f in by_sid.values())):
    planted = {sid: f[k] for sid, f in by_sid.items() if len(f) > k}
    out = f"{tmp}/cat-{k}"
    args = [a for sid, f in planted.items() for a in ("--plant-fault", f"{sid}={f}")]
    pattern = "^(" + "|".join(re.escape(sid) for sid in planted) + ")$"
    proc = subprocess.run([sb, "run", f"{tmp}/catalogue.yaml", "--out", out, "--timeout", "3",
                           "--filter", pattern] + args, capture_output=True, text=True)
    assert proc.returncode in (0, 1), f"round {k}: exit {proc.returncode}: {proc.stderr[-300:]}"
    for r in json.load(open(f"{out}/results.json"))["records"]:
        if r["strategy_id"] in planted and r["status"] != "unsupported":
            rows_of.setdefault((r["strategy_id"], planted[r["strategy_id"]]), []).append(r)
for sid, fault in faults:
    rows = rows_of.get((sid, fault), [])
    assert rows, f"{sid}={fault}: no row ran"
    for r in rows:
        d = r["details"].get("first_divergence")
        ok = expect[fault](r, d)
        # A fault noticed: the row fails, or a claim of its own is flagged (a leak's held_memory,
        # a solver's optimum), never any other misprediction (a bubble a loaded machine moved).
        failed[fault] = failed.get(fault, False) or r["status"] != "pass" or bool(
            set(r["mispredicted"].split("+")) & {"held_memory", "solver_optimum"})
        total += 1
        bad += not ok
        where = f'{d.get("node")} ({d.get("phase")}) {d.get("tensor")}' if d and d.get("found") \
            else ("nothing off among the traced values" if d else "not captured")
        print(("ok  " if ok else "BAD ") + f'{sid}={fault} on {r["case"]}: {r["status"]}, {where}')
harmless = sorted(f for f, x in failed.items() if not x)
assert not harmless, f"faults no row of the catalogue noticed: {harmless}"
print(f"{total} faulted rows, {bad} not where the fault was planted")
sys.exit(1 if bad else 0)
PY
rc=$?
if [ "$rc" -eq 0 ]; then pass "catalogue: every fault of the capturing families located"; else fail "catalogue: a fault not located where planted"; fi

# 3. Traces (`run --trace DIR`): one more step of every row, traced. Each rank's file is checked
# against the trace-event format (what Perfetto and chrome://tracing read): complete events with
# a name, a start and a duration, properly nested on their thread, counters, process names; its
# collectives are the ones the backend counted for that rank; its memory trace becomes a PyTorch
# snapshot whose peak over the step's start is the row's measured one for that rank (the
# starts may differ: a pipeline rank holds its verified results after the measured step).
cat >"$tmp/trace.yaml" <<'YAML'
suite: traced
defaults: {repetitions: 1, min_time_s: 0.0001, seed: 1234}
cases:
  - name: gpt2-plan
    workload: gpt2
    shape: {batch: 2, seq: 16, d_model: 32, heads: 4, layers: 1, vocab: 64, dropout: 0.1}
    mesh: 2x2
    strategies: ["sharding/auto/(megatron|ilp)"]
  - name: mlp-pipeline
    workload: mlp_chain
    shape: {batch: 16, width: 32, depth: 4, dropout: 0, microbatches: 4}
    mesh: 2
    strategies: ["pipeline/1f1b"]
  - name: mlp-checkpoint
    workload: mlp_chain
    shape: {batch: 16, width: 32, depth: 6, dropout: 0.1}
    mesh: 1
    params: {budget: 0.6}
    strategies: ["checkpointing/rotor"]
YAML
check "run --trace: every row passes and is traced" 0 "total +4 +0 +0 +0" -- \
  "$sb" run "$tmp/trace.yaml" --out "$tmp/traced" --trace "$tmp/traces"
check "traces: trace-event files, collectives as counted, memory as measured" 0 \
  "4 rows, 11 ranks checked" -- \
  python3 - "$tmp/traced/results.json" "$tmp/traces" "$src/reports/memory_snapshot.py" <<'PY'
import json, os, subprocess, sys
from collections import Counter
records = json.load(open(sys.argv[1]))["records"]
root, snap = sys.argv[2], sys.argv[3]
ranks = 0
for r in records:
    level = lambda n: n.replace("%", "%25").replace("+", "%2B").replace("/", "+")
    folder = os.path.join(root, level(r["suite"]), level(r["case"]), level(r["strategy_id"]))
    n = r["world_size"]
    for rank in range(n):
        t = json.load(open(os.path.join(folder, f"rank{rank}.trace.json")))
        assert isinstance(t, dict) and isinstance(t["traceEvents"], list), "not a trace file"
        spans = []
        for e in t["traceEvents"]:
            assert isinstance(e["name"], str) and e["ph"] in ("X", "C", "M"), e
            assert e["pid"] == rank, e
            if e["ph"] == "M":
                assert e["name"] == "process_name" and e["args"]["name"] == f"rank {rank}"
                continue
            assert isinstance(e["ts"], int) and e["ts"] > 0, e
            if e["ph"] == "X":
                assert isinstance(e["dur"], int) and e["dur"] >= 0 and e["tid"] == 0, e
                spans.append((e["ts"], -e["dur"], e))
            else:
                assert isinstance(e["args"]["bytes"], int), e
        # Complete events on one thread nest: each starts after its parent and ends before it.
        spans.sort(key=lambda s: (s[0], s[1]))
        stack = []
        for ts, negdur, e in spans:
            end = ts - negdur
            while stack and stack[-1] <= ts and not (stack[-1] == ts and negdur == 0):
                stack.pop()
            assert not stack or end <= stack[-1], f"{folder} rank {rank}: {e['name']} overlaps"
            stack.append(end)
        cats = Counter(e.get("cat") for e in t["traceEvents"])
        assert cats["step"] == 1 and cats["op"] > 0, cats
        # The collectives, as the backend counted them in the measured step.
        got = Counter(e["name"] for e in t["traceEvents"] if e.get("cat") == "collective")
        got["send_recv"] += got.pop("recv", 0)
        got = +got  # without the zero counts
        counted = next(c["counted"] for c in r["details"]["comm_per_rank"] if c["rank"] == rank)
        assert dict(got) == {k: v["calls"] for k, v in counted.items()}, (folder, rank, got, counted)
        names = {e["name"] for e in t["traceEvents"]}
        if r["strategy_id"].startswith("sharding/auto/"):
            assert cats["node"] > 0 and "h0.attn.q" in names and cats["autograd"] > 0, cats
        if r["strategy_id"].startswith("pipeline/"):
            assert cats["action"] == 2 * 4 and any(x.endswith("F0") for x in names), cats
        if r["strategy_id"].startswith("checkpointing/"):
            assert cats["schedule"] > 0 and "B_0" in names, cats
        # The memory: a PyTorch snapshot of the step, peaking where the row measured.
        out = subprocess.run([sys.executable, snap, os.path.join(folder, f"rank{rank}.memory.txt"),
                              os.path.join(folder, f"rank{rank}.pickle")],
                             capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        peak = int(out.stdout.split(" B at the peak")[0].split(", ")[-1])
        lines = open(os.path.join(folder, f"rank{rank}.memory.txt")).read().splitlines()
        start = int(next(l for l in lines if l.startswith("mem reset at ")).split()[-1])
        d = r["details"]
        measured = d["peak_mem_bytes_per_rank"][rank] - d["step_start_bytes_per_rank"][rank]
        assert peak - start == measured, (folder, rank, peak, start, measured)
        ranks += 1
print(f"{len(records)} rows, {ranks} ranks checked")
PY

# 4. The one-node families (an operator's sharding, a Linear, a redistribution, a reshard, online
# attention, the triangle chunking): every planted fault, the k-th of every strategy in the k-th
# run over the suites that hold them. A row failing its tensors is located at the strategy's one
# node, forward where an output fails and backward where only gradients do, at a failing tensor
# and rank; a row failing on something else (communication, a layout, replicas) has nothing to
# locate. Every fault must fail somewhere and be located there.
check "one-node families: every planted fault located at its node" 0 "faults, every one located" -- \
  python3 - "$sb" "$tmp" "$src" <<'PY'
import json, re, subprocess, sys
sb, tmp, src = sys.argv[1:4]
strategies = json.load(open(f"{tmp}/list.json"))
one_node = ("sharding/op/", "sharding/linear/", "sharding/sharded_tensor/", "sharding/redistribute/",
            "chunking/attention/online", "chunking/triangle/")
faults = {s["id"]: s["planted_faults"] for s in strategies
          if s["id"].startswith(one_node) and s.get("planted_faults")}
def node_of(sid):
    parts = sid.split("/")
    if sid.startswith("sharding/op/"):
        return parts[2]
    if sid.startswith(("sharding/sharded_tensor/reshuffle/", "sharding/sharded_tensor/reshard/")):
        return "reshard"
    return {"linear": "linear", "sharded_tensor": "linear", "redistribute": "redistribute",
            "attention": "attention", "triangle": "triangle"}[parts[1]]
# The suites that hold them, each run on its one-node strategies (the planted ones among them);
# every one-node strategy with a fault runs in one of them (sharding-ops.yaml has a case for each
# operator's strategies), so that no fault goes unplanted.
suites = {"sharding-ops": "^sharding/op/", "smoke": "^sharding/(linear|sharded_tensor|op)/",
          "redistribute": "^sharding/(redistribute|sharded_tensor)/",
          "chunking": "^chunking/(attention/online|triangle/)"}
def run(suite, pattern, out, args):
    return subprocess.run([sb, "run", f"{src}/suites/{suite}.yaml", "--out", out, "--filter",
                           pattern, "--repetitions", "1", "--min-time", "0.0001", "--timeout",
                           "10"] + args, capture_output=True, text=True)
def exactly(ids):  # a --filter of these strategy ids and no other
    return "^(" + "|".join(re.escape(x) for x in ids) + ")$"
# Which strategies each suite runs (a fault may only be planted where its strategy runs).
runs_in = {}
for suite, pattern in suites.items():
    proc = run(suite, pattern, f"{tmp}/one-plain-{suite}", [])
    assert proc.returncode == 0, f"{suite} without faults: exit {proc.returncode}: {proc.stderr[-300:]}"
    rows = json.load(open(f"{tmp}/one-plain-{suite}/results.json"))["records"]
    runs_in[suite] = {r["strategy_id"] for r in rows if r["status"] != "unsupported"}
located, failed, bad = {}, {}, []
for k in range(max(len(f) for f in faults.values())):
    planted = {sid: f[k] for sid, f in faults.items() if len(f) > k}
    for suite, pattern in suites.items():
        here = [sid for sid in planted if sid in runs_in[suite]]
        if not here:
            continue
        # Only the planted strategies' rows are judged, so only they run: in groups whose
        # pattern fits --filter's 1,000 bytes (the redistributions' suite has 1,836 rows, 12 s).
        groups = [[]]
        for sid in here:
            if groups[-1] and len(exactly(groups[-1] + [sid])) > 1000:
                groups.append([])
            groups[-1].append(sid)
        for g, only in enumerate(groups):
            out = f"{tmp}/one-{k}-{suite}-{g}"
            args = [a for sid in only for a in ("--plant-fault", f"{sid}={planted[sid]}")]
            proc = run(suite, exactly(only), out, args)
            assert proc.returncode in (0, 1), f"{suite}, run {k}: exit {proc.returncode}: {proc.stderr[-400:]}"
            for r in json.load(open(f"{out}/results.json"))["records"]:
                sid = r["strategy_id"]
                if sid not in planted or r["status"] == "unsupported":
                    continue
                key = f"{sid}={planted[sid]}"
                failed[key] = failed.get(key, False) or r["status"] != "pass"
                failing = [t for t in r["details"].get("tensors", [])
                           if t.get("mismatches", 0) > 0 or t.get("problem")]
                d = r["details"].get("first_divergence")
                if not failing:
                    ok = d is None
                else:
                    forward = [t for t in failing if not t["tensor"].startswith(("grad", "param/", "state/"))]
                    want = forward or failing
                    ok = (d is not None and d.get("found") and d["node"] == node_of(sid)
                          and d["phase"] == ("forward" if forward else "backward")
                          and d["tensor"] in {t["tensor"] for t in want}
                          and d["rank"] in {t["rank"] for t in want if t["tensor"] == d["tensor"]}
                          and "first divergence: node " + d["node"] in r["message"])
                    located[key] = located.get(key, False) or bool(ok)
                if not ok:
                    bad.append(f"{key} on {r['case']}: {r['status']}, {json.dumps(d)[:200]}")
                located.setdefault(key, False)
# Every fault that ran must fail some row; where it failed a tensor, it was located above.
ran = sorted(failed)
never = [k for k in ran if not failed[k]]
numeric = sum(1 for k in ran if located.get(k))
not_run = sum(len(f) for f in faults.values()) - len(ran)
for b in bad[:20]:
    print("BAD", b)
print(f"{len(ran)} faults run ({numeric} failing tensors, each located; the others failing on "
      f"layouts or communication); {not_run} of strategies these suites do not run; "
      f"never failing: {never[:12]}")
if bad or never or not_run:
    sys.exit(1)
print(f"{len(ran)} faults, every one located")
PY

finish
