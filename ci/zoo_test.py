#!/usr/bin/env python3
"""Every family on models no check was written against (issue 52's table): the zoo of
reference/models/trace_models.py --zoo (torchvision CNNs, nn.TransformerEncoder, nn.MultiheadAttention
with masks, LLaMA as Meta's code writes it, an LSTM and a GRU), traced by this build's Python,
each run through auto-sharding's plans, checkpointing, pipelines, FSDP / ZeRO and context
parallelism, over optimizer steps where the family trains. Then, on each model, a binding
memory limit: `solve shard --max-memory` halfway between the plan of least memory and the
unconstrained plan, the plan written, read back by `sharding/plan`, run, and its measured peak
held under the limit.

Passes when every row passes or is `unsupported` saying why, no plan or checkpointed row is
mispredicted on memory, every limit holds, and the rows listed in KNOWN (each with its cause)
still fail as listed: one that passes now must leave the list. Writes BUILD/zoo/table.md, the
model x family table docs/measurements.md keeps.

Usage: ci/zoo_test.py BUILD_DIR SOURCE_DIR [--only MODEL ...] [--part K/N]

--part K/N runs the K-th of N interleaved shares of the models (ctest runs the zoo in two: whole,
it took 690 s of its 900 on the torch2 leg of CI's 2-core AMD host) and writes table-K-of-N.md.
"""
import argparse
import atexit
import csv
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

# Families, each a case of the model's suite: (column, strategies, mesh, extra case keys).
SGD = {"steps": 2, "optimizer": {"kind": "sgd", "lr": 0.01, "momentum": 0.9}}
FAMILIES = [
    ("plans", "sharding/auto/(ilp|data-parallel|replicated)", 2, {}),
    ("plan over steps", "sharding/auto/ilp", 2, SGD),
    ("checkpointing", "checkpointing/[a-z]+", 1, {}),
    ("pipeline over steps", "pipeline/(gpipe|1f1b)", 2, {"microbatches": 2, **SGD}),
    ("FSDP / ZeRO", "sharding/fsdp/(ddp|zero1|zero3)", 2, SGD),
    ("context parallel", "sharding/cp/.*", 2, {}),
]

# Rows that fail for a cause outside this issue, each with it: (model, strategy regex,
# LibTorch versions: a prefix of the row's torch_version, "" for any) -> cause.
KNOWN = {
    # 2.x's LSTM takes oneDNN's kernel where no gradient is recorded (its GRU does not): a
    # schedule's untaped forward differs from the taped one by an ulp, and checkpointing is
    # judged bitwise.
    ("lstm", r"checkpointing/(full|revolve|sqrt|greedy|rotor|none)", "2."):
        "2.x's LSTM: oneDNN's kernel in an untaped forward (1 ulp)",
    # (Whether it does depends on the CPU: HOST_DEPENDENT.)
    # Over two SGD steps with momentum, batch norm over 16 values per channel amplifies float32
    # rounding into the momentum buffers: a few elements move 4-7x the reference's own rounding
    # of the same tensor (measured against float64, docs/results.md): a rounding event (a ReLU's
    # sign) the float64 shadow does not have there. The plan passes in float64.
    ("shufflenet_v2", r"sharding/auto/ilp", ""):
        "float32 rounding through batch norm over steps, past 4x the reference's own; float64 passes",
    # On 2.x (oneDNN's convolutions, batch norm split by batch): a ReLU's input within rounding
    # of zero flips in the plan and not in the reference, and a gradient term of its own size
    # moves (RegNetY: 0.022 on a weight gradient whose reference is 1.6e-5 from float64). The
    # float64 shadow rounds where the reference does, so it cannot see a flip that only the
    # plan has; float64 passes. LibTorch 1.13 on an AMD EPYC without AVX-512 does the same:
    # RegNetY's replicated plan (no sharding: the graph's operators against the module's own
    # run) first diverges at block4-3's ReLU backward, 0 where the reference has 0.0098 (one
    # element of 7,040), and MNASNet over two SGD steps at a batch-norm bias gradient near
    # zero (6.9e-5 against -1.4e-4) that momentum then carries; both pass in float64.
    ("regnet_y", r"sharding/auto/.*", ""):
        "a ReLU flipped by rounding in the plan only; float64 passes",
    ("mnasnet", r"sharding/auto/ilp", ""):
        "rounding in the plan only (a ReLU's flip, a batch-norm gradient near zero), carried "
        "over steps; float64 passes",
    # Checkpointing is judged bitwise against the module. Two of ConvNeXt's differences are
    # known (2026-12-03, bisected on its parts): a stage input's gradient taken through a leaf
    # is laid out as the leaf (AccumulateGrad) where the module hands a permuted one on, so a
    # Linear over [N, H, W, C] after a stage cut sums its bias gradient in another order
    # (1 ulp); and at::linear adds the bias after the product for such an input, where the
    # importer's addmm adds it inside. (A third, the importer's contiguous copy before the
    # downsampling convolution, the chain now runs as the module does.) Taking the gradient
    # as computed made every row bitwise but the chain model's B_i terms then miss a copy the
    # profiler and the executor make differently (ViT 8,704 bytes under): not kept.
    ("convnext", r"checkpointing/[a-z]+", ""):
        "a stage input's gradient laid out as its leaf, a Linear's bias added inside the product (1 ulp)",
}


