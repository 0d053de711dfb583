"""A pipeline schedule's timeline: one row per rank, each action a bar coloured by its type
(F, B, I, W), idle time as the gaps, from the JSON of `stratbench solve pipeline`.

    python3 reports/plots/pipeline_plot.py RUN.json OUT.png
"""
import json
import sys

from common import plt

COLOURS = {"F": "#1f77b4", "B": "#2e7d32", "I": "#f9a825", "W": "#6a1b9a"}


def action_type(name):
    """'12F3' -> 'F'. ValueError, naming it, for anything that is not STAGE LETTER MICROBATCH
    with a letter of COLOURS (a hand-edited results.json: the report draws, not tracebacks)."""
    letters = [c for c in name if c.isalpha()] if isinstance(name, str) else []
    if (len(letters) != 1 or letters[0] not in COLOURS or not name[0].isdigit()
            or not name[-1].isdigit()):
        raise ValueError("pipeline action %r is not STAGE, one of %s, MICROBATCH ('12F3')"
                         % (name, "".join(COLOURS)))
    return letters[0]


def check_run(d):
    """The keys draw() reads, with their types: ValueError naming the first that is wrong."""
    def need(obj, key, kinds, where):
        if not isinstance(obj, dict) or key not in obj or not isinstance(obj[key], kinds) \
                or isinstance(obj[key], bool):
            raise ValueError("pipeline run: %s%s missing or of the wrong type" % (where, key))
    number = (int, float)
    for key, kinds in (("schedule", str), ("stages", int), ("microbatches", int),
                       ("step_time_us", number), ("bubble_fraction", number), ("per_rank", list)):
        need(d, key, kinds, "")
    for r in d["per_rank"]:
        for key, kinds in (("rank", int), ("bubble_fraction", number), ("actions", list)):
            need(r, key, kinds, "per_rank[].")
        for a in r["actions"]:
            for key, kinds in (("action", str), ("start_us", number), ("end_us", number)):
                need(a, key, kinds, "per_rank[].actions[].")
            action_type(a["action"])


def draw(ax, d, title=""):
    """One run (`solve pipeline`'s JSON, or a pipeline row's measured or predicted run) on `ax`:
    a row per rank, each action a bar coloured by its type, idle time as the gaps."""
    check_run(d)
    ranks = d["per_rank"]
    total = sum(len(r["actions"]) for r in ranks)
    for r in ranks:
        # One collection of bars per rank and action type (broken_barh), not an artist per
        # action: a timeline of 200,000 actions drew in minutes one bar at a time.
        spans = {}
        for a in r["actions"]:
            spans.setdefault(action_type(a["action"]), []).append(
                (a["start_us"], a["end_us"] - a["start_us"]))
        for t, xs in spans.items():
            ax.broken_barh(xs, (r["rank"] - 0.4, 0.8), facecolors=COLOURS[t],
                           edgecolor="white", linewidth=0.3)
        if total <= 400:  # labels while they are legible
            for a in r["actions"]:
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
