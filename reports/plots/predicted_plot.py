"""Predicted against measured communication bytes and peak memory, every row, with y = x."""
import sys

from common import STATUS_COLOURS, num, plt, read_rows, save


def panel(ax, rows, pred_col, meas_col, what):
    pts = [(num(r[pred_col]), num(r[meas_col]), r["status"]) for r in rows
           if num(r[pred_col]) is not None and num(r[meas_col]) is not None]
    zero = [p for p in pts if p[0] <= 0 or p[1] <= 0]
    pos = [p for p in pts if p[0] > 0 and p[1] > 0]
    for status, colour in STATUS_COLOURS.items():
        sel = [p for p in pos if p[2] == status]
        if sel:
            ax.scatter([p[0] for p in sel], [p[1] for p in sel], s=14, color=colour,
                       label=status, alpha=0.8)
    if pos:
        lo = min(min(p[0] for p in pos), min(p[1] for p in pos)) / 1.5
        hi = max(max(p[0] for p in pos), max(p[1] for p in pos)) * 1.5
        ax.plot([lo, hi], [lo, hi], color="#555", linewidth=1, linestyle="--", label="y = x")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.legend(fontsize=8)
    ax.set_xlabel("predicted " + what + " (bytes)")
    ax.set_ylabel("measured " + what + " (bytes)")
    note = "" if not zero else " (+%d rows at 0 not shown)" % len(zero)
    ax.set_title(what + ": %d rows%s" % (len(pos), note), fontsize=10)


def plot(report_dir, out_dir):
    rows = read_rows(report_dir + "/summary.csv")
    if not rows:
        return []
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.6))
    panel(a, rows, "predicted_comm_bytes", "comm_bytes", "communication")
    panel(b, rows, "predicted_mem_bytes", "peak_mem_bytes", "peak memory")
    fig.suptitle("Predicted vs measured, per (case, strategy), largest rank", fontsize=11)
    return [save(fig, out_dir, "predicted_vs_measured")]


if __name__ == "__main__":
    print("\n".join(plot(sys.argv[1], sys.argv[1] + "/plots")))