def slug(column):
    return re.sub(r"[^a-z0-9]+", "-", column.lower()).strip("-")


def sh(args, **kw):
    return subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)


def trace_python(build):
    for line in open(os.path.join(build, "CMakeCache.txt")):
        if line.startswith("SB_TRACE_PYTHON:"):
            return line.split("=", 1)[1].strip()
    return "/usr/bin/python3"


def inputs_yaml(meta):
    return json.dumps([s["shape"] if s["dtype"] == "float32" else s for s in meta["inputs"]])


def suite_text(model, pt, meta):
    ins = inputs_yaml(meta)
    lines = ["suite: zoo-" + model, "description: the zoo's " + model + " through every family",
             "defaults: {dtype: float32, inputs: random, seed: 1234, repetitions: 1, "
             "min_time_s: 0.0001}", "cases:"]
    for column, strategies, mesh, extra in FAMILIES:
        shape = {"file": pt, "inputs": json.loads(ins)}
        shape.update({k: v for k, v in extra.items() if k == "microbatches"})
        lines.append(f"  - name: {model}-{slug(column)}")
        lines.append("    workload: torchscript")
        lines.append(f"    shape: {json.dumps(shape)}")
        lines.append(f"    mesh: {mesh}")
        lines.append(f"    strategies: [\"{strategies}\"]")
        for k, v in extra.items():
            if k != "microbatches":
                lines.append(f"    {k}: {json.dumps(v)}")
    return "\n".join(lines) + "\n"


# KNOWN entries whose failure depends on the CPU's vector units (oneDNN picks its kernel by
# them): on a host where every row passes the entry is not stale, and the run says so. Seen:
# the LSTM rows fail by an ulp on an AMD EPYC with AVX-VNNI and pass on one without it. The
# ShuffleNet row's rounding event is one element's: another CPU's kernels round elsewhere.
HOST_DEPENDENT = {("lstm", r"checkpointing/(full|revolve|sqrt|greedy|rotor|none)", "2."),
                  ("shufflenet_v2", r"sharding/auto/ilp", ""),
                  ("regnet_y", r"sharding/auto/.*", ""),
                  ("mnasnet", r"sharding/auto/ilp", "")}

# Per KNOWN entry: [rows it matched, of which failed]. One that matched and never failed is
# stale: the test fails until it leaves the list.
KNOWN_SEEN = {k: [0, 0] for k in KNOWN}


def known(model, strategy, version, failed=None):
    for key, cause in KNOWN.items():
        m, pattern, versions = key
        if m == model and re.fullmatch(pattern, strategy) and version.startswith(versions):
            if failed is not None:
                KNOWN_SEEN[key][0] += 1
                KNOWN_SEEN[key][1] += failed
            return cause
    return None


