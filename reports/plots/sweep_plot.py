"""Family sweeps, one figure per swept case (cases named NAME/key=value):

- checkpointing budgets: measured peak memory against the budget, and step time against peak
  memory, one line per solver (dotted: the prediction);
- chunk sizes: activation peak and step time against the chunk size, one line per region;
- chunk-search limits: the limit against the measured activation peak and step time;
- selective checkpointing policies (one case, several rows with a `policy` parameter): each
  policy's step time against its measured peak (the trade-off curve of the workload), its
  recompute flops beside it, and the predicted peak as a hollow marker.
"""
import sys
from collections import defaultdict

from common import num, plt, read_rows, save


def params(row):
    out = {}
    for item in (row.get("params") or "").split(";"):
        if "=" in item:
            k, v = item.split("=", 1)
            out[k] = v
    return out


def swept(row):
    """(base case, key, value) of a swept case, or None."""
    case = row["case"]
    if "/" not in case or "=" not in case.rsplit("/", 1)[1]:
        return None
    base, last = case.rsplit("/", 1)
    key, value = last.split("=", 1)
    try:
        return base, key, float(value)
    except ValueError:
        return None


def slug(suite, base):
    """As the report's caseSlug: a hash of the whole name where a character was replaced or the
    name is long, so that names differing only there get files of their own."""
    raw = suite + "__" + base
    s = "".join(c if (c.isascii() and c.isalnum()) or c in "-_." else "_" for c in raw)
    if s == raw and len(s) <= 150:
        return s
    h = 1469598103934665603
    for c in raw.encode():
        h = ((h ^ c) * 1099511628211) % (1 << 64)
    return s[:150] + "-" + ("%016x" % h)[:10]


def budget_figure(suite, base, lines):
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.6))
    mib = 1024.0 * 1024.0
    for k, (solver, pts) in enumerate(sorted(lines.items())):
        pts.sort()
        colour = "C%d" % (k % 10)
        a.plot([p[0] for p in pts], [p[1] / mib for p in pts], marker="o", color=colour,
               label=solver)
        a.plot([p[0] for p in pts], [p[3] / mib for p in pts], linestyle=":", color=colour)
        by_peak = sorted(pts, key=lambda p: p[1])
        b.plot([p[1] / mib for p in by_peak], [p[2] / 1000.0 for p in by_peak], marker="o",
               color=colour, label=solver)
    a.set_xlabel("budget (fraction of keeping every tape)")
    a.set_ylabel("peak memory of the step (MiB); dotted: predicted")
    a.set_title("Peak memory against budget", fontsize=10)
    a.legend(fontsize=8)
    b.set_xlabel("measured peak memory (MiB)")
    b.set_ylabel("step time, median (ms)")
    b.set_title("Step time against peak memory", fontsize=10)
    fig.suptitle("Checkpointing sweep: %s/%s" % (suite, base), fontsize=11)
    return fig


def chunk_figure(suite, base, key, lines):
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.6))
    mib = 1024.0 * 1024.0
    for k, (name, pts) in enumerate(sorted(lines.items())):
        pts.sort()
        colour = "C%d" % (k % 10)
        xs = [p[0] if key == "chunk" else p[4] / mib for p in pts]
        a.plot(xs, [p[1] / mib for p in pts], marker="o", color=colour, label=name)
        if any(p[3] is not None for p in pts):
            a.plot(xs, [(p[3] or 0) / mib for p in pts], linestyle=":", color=colour)
        b.plot(xs, [p[2] / 1000.0 for p in pts], marker="o", color=colour, label=name)
    if key == "chunk":
        for ax in (a, b):
            ax.set_xscale("log", base=2)
            ax.set_xlabel("chunk size (tokens, rows or columns)")
    else:
        lo = min(min(p[4] for p in pts) for pts in lines.values()) / mib
        hi = max(max(p[4] for p in pts) for pts in lines.values()) / mib
        a.plot([lo, hi], [lo, hi], color="#555", linestyle="--", linewidth=1, label="limit")
        for ax in (a, b):
            ax.set_xlabel("memory limit (MiB)")
    a.set_ylabel("activation peak (MiB); dotted: estimated")
    a.set_title("Activation memory", fontsize=10)
    a.legend(fontsize=8)
    b.set_ylabel("step time, median (ms)")
    b.set_title("Step time", fontsize=10)
    fig.suptitle("Chunking sweep over %s: %s/%s" % (key, suite, base), fontsize=11)
    return fig


