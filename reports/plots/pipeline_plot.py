"""A pipeline schedule's timeline: one row per rank, each action a bar coloured by its type
(F, B, I, W), idle time as the gaps, from the JSON of `stratbench solve pipeline`.

    python3 reports/plots/pipeline_plot.py RUN.json OUT.png
"""
import json
import sys

from common import plt

COLOURS = {"F": "#1f77b4", "B": "#2e7d32", "I": "#f9a825", "W": "#6a1b9a"}


def action_type(name):
    """'12F3' -> 'F'."""
    return next(c for c in name if c.isalpha())


def draw(ax, d, title=""):
    """One run (`solve pipeline`'s JSON, or a pipeline row's measured or predicted run) on `ax`:
    a row per rank, each action a bar coloured by its type, idle time as the gaps."""
    ranks = d["per_rank"]
    for r in ranks:
        for a in r["actions"]:
            t = action_type(a["action"])
            ax.barh(r["rank"], a["end_us"] - a["start_us"], left=a["start_us"], height=0.8,
                    color=COLOURS[t], edgecolor="white", linewidth=0.3)
            if len(ranks) * len(r["actions"]) <= 400:  # labels while they are legible
                ax.text((a["start_us"] + a["end_us"]) / 2, r["rank"], a["action"],
                        ha="center", va="center", fontsize=6, color="white")
    ax.set_yticks([r["rank"] for r in ranks])
    ax.set_yticklabels([f"rank {r['rank']} ({100 * r['bubble_fraction']:.0f}% idle)"
                        for r in ranks])
    ax.invert_yaxis()
    ax.set_title((title + ": " if title else "") +
                 f"{d['schedule']}: {d['stages']} stages, {d['microbatches']} micro-batches, "
                 f"step {d['step_time_us']:g}, bubble {100 * d['bubble_fraction']:.1f}%",
                 fontsize=9)
    used = sorted({action_type(a["action"]) for r in ranks for a in r["actions"]})
    ax.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=COLOURS[t]) for t in used],
              labels=used, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)


def main(run, out):
    with open(run) as f:
        d = json.load(f)
    if "deadlock" in d:
        sys.exit(f"{run}: the schedule does not finish ({d['deadlock']}): nothing to plot")
    fig, ax = plt.subplots(figsize=(11, 0.5 * len(d["per_rank"]) + 1.6))
    draw(ax, d)
    ax.set_xlabel("time (us, or the profile's unit)")
    fig.tight_layout()
    fig.savefig(out, dpi=120)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