def binding_limit(sb, pt, meta, out):
    """Solves under a limit halfway between the least-memory plan and the unconstrained one,
    runs the plan and returns (ok, text)."""
    ins = inputs_yaml(meta)
    base = [sb, "solve", "shard", "--model", pt, "--mesh", "2"]
    for s in json.loads(ins):
        base += ["--input", json.dumps(s)]
    free = sh(base + ["--out", out + ".free.json"])
    if free.returncode != 0:
        return False, "the unconstrained plan: " + free.stdout.strip()[-300:]
    top = json.load(open(out + ".free.json"))["predicted"]["peak_bytes_per_rank"]
    least = sh(base + ["--max-memory", "1"])
    m = re.search(r"plan of least memory needs (\d+) bytes", least.stdout)
    if least.returncode != 1 or not m:
        return False, "--max-memory 1: expected exit 1 naming the least plan: " + least.stdout[-300:]
    low = int(m.group(1))
    # Halfway between; where the rows' least-memory plan is no smaller by the replay than the
    # fastest, 3% under the fastest: a plan that fits, or exit 1 naming what the least needs,
    # which must then be over the limit.
    limit = (low + top) // 2 if low < top else top * 97 // 100
    solved = sh(base + ["--max-memory", str(limit), "--out", out + ".json"])
    m = re.search(r"plan of least memory needs (\d+) bytes", solved.stdout)
    if solved.returncode == 1 and m and int(m.group(1)) > limit and low >= top:
        return True, (f"limit {limit} B (least {low}, fastest {top}): no plan, exit 1 "
                      f"(the least needs {m.group(1)} B)")
    if solved.returncode != 0:
        return False, f"--max-memory {limit} (least {low}, fastest {top}): {solved.stdout[-300:]}"
    plan = json.load(open(out + ".json"))
    predicted = plan["predicted"]["peak_bytes_per_rank"]
    suite = out + ".yaml"
    with open(suite, "w") as f:
        f.write(f"suite: limit\ndescription: a plan solved under a binding limit, run\n"
                f"defaults: {{dtype: float32, inputs: random, seed: 1234, repetitions: 1, "
                f"min_time_s: 0.0001}}\ncases:\n  - name: limit\n    workload: torchscript\n"
                f"    shape: {{file: {pt}, inputs: {ins}}}\n    mesh: 2\n"
                f"    strategies: [\"sharding/plan\"]\n    params: {{plan: {out}.json}}\n")
    run = sh([sb, "run", suite, "--out", out + ".run"])
    rows = list(csv.DictReader(open(out + ".run/results.csv"))) if run.returncode in (0, 1) else []
    if len(rows) != 1 or rows[0]["status"] != "pass":
        return False, f"the plan under {limit} B did not pass: {run.stdout[-300:]}"
    peak = int(rows[0]["peak_mem_bytes"])
    ok = peak <= limit and predicted <= limit
    return ok, (f"limit {limit} B (least {low}, fastest {top}): predicted {predicted}, "
                f"measured {peak}" + ("" if ok else " OVER THE LIMIT"))


