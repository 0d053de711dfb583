#!/usr/bin/env python3
"""How often would a noise band rule cry wolf? Runs of ONE build (folders with results.csv),
randomly split, many times, into N calibration runs and a baseline, a night and a rerun; for
each rule, the same-build slowdowns past the band per night, alone and after the rerun (which
must be past it too), and how many rows could show a 20% slowdown at all.

    reports/noise_study.py RUN_DIR... [--trials 40]

The rule `stratbench noise` applies is "shrink" with factor 3 (docs/reports.md); the table in
docs/measurements.md ("The nightly loop") is this script's output on twelve smoke-suite runs.
"""
import argparse
import csv
import math
import os
import random
import statistics as st
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from out_file import input_problem, install_shown_output, shown  # noqa: E402


class RunError(Exception):
    pass


def load(d):
    """A run's passing rows' median times; RunError naming the run where it is no run's folder
    (a FIFO or /dev/zero as its results.csv blocked the reader or ran out of memory)."""
    path = d.rstrip("/") + "/results.csv"
    why = input_problem(path)
    if why:
        raise RunError(f"{path}: {why}")
    out = {}
    try:
        with open(path, newline="", encoding="utf-8") as f:
            for n, r in enumerate(csv.DictReader(f), start=2):
                if r.get("status") is None or r.get("time_us_median") is None:
                    raise RunError(f"{path}:{n}: no column 'status' or 'time_us_median': not the "
                                   "results.csv a run writes")
                if r["status"] == "pass" and r["time_us_median"]:
                    t = float(r["time_us_median"])
                    if not (math.isfinite(t) and t > 0):  # no run writes such a time
                        raise RunError(f"{path}:{n}: time_us_median {shown(r['time_us_median'])} "
                                       "is not a positive number")
                    out[(r["case"], r["strategy_id"], r["backend"])] = t
    except (OSError, ValueError, csv.Error, KeyError, UnicodeDecodeError) as e:
        raise RunError(f"{path}: {e}")
    return out


def study(runs, n_cal, factor, pool, trials, floor=0.10):
    keys = set.intersection(*[set(r) for r in runs])
    rng = random.Random(1)
    alone = confirmed = 0.0
    below = []
    for _ in range(trials):
        idx = list(range(len(runs)))
        rng.shuffle(idx)
        cal = [runs[i] for i in idx[:n_cal]]
        base, night, rerun = (runs[i] for i in idx[n_cal:n_cal + 3])
        mid = {k: st.median([c[k] for c in cal]) for k in keys}
        spread = {k: (max(c[k] for c in cal) - min(c[k] for c in cal)) / mid[k] for k in keys}
        decades = {}
        for k in keys:
            decades.setdefault(math.floor(math.log10(mid[k])), []).append(spread[k])
        scale = {d: (st.median(v) if len(v) >= 3 else 0.0) for d, v in decades.items()}
        band = {}
        for k in keys:
            s = spread[k]
            sc = scale[math.floor(math.log10(mid[k]))]
            if pool == "max":
                s = max(s, sc)
            elif pool == "shrink":
                s = math.sqrt(((n_cal - 1) * s * s + sc * sc) / n_cal)
            band[k] = max(floor, factor * s)
        below.append(sum(b < 0.2 for b in band.values()))
        for k in keys:
            if night[k] / base[k] - 1 > band[k]:
                alone += 1
                confirmed += rerun[k] / base[k] - 1 > band[k]
    return alone / trials, confirmed / trials, st.mean(below), len(keys)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+")
    def trials(text):
        try:
            n = int(text)
        except ValueError:
            n = 0
        if not 1 <= n <= 100000:
            raise argparse.ArgumentTypeError(f"expected a count of trials from 1 to 100000, got {text!r}")
        return n
    ap.add_argument("--trials", type=trials, default=40)
    a = ap.parse_args()
    install_shown_output()
    try:
        runs = [load(d) for d in a.runs]
    except RunError as e:
        print(f"noise_study.py: {e}", file=sys.stderr)
        return 2
    print("| calibration runs | band | past the band per night | after the rerun | rows under 20% |")
    print("|---|---|---|---|---|")
    for n_cal in (3, 5):
        if n_cal + 3 > len(runs):
            continue
        for pool, factor in (("own", 1.5), ("own", 2), ("max", 2), ("max", 3), ("shrink", 2),
                             ("shrink", 3)):
            al, co, be, rows = study(runs, n_cal, factor, pool, a.trials)
            rule = {"own": f"{factor} x own spread",
                    "max": f"{factor} x max(own, its decade's median spread)",
                    "shrink": f"{factor} x own pooled with its decade's (as one run)"}[pool]
            print(f"| {n_cal} | {rule} | {al:.2f} | {co:.3f} | {be:.0f} / {rows} |")


if __name__ == "__main__":
    sys.exit(main())
