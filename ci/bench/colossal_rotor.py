#!/usr/bin/env python3
"""ColossalAI's C rotor, run as its CheckpointSolverRotor runs it, on a stratbench chain file.

A measurement aid for ci/bench/rotor_bench.py, not part of the harness: ColossalAI's source is
not in this repository. Build its extension once from a checkout of ColossalAI (v0.3.0:
colossalai/auto_parallel/checkpoint/ckpt_solver_rotor.c) with the flags Python builds
extensions with, then solve:

  ci/bench/colossal_rotor.py build SOURCE.c DIR
  ci/bench/colossal_rotor.py solve DIR CHAIN.json BUDGET SLOTS [--table-only]

`solve` does what CheckpointSolverRotor.__init__ and .solve do: the slot unit is
budget // slots, every size is rounded up to whole units (Chain.discretize_all), the table is
computed for `slots` slots (compute_table, which also converts the table into Python lists and
dicts, as ColossalAI's callers receive it), and the schedule is read back from slots - x[0].
It prints one JSON line: the table's time, the operations, and the seconds compute_table took.
--table-only runs a copy of the source that stops where the table is complete (before the
conversion into Python objects) and prints the table's value: the C loop on its own.
ColossalAI's model has no step terms (output_kept, loss_grad_kept): they are ignored.

Exit codes: 0 solved; 1 no schedule fits; 2 bad usage or input.
"""
import importlib.util
import json
import math
import os
import subprocess
import sys
import sysconfig
import time


# Where the table is complete and before compute_table converts it: a copy of the source made
# here (DIR/table) returns the table's value there instead, to time the C loop on its own.
TABLE_DONE = "  free(ftime);\n  free(btime);\n"
TABLE_ONLY = """  { /* stratbench's measurement: the table's value, no conversion */
    double value = mmax - x[0] >= 0 ? COST_TABLE(mmax - x[0], 0, chainLength) : INFINITY;
    free(costTable);
    free(backPtr);
    return PyFloat_FromDouble(value);
  }
"""


def build(source, out_dir):
    with open(source) as f:
        text = f.read()
    if text.count(TABLE_DONE) != 1:
        raise SystemExit(f"colossal_rotor: {source}: not ColossalAI v0.3.0's ckpt_solver_rotor.c "
                         "(the end of its table loop was not found once)")
    cc = (sysconfig.get_config_var("CC") or "cc").split()
    flags = (sysconfig.get_config_var("CFLAGS") or "-O3").split()
    flags += (sysconfig.get_config_var("CCSHARED") or "-fPIC").split()
    for sub, code in (("", text), ("table", text.replace(TABLE_DONE, TABLE_ONLY + TABLE_DONE))):
        d = os.path.join(out_dir, sub)
        os.makedirs(d, exist_ok=True)
        src = os.path.join(d, "ckpt_solver_rotor.c")
        with open(src, "w") as f:
            f.write(code)
        out = os.path.join(d, "rotorc" + sysconfig.get_config_var("EXT_SUFFIX"))
        cmd = cc + flags + ["-shared", "-I", sysconfig.get_paths()["include"], src, "-o", out]
        print(" ".join(cmd), file=sys.stderr)
        subprocess.run(cmd, check=True)


class Chain:
    """The attributes compute_table reads, and len() as the stage count."""

    def __init__(self, d):
        self.ftime = [float(v) for v in d["ftime"]]
        self.btime = [float(v) for v in d["btime"]]
        self.x, self.xbar = list(d["x"]), list(d["xbar"])
        self.ftmp, self.btmp = list(d["ftmp"]), list(d["btmp"])

    def __len__(self):
        return len(self.ftime)

    def discretize_all(self, unit):
        up = lambda v: math.ceil(v / unit)
        for k in ("x", "xbar", "ftmp", "btmp"):
            setattr(self, k, [up(v) for v in getattr(self, k)])


def backtrack(chain, lhs, rhs, budget, cost, back, ops):
    # CheckpointSolverRotor._backtrack, written out iteratively over an explicit stack.
    stack = [("solve", lhs, rhs, budget)]
    while stack:
        item = stack.pop()
        if item[0] == "op":
            ops.append(item[1])
            continue
        _, lhs, rhs, budget = item
        if budget <= 0 or cost[budget][lhs][rhs] == float("inf"):
            raise ValueError(f"no schedule for {lhs}..{rhs} in {budget} slots")
        if lhs == rhs:
            ops.extend(["L"] if lhs == len(chain) else [f"Fe_{lhs}", f"B_{lhs}"])
            continue
        ptr = back[budget][lhs][rhs]
        if ptr[0]:
            stack += [("op", f"B_{lhs}"), ("solve", lhs + 1, rhs, budget - chain.xbar[lhs + 1]),
                      ("op", f"Fe_{lhs}")]
        else:
            leaf = ptr[1]
            stack += [("solve", lhs, leaf - 1, budget),
                      ("solve", leaf, rhs, budget - chain.x[leaf])]
            stack += [("op", f"Fn_{k}") for k in range(leaf - 1, lhs, -1)] + [("op", f"CF_{lhs}")]


def solve(module_dir, chain_path, budget, slots, table_only):
    if table_only:
        module_dir = os.path.join(module_dir, "table")
    spec = importlib.util.spec_from_file_location(
        "rotorc", os.path.join(module_dir, "rotorc" + sysconfig.get_config_var("EXT_SUFFIX")))
    rotorc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rotorc)
    with open(chain_path) as f:
        chain = Chain(json.load(f))
    unit = budget // slots
    if unit <= 0:
        raise ValueError(f"budget {budget} is under one byte a slot at {slots} slots")
    chain.discretize_all(unit)
    start = time.perf_counter()
    table = rotorc.compute_table(chain, slots)
    seconds = time.perf_counter() - start
    if table_only:
        print(json.dumps({"table_time": table, "compute_table_seconds": seconds}))
        return 0 if table != float("inf") else 1
    cost, back = table
    ops = []
    try:
        backtrack(chain, 0, len(chain), slots - chain.x[0], cost, back, ops)
    except ValueError as e:
        print(json.dumps({"error": str(e), "compute_table_seconds": seconds}))
        return 1
    print(json.dumps({"table_time": cost[slots - chain.x[0]][0][len(chain)],
                      "schedule": ops, "compute_table_seconds": seconds}))
    return 0


def main(argv):
    if len(argv) == 4 and argv[1] == "build":
        build(argv[2], argv[3])
        return 0
    table_only = "--table-only" in argv
    argv = [a for a in argv if a != "--table-only"]
    if len(argv) == 6 and argv[1] == "solve":
        try:
            budget, slots = float(argv[4]), int(argv[5])
        except ValueError:
            print(f"colossal_rotor: BUDGET and SLOTS must be numbers, got {argv[4]!r} {argv[5]!r}",
                  file=sys.stderr)
            return 2
        sys.setrecursionlimit(10000)
        return solve(argv[2], argv[3], budget, slots, table_only)
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