def policy_figure(suite, case, pts):
    """pts: (label, peak, time_us, predicted_peak, recompute_flops)."""
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.6))
    mib = 1024.0 * 1024.0
    pts = sorted(pts, key=lambda p: p[1])
    a.plot([p[1] / mib for p in pts], [p[2] / 1000.0 for p in pts], color="#888", linewidth=1)
    for k, (label, peak, time_us, predicted, flops) in enumerate(pts):
        colour = "C%d" % (k % 10)
        a.plot([peak / mib], [time_us / 1000.0], marker="o", color=colour, label=label)
        if predicted is not None:
            a.plot([predicted / mib], [time_us / 1000.0], marker="o", markerfacecolor="none",
                   color=colour)
        b.bar(k, (flops or 0) / 1e6, color=colour)
    a.set_xlabel("measured peak memory of the step (MiB); hollow: predicted")
    a.set_ylabel("step time, median (ms)")
    a.set_title("Step time against peak memory", fontsize=10)
    a.legend(fontsize=8)
    b.set_xticks(range(len(pts)))
    b.set_xticklabels([p[0] for p in pts], rotation=30, ha="right", fontsize=8)
    b.set_ylabel("recompute matmul flops (Mflop)")
    b.set_title("What the memory costs", fontsize=10)
    fig.suptitle("Selective checkpointing: %s/%s" % (suite, case), fontsize=11)
    fig.tight_layout()
    return fig


def plot(report_dir, out_dir):
    budgets = defaultdict(lambda: defaultdict(list))
    policies = defaultdict(list)
    chunks = defaultdict(lambda: defaultdict(list))
    for r in read_rows(report_dir + "/summary.csv"):
        s = swept(r)
        if r["status"] != "pass":
            continue
        p = params(r)
        if "policy" in p and "recompute_flops" in p and (s is None or "/sac=" in r["case"]):
            # A case's policies as its rows, or a case swept over params.sac (FSDP's).
            base = r["case"].rsplit("/", 1)[0] if "/sac=" in r["case"] else r["case"]
            policies[(r["suite"], base)].append(
                (p["policy"], num(r["peak_mem_bytes"]), num(r["time_us_median"]),
                 num(r["predicted_mem_bytes"]), float(p["recompute_flops"]), r["strategy_id"]))
            continue
        if s is None:
            continue
        base, key, value = s
        p = params(r)
        time_us = num(r["time_us_median"])
        if key == "budget" and "budget_bytes" in p:
            budgets[(r["suite"], base)][p.get("solver", r["strategy_id"])].append(
                (value, num(r["peak_mem_bytes"]), time_us, num(r["predicted_mem_bytes"])))
        elif "activation_peak_bytes" in p:
            est = p.get("estimated_activation_peak_bytes")
            est = float(est) if est not in (None, "", "n/a") else None
            limit = float(p.get("max_memory", 0) or 0)
            chunks[(r["suite"], base, key)][r["strategy_id"]].append(
                (value, float(p["activation_peak_bytes"]), time_us, est, limit))
    files = []
    for (suite, base), lines in budgets.items():
        files.append(save(budget_figure(suite, base, lines), out_dir, "sweep_" + slug(suite, base)))
    for (suite, case), pts in policies.items():
        # Several strategies in one case (FSDP's kinds): each point says whose.
        several = len({p[5] for p in pts}) > 1
        pts = [((p[5].rsplit("/", 1)[-1] + " " + p[0]) if several else p[0],) + p[1:5] for p in pts]
        if len(pts) >= 2:
            files.append(save(policy_figure(suite, case, pts), out_dir,
                              "sweep_policies_" + slug(suite, case)))
    for (suite, base, key), lines in chunks.items():
        files.append(save(chunk_figure(suite, base, key, lines), out_dir,
                          "sweep_" + slug(suite, base)))
    return files


if __name__ == "__main__":
    print("\n".join(plot(sys.argv[1], sys.argv[1] + "/plots")))
