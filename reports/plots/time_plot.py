"""Time per strategy for each case: the median over repetitions with min-max bars (the fastest
and the slowest repetition; never below 0), the baseline beside it."""
import sys

from common import BASELINE, CURRENT, bar_height, by_case, label, num, plt, read_rows, save


def spread(rows, prefix=""):
    """Per row, the distance from the median down to the fastest repetition and up to the
    slowest ([lower..., upper...] as xerr takes it); 0 where a row has no repetitions' range."""
    lower, upper = [], []
    for r in rows:
        med = num(r[prefix + "time_us_median"])
        lo, hi = num(r.get(prefix + "time_us_min")), num(r.get(prefix + "time_us_max"))
        if med is None or lo is None or hi is None:
            lower.append(0)
            upper.append(0)
            continue
        lower.append(max(0.0, med - max(lo, 0.0)))
        upper.append(max(0.0, hi - med))
    return [lower, upper]


def plot(report_dir, out_dir):
    files = []
    for slug, rows in by_case(read_rows(report_dir + "/summary.csv")).items():
        rows = [r for r in rows if num(r["time_us_median"]) is not None
                or num(r["baseline_time_us_median"]) is not None]
        if not rows:
            continue
        has_base = any(num(r["baseline_time_us_median"]) is not None for r in rows)
        fig, ax = plt.subplots(figsize=(9, bar_height(len(rows))))
        ys = range(len(rows))
        h = 0.4 if has_base else 0.7
        cur = [num(r["time_us_median"]) or 0 for r in rows]
        err = spread(rows)
        ax.barh([y - (h / 2 if has_base else 0) for y in ys], cur, height=h, xerr=err,
                color=CURRENT, label="current", capsize=2)
        if has_base:
            base = [num(r["baseline_time_us_median"]) or 0 for r in rows]
            berr = spread(rows, "baseline_")
            ax.barh([y + h / 2 for y in ys], base, height=h, xerr=berr, color=BASELINE,
                    label="baseline", capsize=2)
        for y, r in zip(ys, rows):
            if r["verdict"] == "regressed" and r["time_verdict"] == "regressed":
                ax.annotate("slower", (cur[y], y), xytext=(4, -3), textcoords="offset points",
                            color="#c62828", fontsize=8)
        ax.set_yticks(list(ys))
        ax.set_yticklabels([label(r) for r in rows], fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("step time, median over repetitions (us); bars: fastest to slowest")
        ax.set_xlim(left=0)
        ax.set_title("Time per strategy: " + rows[0]["suite"] + "/" + rows[0]["case"], fontsize=10)
        ax.legend(fontsize=8, loc="lower right")
        files.append(save(fig, out_dir, "time_" + slug))
    return files


if __name__ == "__main__":
    print("\n".join(plot(sys.argv[1], sys.argv[1] + "/plots")))
