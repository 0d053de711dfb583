"""Nightly history: statuses per run, and median time per strategy over runs for each case."""
import sys

from common import STATUS_COLOURS, by_case, num, plt, read_rows, save


def plot(report_dir, out_dir):
    rows = read_rows(report_dir + "/history.csv")
    if not rows:
        return []
    runs = sorted({int(r["run_index"]) for r in rows})
    run_label = {}
    for r in rows:
        run_label[int(r["run_index"])] = r["run_dir"]
    files = []

    fig, ax = plt.subplots(figsize=(max(6, 0.5 * len(runs) + 3), 3.6))
    bottom = [0] * len(runs)
    for status, colour in STATUS_COLOURS.items():
        counts = [sum(1 for r in rows if int(r["run_index"]) == i and r["status"] == status)
                  for i in runs]
        if any(counts):
            ax.bar(runs, counts, bottom=bottom, color=colour, label=status)
            bottom = [b + c for b, c in zip(bottom, counts)]
    ax.set_xticks(runs)
    ax.set_xticklabels([run_label[i] for i in runs], rotation=45, ha="right", fontsize=7)
    ax.set_ylabel("rows")
    ax.set_title("Status of every row, per run", fontsize=10)
    ax.legend(fontsize=8)
    files.append(save(fig, out_dir, "history_status"))

    for slug, case_rows in by_case(rows).items():
        fig, ax = plt.subplots(figsize=(max(6, 0.5 * len(runs) + 3), 4))
        strategies = []
        for r in case_rows:
            if r["strategy_id"] not in strategies:
                strategies.append(r["strategy_id"])
        for k, s in enumerate(strategies):
            pts = sorted((int(r["run_index"]), num(r["time_us_median"]), r["status"])
                         for r in case_rows if r["strategy_id"] == s
                         and num(r["time_us_median"]) is not None)
            if not pts:
                continue
            colour = "C%d" % (k % 10)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", markersize=3,
                    linewidth=1, color=colour, label=s if len(strategies) <= 12 else None)
            bad = [p for p in pts if p[2] in ("fail", "error")]
            if bad:
                ax.scatter([p[0] for p in bad], [p[1] for p in bad], marker="x", s=50,
                           color="#c62828", zorder=3)
        ax.set_xticks(runs)
        ax.set_xticklabels([run_label[i] for i in runs], rotation=45, ha="right", fontsize=7)
        ax.set_ylabel("median step time (us)")
        ax.set_title("Median time over runs: " + case_rows[0]["suite"] + "/" +
                     case_rows[0]["case"] + "  (x: fail or error)", fontsize=10)
        if len(strategies) <= 12:
            ax.legend(fontsize=6)
        files.append(save(fig, out_dir, "history_" + slug))
    return files


if __name__ == "__main__":
    print("\n".join(plot(sys.argv[1], sys.argv[1] + "/plots")))
