"""The report's pipeline timelines: for every pipeline row (REPORT_DIR/pipeline/NAME.json,
which `stratbench report` writes from the row's details.executor.pipeline), each rank's actions
in the measured step above the dry run's on the same time axis: plots/pipeline_NAME.png."""
import glob
import json
import os
import sys

from common import plt
import pipeline_plot


def plot(report_dir, out_dir):
    skipped = []
    for path in sorted(glob.glob(os.path.join(report_dir, "pipeline", "*.json"))):
        if path.endswith(".trace.json"):
            continue
        name = os.path.basename(path)[:-len(".json")]
        with open(path) as f:
            runs = json.load(f)
        sides = [(t, runs[k]) for k, t in (("measured", "measured"), ("predicted", "dry run"))
                 if isinstance(runs.get(k), dict) and "step_time_us" in runs[k]]
        if not sides:
            continue
        try:
            for _, run in sides:
                pipeline_plot.check_run(run)
        except ValueError as e:  # this case's timeline is not drawn; the others are
            skipped.append("%s: %s" % (name, e))
            continue
        ranks = min(max(len(r["per_rank"]) for _, r in sides), pipeline_plot.MAX_RANKS_DRAWN)
        fig, axes = plt.subplots(len(sides), 1, sharex=True, squeeze=False,
                                 figsize=(11, len(sides) * (0.45 * ranks + 1.0) + 0.6))
        for ax, (title, run) in zip(axes[:, 0], sides):
            pipeline_plot.draw(ax, run, title)
        axes[-1, 0].set_xlabel("time in the step (us)")
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, "pipeline_" + name + ".png"), dpi=100)
        plt.close(fig)
    if skipped:
        raise ValueError("timelines not drawn: " + "; ".join(skipped))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: pipeline_timeline_plot.py REPORT_DIR")
    os.makedirs(os.path.join(sys.argv[1], "plots"), exist_ok=True)
    plot(sys.argv[1], os.path.join(sys.argv[1], "plots"))
