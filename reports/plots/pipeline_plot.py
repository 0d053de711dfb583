"""A pipeline schedule's timeline: one row per rank, each action a bar coloured by its type
(F, B, I, W), idle time as the gaps, from the JSON of `stratbench solve pipeline`.

    python3 reports/plots/pipeline_plot.py RUN.json OUT.png
"""
import json
import math
import re
import sys

from common import plt

COLOURS = {"F": "#1f77b4", "B": "#2e7d32", "I": "#f9a825", "W": "#6a1b9a"}
# A row per rank while a figure can hold them: 5,000 ranks made a 450,000-pixel-tall figure
# (minutes, then matplotlib refused it). The rest are said in the title.
MAX_RANKS_DRAWN = 64
ACTION = re.compile(r"([0-9]{1,9})([%s])([0-9]{1,9})" % "".join(COLOURS))


def action_type(name):
    """'12F3' -> 'F'. ValueError, naming it, for anything that is not STAGE LETTER MICROBATCH
    with a letter of COLOURS (a hand-edited results.json: the report draws, not tracebacks)."""
    m = ACTION.fullmatch(name) if isinstance(name, str) else None
    if not m:
        raise ValueError("pipeline action %r is not STAGE, one of %s, MICROBATCH ('12F3')"
                         % (name, "".join(COLOURS)))
    return m[2]


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
    # What a run writes, not only its types: a timeline no run writes (an action ending before it
    # starts, a rank twice, micro-batch 99999999 of 4) was drawn as if it were one.
    def fraction(x):  # 1 - busy / step: a rank busy the whole step may round to -1e-16
        return finite(x) and -1e-9 <= x <= 1 + 1e-9

    def finite(x):  # an integer of 400 digits is no float (isfinite raises OverflowError)
        try:
            return math.isfinite(x)
        except OverflowError:
            return False

    def wrong(what):
        raise ValueError("pipeline run: " + what + ": no run writes that")
    if d["stages"] < 1 or d["microbatches"] < 1:
        wrong(f"{d['stages']} stages, {d['microbatches']} micro-batches")
    if not (finite(d["step_time_us"]) and d["step_time_us"] >= 0):
        wrong(f"step_time_us {d['step_time_us']}")
    if not fraction(d["bubble_fraction"]):
        wrong(f"bubble_fraction {d['bubble_fraction']}")
    ranks = d.get("ranks", len(d["per_rank"]))
    if not d["per_rank"] or isinstance(ranks, bool) or not isinstance(ranks, int) \
            or len(d["per_rank"]) != ranks:
        wrong(f"{len(d['per_rank'])} per_rank entries for {ranks} ranks")
    seen = set()
    for r in d["per_rank"]:
        for key, kinds in (("rank", int), ("bubble_fraction", number), ("actions", list)):
            need(r, key, kinds, "per_rank[].")
        if not 0 <= r["rank"] < ranks or r["rank"] in seen:
            wrong(f"rank {r['rank']} (ranks 0 to {ranks - 1}, each once)")
        seen.add(r["rank"])
        if not fraction(r["bubble_fraction"]):
            wrong(f"rank {r['rank']}'s bubble_fraction {r['bubble_fraction']}")
        for a in r["actions"]:
            for key, kinds in (("action", str), ("start_us", number), ("end_us", number)):
                need(a, key, kinds, "per_rank[].actions[].")
            t = action_type(a["action"])
            stage, _, micro = ACTION.fullmatch(a["action"]).groups()
            if int(stage) >= d["stages"] or int(micro) >= d["microbatches"]:
                wrong(f"rank {r['rank']}'s action {a['action']} (stages 0 to {d['stages'] - 1}, "
                      f"micro-batches 0 to {d['microbatches'] - 1})")
            if not (finite(a["start_us"]) and finite(a["end_us"])
                    and 0 <= a["start_us"] <= a["end_us"]):
                wrong(f"rank {r['rank']}'s action {a['action']} from {a['start_us']} to "
                      f"{a['end_us']} us")


def draw(ax, d, title=""):
    """One run (`solve pipeline`'s JSON, or a pipeline row's measured or predicted run) on `ax`:
    a row per rank, each action a bar coloured by its type, idle time as the gaps."""
    check_run(d)
    ranks = d["per_rank"][:MAX_RANKS_DRAWN]
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
    left = len(d["per_rank"]) - len(ranks)
    ax.set_title((title + ": " if title else "") +
                 f"{d['schedule']}: {d['stages']} stages, {d['microbatches']} micro-batches, "
                 f"step {d['step_time_us']:g}, bubble {100 * d['bubble_fraction']:.1f}%" +
                 (f" (the first {len(ranks)} ranks drawn, {left} more)" if left else ""),
                 fontsize=9)
    used = sorted({action_type(a["action"]) for r in ranks for a in r["actions"]})
    ax.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=COLOURS[t]) for t in used],
              labels=used, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)


def main(run, out):
    with open(run) as f:
        d = json.load(f)
    if "deadlock" in d:
        sys.exit(f"{run}: the schedule does not finish ({d['deadlock']}): nothing to plot")
    check_run(d)
    fig, ax = plt.subplots(figsize=(11, 0.5 * min(len(d["per_rank"]), MAX_RANKS_DRAWN) + 1.6))
    draw(ax, d)
    ax.set_xlabel("time (us, or the profile's unit)")
    fig.tight_layout()
    fig.savefig(out, dpi=120)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