def serve_core(build):
    """As ci/test_lib.sh's serve_core: the commands run as forks of one stratbench-core that has
    loaded LibTorch (cli/serve.h); it ends with this process. SB_NO_CORE_SERVER=1 turns it off."""
    if os.environ.get("SB_NO_CORE_SERVER") == "1":
        return
    where = tempfile.mkdtemp(prefix="sb-zoo-")  # short: a socket's path has at most 107 bytes
    atexit.register(shutil.rmtree, where, True)
    sock = os.path.join(where, "core.sock")
    log = open(os.path.join(where, "server.log"), "w+")
    server = subprocess.Popen([os.path.join(build, "stratbench-core"), "__serve", sock,
                               str(os.getpid())], stdout=subprocess.DEVNULL, stderr=log)
    for _ in range(1200):  # loading LibTorch on a busy machine: up to a minute
        if os.path.exists(sock):
            os.environ["STRATBENCH_CORE_SERVER"] = sock
            return
        if server.poll() is not None:
            break
        time.sleep(0.05)
    log.seek(0)
    print("note: no core server (" + log.read().strip() + "): every command execs")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("source")
    ap.add_argument("--only", nargs="+")
    ap.add_argument("--part", default="1/1", help="K/N: the K-th of N interleaved shares")
    a = ap.parse_args()
    m = re.fullmatch(r"([1-9][0-9]*)/([1-9][0-9]*)", a.part)
    if not m or int(m.group(1)) > int(m.group(2)):
        ap.error(f"--part '{a.part}': expected K/N with 1 <= K <= N")
    k, n = int(m.group(1)), int(m.group(2))
    sb = os.path.join(a.build, "stratbench")
    zoo = os.path.join(a.build, "zoo")
    os.makedirs(zoo, exist_ok=True)
    serve_core(a.build)
    tracer = [trace_python(a.build), os.path.join(a.source, "reference/models/trace_models.py"),
              "--out", zoo]
    listed = subprocess.run(tracer[:2] + ["--list", "--zoo"], stdout=subprocess.PIPE, text=True)
    models = a.only or [l.split()[0] for l in listed.stdout.splitlines()
                        if l and not l.startswith("trace_models.py:")]
    models = models[k - 1::n]
    if not models:
        print(f"FAIL --part {a.part}: no model in this share")
        return 1
    traced = sh(tracer + ["--zoo", "--only"] + models)
    if traced.returncode != 0:
        print(traced.stdout)
        print("FAIL tracing the zoo")
        return 1
    failures, table = [], []
    start = time.time()
    for model in models:
        pt = os.path.join(zoo, model + ".pt")
        meta = json.load(open(os.path.join(zoo, model + ".json")))
        suite = os.path.join(zoo, model + ".yaml")
        with open(suite, "w") as f:
            f.write(suite_text(model, pt, meta))
        t0 = time.time()
        run = sh([sb, "run", suite, "--out", os.path.join(zoo, model)])
        cells = {}
        if run.returncode == 2:
            # Refused before anything ran (the importer, naming the node): every family's cell.
            why = run.stdout.strip().splitlines()[-1]
            why = why.split(".pt: ", 1)[-1]
            for i, (column, _, _, _) in enumerate(FAMILIES):
                cells[column] = "refused, exit 2: " + why if i == 0 else "refused (as left)"
            table.append((model, cells, "", time.time() - t0))
            print(f"ok   {model}: refused, exit 2: {why[:160]}")
            continue
        rows = list(csv.DictReader(open(os.path.join(zoo, model, "results.csv"))))
        for column, _, _, _ in FAMILIES:
            mine = [r for r in rows if r["case"] == f"{model}-{slug(column)}"]
            if not mine:
                failures.append(f"{model} {column}: no row (a family vanished)")
                cells[column] = "NO ROW"
                continue
            words = []
            for r in mine:
                sid, status = r["strategy_id"], r["status"]
                # The peak's claim and the one after every operation (a leak), by name.
                off = set(r["mispredicted"].split("+")) & {"memory", "held_memory"}
                cause = known(model, sid, r["torch_version"],
                              status not in ("pass", "unsupported") or bool(off))
                short = sid.split("/")[-1]
                if status == "unsupported":
                    if not r["message"]:
                        failures.append(f"{model} {sid}: unsupported without a reason")
                    words.append(f"{short}: unsupported ({r['message'][:120]})")
                elif status == "pass" and off:
                    failures.append(f"{model} {sid}: {'+'.join(sorted(off))} mispredicted: "
                                    f"{r['message'][:160]}")
                    words.append(f"{short}: MEMORY {r['peak_mem_bytes']} vs {r['predicted_mem_bytes']}"
                                 if "memory" in off else f"{short}: HELD MEMORY over the schedule's")
                elif status == "pass":
                    words.append(f"{short}: pass")
                elif cause:
                    words.append(f"{short}: fail, known: {cause}")
                else:
                    failures.append(f"{model} {sid}: {status}: {r['message'][:200]}")
                    words.append(f"{short}: {status.upper()}")
            # Strategies with the same outcome share one entry: "none, full, sqrt: pass".
            grouped = {}
            for w in words:
                name, outcome = w.split(": ", 1)
                grouped.setdefault(outcome, []).append(name)
            cells[column] = "; ".join(", ".join(names) + ": " + outcome
                                      for outcome, names in grouped.items())
        ok, limit = binding_limit(sb, pt, meta, os.path.join(zoo, model + ".limit"))
        cause = known(model, "binding limit", rows[0]["torch_version"] if rows else "", not ok)
        if not ok and not cause:
            failures.append(f"{model} binding limit: {limit}")
        elif not ok:
            limit += f" (known: {cause})"
        table.append((model, cells, limit, time.time() - t0))
        print(f"{'ok  ' if ok or cause else 'FAIL'} {model}: {len(rows)} rows in {time.time() - t0:.1f} s; "
              f"{limit}")
    table_md = os.path.join(zoo, "table.md" if n == 1 else f"table-{k}-of-{n}.md")
    with open(table_md, "w") as f:
        f.write("| model | " + " | ".join(c for c, _, _, _ in FAMILIES) + " | binding limit |\n")
        f.write("|---" * (len(FAMILIES) + 2) + "|\n")
        for model, cells, limit, _ in table:
            f.write(f"| {model} | " + " | ".join(cells.get(c, "") for c, _, _, _ in FAMILIES) +
                    f" | {limit} |\n")
    for key, (matched, failed) in KNOWN_SEEN.items():
        if matched and not failed and key in HOST_DEPENDENT:
            print(f"note {key[0]} {key[1]}: every row it names passes on this host ({KNOWN[key]}:"
                  f" depends on the CPU)")
        elif matched and not failed:
            failures.append(f"{key[0]} {key[1]}: every row it names passes now; remove it from "
                            f"KNOWN ({KNOWN[key]})")
    for x in failures:
        print("FAIL " + x)
    print(f"{len(table)} models, {len(failures)} failures, {time.time() - start:.0f} s; "
          f"table: {table_md}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
