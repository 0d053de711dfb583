#!/usr/bin/env python3
"""Compares a threads run's results.csv with a c10d run's, row by row: the same rows and
statuses, the same communication, and identical errors on exact-input rows (both 0: bitwise
equal to the reference). Exit 1 on any difference, listing up to ten.

Usage: compare_results.py THREADS_CSV C10D_CSV [BACKEND]
"""
import csv
import sys


def load(path):
    return {(r["case"], r["strategy_id"]): r for r in csv.DictReader(open(path))}


def main():
    a, b = load(sys.argv[1]), load(sys.argv[2])
    backend = sys.argv[3] if len(sys.argv) > 3 else "gloo"
    bad = []
    if set(a) != set(b):
        bad.append(f"rows differ: {len(a)} vs {len(b)}")
    for k in sorted(set(a) & set(b)):
        for col in ("status", "mismatches", "comm_bytes", "comm_calls", "predicted_comm_bytes"):
            if a[k][col] != b[k][col]:
                bad.append(f"{k} {col}: {a[k][col]} vs {b[k][col]}")
        if a[k]["inputs"] == "exact" and (a[k]["max_abs_err"] != b[k]["max_abs_err"]
                                          or a[k]["max_abs_err"] not in ("0", "")):
            bad.append(f"{k} exact inputs: max_abs_err {a[k]['max_abs_err']} vs "
                       f"{b[k]['max_abs_err']}")
        if b[k]["backend"] != backend or b[k]["world_size"] != a[k]["world_size"]:
            bad.append(f"{k}: backend {b[k]['backend']}, world {b[k]['world_size']}")
    exact = sum(1 for k in b if b[k]["inputs"] == "exact")
    print(f"{len(b)} rows compared, {exact} on exact inputs")
    for line in bad[:10]:
        print("DIFF", line)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
