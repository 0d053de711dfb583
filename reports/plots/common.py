"""Shared helpers of the plot scripts: headless matplotlib, CSV rows, number parsing.

The scripts read what `stratbench report` writes (summary.csv, tensors.csv, history.csv) with
the standard csv module, so that Debian's python3-matplotlib is the only dependency.
"""
import csv
import math
import os

import matplotlib

matplotlib.use("Agg")  # headless: no display on CI machines
# Names are text, never mathtext: a case called "$x$" or "a_$b" is drawn as written, not parsed
# (a parse error would cost every plot of the report).
if "text.parse_math" in matplotlib.rcParams:
    matplotlib.rcParams["text.parse_math"] = False
import matplotlib.pyplot as plt  # noqa: E402

STATUS_COLOURS = {
    "pass": "#2e7d32",
    "fail": "#c62828",
    "error": "#6a1b9a",
    "unsupported": "#f9a825",
    "skipped": "#9e9e9e",
}
CURRENT = "#1f77b4"
BASELINE = "#bbbbbb"


def read_rows(path):
    """Rows of a CSV file as dicts; an empty list when the file does not exist."""
    if not os.path.exists(path):
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def num(text):
    """A float, or None for an empty field ("nan" and "inf" are kept as such)."""
    if text is None or text == "":
        return None
    return float(text)


def by_case(rows):
    """Rows grouped by case slug, in first-seen order."""
    groups = {}
    for r in rows:
        groups.setdefault(r["case_slug"], []).append(r)
    return groups


def label(row):
    return row.get("strategy") or row["strategy_id"]


def save(fig, out_dir, name):
    path = os.path.join(out_dir, name + ".png")
    fig.savefig(path, dpi=90, bbox_inches="tight")
    plt.close(fig)
    return path


def bar_height(n):
    return max(2.2, 0.26 * n + 1.3)


def finite(v):
    return v is not None and math.isfinite(v)
