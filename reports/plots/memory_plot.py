"""Peak memory per strategy for each case (largest rank), the baseline and the prediction."""
import sys

from common import BASELINE, CURRENT, bar_height, by_case, label, num, plt, read_rows, save


def plot(report_dir, out_dir):
    files = []
    for slug, rows in by_case(read_rows(report_dir + "/summary.csv")).items():
        rows = [r for r in rows if num(r["peak_mem_bytes"]) is not None
                or num(r["baseline_peak_mem_bytes"]) is not None]
        if not rows:
            continue
        has_base = any(num(r["baseline_peak_mem_bytes"]) is not None for r in rows)
        fig, ax = plt.subplots(figsize=(9, bar_height(len(rows))))
        ys = list(range(len(rows)))
        h = 0.4 if has_base else 0.7
        kib = 1024.0
        cur = [(num(r["peak_mem_bytes"]) or 0) / kib for r in rows]
        ax.barh([y - (h / 2 if has_base else 0) for y in ys], cur, height=h, color=CURRENT,
                label="measured peak")
        if has_base:
            base = [(num(r["baseline_peak_mem_bytes"]) or 0) / kib for r in rows]
            ax.barh([y + h / 2 for y in ys], base, height=h, color=BASELINE, label="baseline")
        pred = [(y, num(r["predicted_mem_bytes"]) / kib) for y, r in zip(ys, rows)
                if num(r["predicted_mem_bytes"]) is not None]
        if pred:
            ax.scatter([p for _, p in pred], [y for y, _ in pred], marker="|", s=120,
                       color="#d62728", label="predicted", zorder=3)
        ax.set_yticks(ys)
        ax.set_yticklabels([label(r) for r in rows], fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("peak memory of the step, largest rank (KiB)")
        ax.set_title("Peak memory per strategy: " + rows[0]["suite"] + "/" + rows[0]["case"],
                     fontsize=10)
        ax.legend(fontsize=8, loc="lower right")
        files.append(save(fig, out_dir, "memory_" + slug))
    return files


if __name__ == "__main__":
    print("\n".join(plot(sys.argv[1], sys.argv[1] + "/plots")))
