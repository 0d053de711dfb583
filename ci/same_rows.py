#!/usr/bin/env python3
"""Whether two runs of the same suites gave the same rows: the same (case, strategy id) keys,
and for each the same status, numerics verdict (mismatch count), communication (bytes, calls,
predicted bytes) and memory (measured and predicted peak). Times are left out: they are not
deterministic. Used to show that a restructuring changed no behaviour; exit 1 on any
difference, listing up to twenty, 0 when the rows are the same.

Usage: same_rows.py BEFORE_DIR AFTER_DIR [--timed-plans REGEX]
  Each DIR holds one results.csv per suite, DIR/SUITE/results.csv (`stratbench run --out`).
  --timed-plans: strategy ids whose plan is chosen from measured times (checkpointing/rotor
  solves over a profiled chain), so that their memory differs between two runs of one build:
  their memory columns are left out.
"""
import re
import csv
import pathlib
import sys

COLUMNS = ("status", "mismatches", "comm_bytes", "comm_calls", "predicted_comm_bytes",
           "peak_mem_bytes", "predicted_mem_bytes", "mispredicted")
MEMORY = ("peak_mem_bytes", "predicted_mem_bytes", "mispredicted")


def load(top):
    rows = {}
    for f in sorted(pathlib.Path(top).glob("*/results.csv")):
        for r in csv.DictReader(open(f, newline="")):
            rows[(f.parent.name, r["case"], r["strategy_id"])] = r
    return rows


def main():
    args = sys.argv[1:]
    timed = None
    if len(args) == 4 and args[2] == "--timed-plans":
        timed = re.compile(args[3])
        args = args[:2]
    if len(args) != 2:
        print("usage: same_rows.py BEFORE_DIR AFTER_DIR [--timed-plans REGEX]", file=sys.stderr)
        return 2
    a, b = load(args[0]), load(args[1])
    if not a:
        print(f"same_rows: no */results.csv under {args[0]}", file=sys.stderr)
        return 2
    bad = [f"only before: {k}" for k in sorted(set(a) - set(b))]
    bad += [f"only after: {k}" for k in sorted(set(b) - set(a))]
    for k in sorted(set(a) & set(b)):
        for col in COLUMNS:
            if col in MEMORY and timed and timed.search(k[2]):
                continue
            if a[k].get(col) != b[k].get(col):
                bad.append(f"{k} {col}: {a[k].get(col)!r} before, {b[k].get(col)!r} after")
    suites = sorted({k[0] for k in a})
    if bad:
        print(f"{len(bad)} differences over {len(a)} rows of {len(suites)} suites:")
        for line in bad[:20]:
            print("  " + line)
        return 1
    left = sum(1 for k in a if timed and timed.search(k[2]))
    print(f"same rows: {len(a)} rows of {len(suites)} suites ({', '.join(suites)}), "
          f"equal in {', '.join(COLUMNS)}"
          + (f" (memory left out on {left} rows of timed plans)" if left else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
