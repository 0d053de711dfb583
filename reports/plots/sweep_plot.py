"""Budget sweeps of the checkpointing family: for every case swept over `budget` (cases named
NAME/budget=B), measured peak memory against the budget and step time against peak memory,
one line per solver.
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


def plot(report_dir, out_dir):
    groups = defaultdict(lambda: defaultdict(list))  # (suite, base case) -> solver -> points
    for r in read_rows(report_dir + "/summary.csv"):
        p = params(r)
        if r["status"] != "pass" or "budget_bytes" not in p or "/budget=" not in r["case"]:
            continue
        base = r["case"].split("/budget=")[0]
        groups[(r["suite"], base)][p.get("solver", r["strategy_id"])].append(
            (float(r["case"].split("/budget=")[1]), num(r["peak_mem_bytes"]),
             num(r["time_us_median"]), num(r["predicted_mem_bytes"])))
    files = []
    for (suite, base), solvers in groups.items():
        fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.6))
        mib = 1024.0 * 1024.0
        for k, (solver, pts) in enumerate(sorted(solvers.items())):
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
        slug = "".join(c if c.isalnum() or c in "-_." else "_" for c in suite + "__" + base)
        files.append(save(fig, out_dir, "sweep_" + slug))
    return files


if __name__ == "__main__":
    print("\n".join(plot(sys.argv[1], sys.argv[1] + "/plots")))
