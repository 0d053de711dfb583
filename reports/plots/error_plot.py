"""Numerical error per strategy and tensor against its tolerance, on a log scale.

The y value is err_ratio = max |actual - expected| / (atol + rtol |expected|): 1 is the
tolerance, below passes. Exact zeros sit on a floor line (v), a ratio that is not finite (an
infinite or NaN error, or a bitwise check's mismatch) on a ceiling line above every finite one
(x), so neither disappears from the plot; every finite ratio is drawn at its value (o), however
large.
"""
import math
import sys

from common import by_case, num, plt, read_rows, save

FLOOR, CEIL = 1e-7, 1e4


def plot(report_dir, out_dir):
    files = []
    for slug, rows in by_case(read_rows(report_dir + "/tensors.csv")).items():
        strategies = []
        for r in rows:
            if r["strategy_id"] not in strategies:
                strategies.append(r["strategy_id"])
        names = {r["strategy_id"]: (r.get("strategy") or r["strategy_id"]) for r in rows}
        tensors = []
        for r in rows:
            if r["tensor"] not in tensors:
                tensors.append(r["tensor"])
        fig, ax = plt.subplots(figsize=(max(7, 0.32 * len(strategies) + 3), 4.8))
        width = 0.8 / max(1, len(tensors))
        values = [num(r["err_ratio"]) for r in rows]
        top = max([CEIL / 10] + [v for v in values if v is not None and math.isfinite(v)])
        ceil = 10 ** math.ceil(math.log10(top) + 1)
        for k, t in enumerate(tensors):
            xs, ys, marks = [], [], []
            for r in rows:
                if r["tensor"] != t:
                    continue
                v = num(r["err_ratio"])
                x = strategies.index(r["strategy_id"]) - 0.4 + width * (k + 0.5)
                if v is None or not math.isfinite(v):
                    y, m = ceil, "x"
                elif v < FLOOR:
                    y, m = FLOOR, "v"
                else:
                    y, m = v, "o"
                xs.append(x)
                ys.append(y)
                marks.append(m)
            for m in set(marks):
                sel = [(x, y) for x, y, mm in zip(xs, ys, marks) if mm == m]
                ax.scatter([x for x, _ in sel], [y for _, y in sel], marker=m, s=18,
                           color="C%d" % (k % 10), label=t if m == "o" or "o" not in marks else None)
        ax.axhline(1.0, color="#c62828", linewidth=1.2, label="tolerance")
        ax.axhline(FLOOR, color="#999", linewidth=0.6, linestyle=":")
        ax.set_yscale("log")
        ax.axhline(ceil, color="#999", linewidth=0.6, linestyle=":")
        ax.set_ylim(FLOOR / 3, ceil * 3)
        ax.set_xticks(range(len(strategies)))
        ax.set_xticklabels([names[s] for s in strategies], rotation=75, ha="right", fontsize=7)
        ax.set_ylabel("max |err| / (atol + rtol |ref|)")
        ax.set_title("Error against tolerance: " + rows[0]["suite"] + "/" + rows[0]["case"] +
                     "  (v: exact, x: inf/NaN/mismatch)", fontsize=10)
        handles, labels = ax.get_legend_handles_labels()
        seen = {}
        for h, l in zip(handles, labels):
            if l and l not in seen:
                seen[l] = h
        ax.legend(seen.values(), seen.keys(), fontsize=7, loc="upper right", ncol=2)
        files.append(save(fig, out_dir, "errors_" + slug))
    return files


if __name__ == "__main__":
    print("\n".join(plot(sys.argv[1], sys.argv[1] + "/plots")))
