"""Nightly history: statuses per run, and median time per strategy over runs for each case."""
import sys

from common import STATUS_COLOURS, by_case, num, plt, read_rows, save

# A series moved when its newest run is this far off the median of its earlier runs.
MOVED = 0.25


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
        series = {}
        for r in case_rows:
            if num(r["time_us_median"]) is not None:
                series.setdefault(r["strategy_id"], []).append(
                    (int(r["run_index"]), num(r["time_us_median"]), r["status"]))
        if not series:
            continue  # no run timed this case: no plot rather than an empty one
        # The series that moved: the newest run MOVED off the median of the earlier ones, or a
        # run that failed. They are drawn in colour and named, the largest change first (at most
        # 10); the rest in grey, unnamed.
        changes = []
        for s, pts in series.items():
            pts.sort()
            earlier = sorted(p[1] for p in pts[:-1])
            change = 0.0
            if earlier:
                mid = earlier[len(earlier) // 2]
                change = abs(pts[-1][1] - mid) / mid if mid > 0 else 0.0
            bad = any(p[2] in ("fail", "error") for p in pts)
            if change > MOVED or bad:
                changes.append((-(float("inf") if bad else change), s))
        moved = [s for _, s in sorted(changes)[:10]]
        fig, ax = plt.subplots(figsize=(max(6, 0.5 * len(runs) + 3), 4))
        for s, pts in series.items():
            if s in moved:
                continue
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", markersize=2,
                    linewidth=0.8, color="#bbbbbb")
        for k, s in enumerate(moved):
            pts = series[s]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", markersize=3,
                    linewidth=1.2, color="C%d" % (k % 10), label=s, zorder=2)
            bad = [p for p in pts if p[2] in ("fail", "error")]
            if bad:
                ax.scatter([p[0] for p in bad], [p[1] for p in bad], marker="x", s=50,
                           color="#c62828", zorder=3)
        ax.set_xticks(runs)
        ax.set_xticklabels([run_label[i] for i in runs], rotation=45, ha="right", fontsize=7)
        ax.set_ylabel("median step time (us)")
        note = ("%d of %d moved > %d%% or failed (named); grey: the rest" %
                (len(moved), len(series), round(MOVED * 100)) if moved else
                "no series moved > %d%% or failed (grey)" % round(MOVED * 100))
        ax.set_title("Median time over runs: " + case_rows[0]["suite"] + "/" +
                     case_rows[0]["case"] + "\n" + note + "  (x: fail or error)", fontsize=9)
        if moved:
            ax.legend(fontsize=6)
        files.append(save(fig, out_dir, "history_" + slug))
    return files


if __name__ == "__main__":
    print("\n".join(plot(sys.argv[1], sys.argv[1] + "/plots")))
