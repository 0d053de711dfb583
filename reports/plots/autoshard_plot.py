"""Auto-sharding plans: predicted against measured step time and peak memory, per case and
algorithm, from a results.csv of suites/autoshard.yaml (or a run like it).

    python3 reports/plots/autoshard_plot.py RESULTS.csv OUT.png
"""
import sys

from common import num, plt, read_rows

MARKERS = {"ilp": "o", "megatron": "s", "data-parallel": "^", "replicated": "D", "plan": "x"}


def main(results, out):
    rows = [r for r in read_rows(results)
            if r["strategy_id"].startswith(("sharding/auto/", "sharding/plan"))
            and r["status"] == "pass"]
    if not rows:
        sys.exit("no passing auto-sharding rows in " + results)
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.6))
    for panel, pred, meas, unit, scale in ((a, "predicted_time_us", "time_us_median", "ms", 1e-3),
                                           (b, "predicted_mem_bytes", "peak_mem_bytes", "MB", 1e-6)):
        lo, hi = float("inf"), 0.0
        for r in rows:
            algo = r["strategy_id"].split("/")[-1]
            p, m = num(r[pred]), num(r[meas])
            if p is None or m is None:
                continue
            err = num(r["time_us_stddev"]) if meas == "time_us_median" else None
            panel.errorbar(p * scale, m * scale, yerr=None if err is None else err * scale,
                           marker=MARKERS.get(algo, "o"), linestyle="none", capsize=2,
                           label=algo + " " + r["case"])
            lo, hi = min(lo, p * scale, m * scale), max(hi, p * scale, m * scale)
        panel.plot([lo / 1.3, hi * 1.3], [lo / 1.3, hi * 1.3], "--", color="#555", linewidth=1)
        panel.set_xscale("log")
        panel.set_yscale("log")
        panel.set_xlabel("predicted (" + unit + ")")
        panel.set_ylabel("measured (" + unit + ")")
        panel.set_title(("step time, median and stddev" if unit == "ms" else "peak memory, largest rank"),
                        fontsize=10)
    a.legend(fontsize=6, loc="upper left")
    fig.suptitle("Auto-sharding plans: predicted vs measured (" + rows[0]["backend"] + ", " +
                 rows[0]["world_size"] + " ranks)", fontsize=11)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
