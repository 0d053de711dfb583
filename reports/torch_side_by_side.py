#!/usr/bin/env python3
"""PyTorch's own strategy beside stratbench's executor of the same plan, from one run's records.

Every torch/* row whose twin (stratbench's executor of the same plan: its DDP, ZeRO-3, HSDP,
checkpointing; the record's details.executor.twin) ran in the same case becomes one line:
both rows' statuses and error ratios (worst error over tolerance), and the ratios torch / twin
of the median step time, the peak bytes per rank over what was live at the step's start (the
step's own), and the bytes moved; then whether PyTorch's collectives matched what the twin
predicts for its own plan (the same calls and bytes of every kind). Both rows come from the same
run, so the ratios are measured side by side (docs/measurements.md quotes them).

Usage: reports/torch_side_by_side.py RESULTS.json [--out TABLE.md]; exit 2 on a file that is not
a results file, naming it.
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from out_file import (install_shown_output, input_problem, replace_file,  # noqa: E402
                      result_path_problem, shown)


def md(text):
    """Text as Markdown shows it, never as markup (report.md's rule: a case named `<img ...>`
    or `[x](javascript:...)` is shown, not run), and with what a terminal acts on escaped."""
    out = []
    for c in shown(text):
        out.append(" " if c in "\r\n" else ("\\" + c if c in "\\`*_[]<>()#!|~&" else c))
    return "".join(out)


def step_bytes(r):
    """The step's own peak: the most over what was live at its start, on the worst rank."""
    d = r.get("details", {})
    peaks = d.get("peak_mem_bytes_per_rank") or [r.get("peak_mem_bytes") or 0]
    starts = d.get("step_start_bytes_per_rank") or [0] * len(peaks)
    return max(p - s for p, s in zip(peaks, starts))


def ratio(a, b):
    return f"{a / b:.2f}" if a and b else "-"


def comm_matched(r):
    ranks = r.get("details", {}).get("comm_per_rank", [])
    if not ranks:
        return "-"
    return "yes" if all(x.get("matches_prediction") for x in ranks) else "no"


def table(records):
    by_case = {}
    for r in records:
        by_case.setdefault((r["suite"], r["case"]), {})[r["strategy_id"]] = r
    lines = ["| case | PyTorch's | status, err/tol | stratbench's twin | status, err/tol | "
             "time ratio | step peak ratio | bytes ratio | collectives as the twin predicts |",
             "|---|---|---|---|---|---|---|---|---|"]
    for (suite, case), rows in sorted(by_case.items()):
        for sid, r in sorted(rows.items()):
            if not sid.startswith("torch/"):
                continue
            twin_id = r.get("details", {}).get("executor", {}).get("twin", "")
            twin = rows.get(twin_id)
            if not twin:
                continue

            def status(x):
                e = x.get("err_ratio")
                return f"{x['status']}, {e:.3g}" if isinstance(e, (int, float)) else x["status"]
            lines.append(
                f"| {md(case)} | {md(sid)} | {md(status(r))} | {md(twin_id)} | {md(status(twin))} | "
                f"{ratio(r.get('time_us_median'), twin.get('time_us_median'))} | "
                f"{ratio(step_bytes(r), step_bytes(twin))} | "
                f"{ratio(r.get('comm_bytes'), twin.get('comm_bytes'))} | {comm_matched(r)} |")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", help="a results.json written by stratbench run")
    ap.add_argument("--out", help="write the table here (default: stdout)")
    args = ap.parse_args()
    install_shown_output()
    why = input_problem(args.results)
    if why:
        print(f"torch_side_by_side.py: {args.results}: {why}", file=sys.stderr)
        return 2
    if args.out is not None:
        if not args.out:
            print("torch_side_by_side.py: --out is empty (give a file's path, or leave --out out "
                  "for stdout)", file=sys.stderr)
            return 2
        why = result_path_problem(args.out, [("the results", args.results)])
        if why:
            print(f"torch_side_by_side.py: --out {shown(args.out)}: {why}", file=sys.stderr)
            return 2
    try:
        with open(args.results) as f:
            records = json.load(f)["records"]
        # The fields the table reads, each of its type (a record of another shape was a
        # KeyError or a TypeError traceback).
        if not isinstance(records, list):
            raise TypeError("'records' is not a list")
        for i, r in enumerate(records):
            if not isinstance(r, dict) or not all(
                    isinstance(r.get(k), str) for k in ("suite", "case", "strategy_id", "status")):
                raise TypeError(f"records[{i}] lacks a text suite, case, strategy_id or status")
            if not isinstance(r.get("details", {}), dict):
                raise TypeError(f"records[{i}].details is not a mapping")
        text = table(records)
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError,
            OverflowError, ZeroDivisionError) as e:
        print(f"torch_side_by_side.py: {shown(args.results)}: not a stratbench results.json "
              f"({shown(e)})", file=sys.stderr)
        return 2
    if args.out:
        try:
            replace_file(args.out, shown(text).encode())
        except OSError as e:
            print(f"torch_side_by_side.py: --out {shown(args.out)}: {e.strerror}", file=sys.stderr)
            return 2
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
