#!/usr/bin/env python3
"""The rows of every suite on two LibTorch legs, side by side (docs/measurements.md).

    ci/legs_table.py OUT_A OUT_B [--names 1.13 2.13]

OUT_A and OUT_B each hold one folder per suite (SUITE/results.csv), as ci/legs_run.sh writes
them. Prints a Markdown table: per suite and leg, the rows, how many pass, fail or error, are
unsupported or skipped, how many peaks the row's own model predicted to the byte (of the rows
with a prediction), and how many rows `run` flagged mispredicted; then every row that is not a
pass or is mispredicted on either leg, with its message.
"""
import argparse
import csv
import os
import sys


def read(folder):
    suites = {}
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name, "results.csv")
        if os.path.isfile(path):
            with open(path, newline="") as f:
                suites[name] = list(csv.DictReader(f))
    return suites


def counts(rows):
    c = {"rows": len(rows), "pass": 0, "fail": 0, "unsup": 0, "pred": 0, "exact": 0, "mis": 0,
         "mis_time": 0}
    for r in rows:
        s = r["status"]
        c["pass"] += s == "pass"
        c["fail"] += s in ("fail", "error")
        c["unsup"] += s in ("unsupported", "skipped")
        if r["predicted_mem_bytes"] and r["peak_mem_bytes"]:
            c["pred"] += 1
            c["exact"] += r["predicted_mem_bytes"] == r["peak_mem_bytes"]
        # A memory (or communication) prediction judged to the byte against one of time (a
        # pipeline's bubble, a step's time), which a loaded machine moves.
        kinds = set(filter(None, (r.get("mispredicted") or "").split("+")))
        c["mis"] += bool(kinds - {"bubble", "time"})
        c["mis_time"] += bool(kinds & {"bubble", "time"})
    return c


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--names", nargs=2, default=["A", "B"])
    args = p.parse_args()
    legs = [read(args.a), read(args.b)]
    suites = sorted(set(legs[0]) | set(legs[1]))
    if not suites:
        sys.exit(f"legs_table.py: no SUITE/results.csv under {args.a} or {args.b}")
    na, nb = args.names
    print(f"| suite | rows | pass {na} / {nb} | fail or error | unsupported or skipped | "
          f"peak = prediction, to the byte | mispredicted memory or communication | "
          f"mispredicted time (bubble) |")
    print("|---|---|---|---|---|---|---|---|")
    total = [dict.fromkeys(counts([]), 0) for _ in legs]
    for s in suites:
        cs = [counts(leg.get(s, [])) for leg in legs]
        for t, c in zip(total, cs):
            for k in t:
                t[k] += c[k]
        pair = lambda k: f"{cs[0][k]} / {cs[1][k]}"
        exact = f"{cs[0]['exact']} of {cs[0]['pred']} / {cs[1]['exact']} of {cs[1]['pred']}"
        print(f"| {s} | {pair('rows')} | {pair('pass')} | {pair('fail')} | {pair('unsup')} | "
              f"{exact} | {pair('mis')} | {pair('mis_time')} |")
    pair = lambda k: f"{total[0][k]} / {total[1][k]}"
    print(f"| **all** | {pair('rows')} | {pair('pass')} | {pair('fail')} | {pair('unsup')} | "
          f"{total[0]['exact']} of {total[0]['pred']} / {total[1]['exact']} of {total[1]['pred']} | "
          f"{pair('mis')} | {pair('mis_time')} |")
    odd = []
    for s in suites:
        for name, leg in zip(args.names, legs):
            for r in leg.get(s, []):
                if r["status"] in ("fail", "error") or r.get("mispredicted"):
                    odd.append(f"- {name} {s}/{r['case']} `{r['strategy_id']}` ({r['backend']}): "
                               f"{r['status']}, mispredicted '{r.get('mispredicted', '')}', "
                               f"peak {r['peak_mem_bytes']} predicted {r['predicted_mem_bytes']}: "
                               f"{r['message'][:300]}")
    if odd:
        print()
        print("\n".join(odd))


if __name__ == "__main__":
    main()
