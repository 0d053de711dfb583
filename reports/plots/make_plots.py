"""Draws every plot of a report directory into DIR/plots/*.png.

Usage: make_plots.py DIR, where DIR holds what `stratbench report` wrote (summary.csv,
tensors.csv, history.csv). `stratbench report` runs it; it can be run again by hand.
Exit 1 when any plot failed (the others are still drawn).
"""
import os
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import error_plot  # noqa: E402
import history_plot  # noqa: E402
import memory_plot  # noqa: E402
import pipeline_timeline_plot  # noqa: E402
import predicted_plot  # noqa: E402
import sweep_plot  # noqa: E402
import time_plot  # noqa: E402

PLOTS = [time_plot, memory_plot, predicted_plot, error_plot, history_plot, sweep_plot,
         pipeline_timeline_plot]


def main(argv):
    if len(argv) != 2 or not os.path.isdir(argv[1]):
        sys.stderr.write("usage: make_plots.py REPORT_DIR\n")
        return 2
    report_dir = argv[1]
    out_dir = os.path.join(report_dir, "plots")
    os.makedirs(out_dir, exist_ok=True)
    failed = 0
    for module in PLOTS:
        try:
            module.plot(report_dir, out_dir)
        except ValueError as e:  # the data it was given, named (a hand-edited results.json)
            failed += 1
            sys.stderr.write("make_plots: %s skipped: %s\n" % (module.__name__, e))
        except Exception:  # one broken plot must not cost the others
            failed += 1
            sys.stderr.write("make_plots: %s failed:\n%s" % (module.__name__,
                                                             traceback.format_exc()))
    # Said to the report (reports/plots.cpp): the scripts ran, whatever they drew. An interpreter
    # that exits 0 without running them (STRATBENCH_PYTHON=/bin/true) writes no such file.
    with open(os.path.join(out_dir, ".make_plots.done"), "w") as f:
        f.write("%d failed\n" % failed)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
