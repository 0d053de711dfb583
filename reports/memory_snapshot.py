#!/usr/bin/env python3
"""A measured step's memory as a PyTorch memory snapshot, from a SB_MEMORY_TRACE trace.

    SB_MEMORY_TRACE=0 stratbench run suite.yaml --filter ID 2>trace.txt
    reports/memory_snapshot.py trace.txt snapshot.pickle [--step N]

The snapshot is what torch.cuda.memory._snapshot() pickles, so that PyTorch's own tools open
it: a dict of `segments` (what is live at the step's peak: each allocation its own segment, as
the CPU allocator has no pool, one active block whose frames are the operators that allocated
it, innermost first) and `device_traces` (every allocation and free of the step, in order, with
its address, size and operators). `torch.cuda._memory_viz` reads it: `stats` and `segments`
take `snapshot["segments"]` (PyTorch 1.13's functions take that list), and memory_viz's trace
view (PyTorch 2.1 and later) the whole dict.

What is live before the step (parameters, inputs, what the executor holds) is in `segments` as
blocks without frames ("allocated before the step"). The bytes of `segments` add up to the
tracker's peak of the step (checked here: exit 3 otherwise, as memory_trace.py does).

Exit codes: 0 written, 2 bad arguments or an unreadable file, 3 a step whose lines do not add
up to the tracker's peak, or no such step.
"""
import argparse
import os
import pickle
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import memory_trace  # noqa: E402  (the trace's parser)
from out_file import install_shown_output, replace_file, result_path_problem, shown  # noqa: E402


def frames(context):
    """'aten::mm < MmBackward0 < ...' -> PyTorch's frame records, innermost first."""
    if not context:
        return []
    return [{"filename": "stratbench", "line": 0, "name": part}
            for part in context.split(" < ") if part != "..."]


def address(ptr):
    try:
        return int(ptr, 16)
    except ValueError:
        return 0


def snapshot(lines, step):
    """The snapshot of measured step `step` (a memory_trace.Step)."""
    live = step.live_at_peak or {}
    segments = []
    for ptr, (nbytes, context, _line, index) in sorted(live.items(), key=lambda kv: kv[1][2]):
        fr = frames(context) if index == step.index else []
        block = {"address": address(ptr), "size": nbytes, "requested_size": nbytes,
                 "state": "active_allocated", "frames": fr,
                 "history": [{"addr": address(ptr), "real_size": nbytes, "frames": fr}]}
        if index != step.index:
            block["frames"] = block["history"][0]["frames"] = [
                {"filename": "stratbench", "line": 0, "name": "allocated before the step"}]
        segments.append({"device": 0, "address": address(ptr), "total_size": nbytes,
                         "allocated_size": nbytes, "active_size": nbytes,
                         "requested_size": nbytes, "stream": 0, "segment_type": "large",
                         "blocks": [block]})
    # The step's allocations and frees, in order (a free's size from its allocation).
    trace, sizes, inside = [], {}, False
    for n, raw in enumerate(lines, 1):
        line = raw.rstrip("\n")
        if n == step.line:
            inside = True
            continue
        m = memory_trace.ALLOC.match(line)
        if m:
            sizes[m[3]] = int(m[1])
            if inside and int(m[1]):
                trace.append({"action": "alloc", "addr": address(m[3]), "size": int(m[1]),
                              "stream": 0, "frames": frames(m[4] or "")})
            continue
        m = memory_trace.FREE.match(line)
        if m and inside:
            size = int(m[1]) or sizes.get(m[3], 0)
            trace.append({"action": "free_requested", "addr": address(m[3]), "size": size,
                          "stream": 0, "frames": []})
            trace.append({"action": "free_completed", "addr": address(m[3]), "size": size,
                          "stream": 0, "frames": []})
            continue
        if inside and memory_trace.END.match(line):
            break
    return {"segments": segments, "device_traces": [trace]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace", help="the stderr of a run with SB_MEMORY_TRACE=<rank> set")
    ap.add_argument("out", help="the snapshot to write (a pickle)")
    ap.add_argument("--step", type=memory_trace.step_number(1), default=1,
                    help="the measured step, from 1 (default 1)")
    a = ap.parse_args()
    install_shown_output()
    why = memory_trace.not_a_file(a.trace)
    if why:
        print(f"memory_snapshot.py: {shown(a.trace)}: {why}", file=sys.stderr)
        return 2
    # The snapshot replaces no file it reads, no run's results or lock, and writes through no
    # link (harness/out_file.h's rule; reports/out_file.py).
    why = result_path_problem(a.out, [("the trace", a.trace)])
    if why:
        print(f"memory_snapshot.py: {shown(a.out)}: {why}", file=sys.stderr)
        return 2
    try:
        with open(a.trace, encoding="utf-8", errors="replace") as f:
            lines = f.readlines()
    except OSError as e:
        print(f"memory_snapshot.py: {shown(a.trace)}: {e.strerror}", file=sys.stderr)
        return 2
    try:
        steps, gap = memory_trace.parse(lines)
    except memory_trace.TraceError as e:
        print(f"memory_snapshot.py: {shown(a.trace)}:{e}", file=sys.stderr)
        return 2
    if gap:
        n, said, summed = gap
        print(f"memory_snapshot.py: {shown(a.trace)}:{n}: the trace says {said} B live, its lines add "
              f"up to {summed} B: a line is missing", file=sys.stderr)
        return 3
    if not 1 <= a.step <= len(steps):
        print(f"memory_snapshot.py: {shown(a.trace)}: no measured step {a.step} (it has {len(steps)}; "
              "was SB_MEMORY_TRACE set to a rank that ran?)", file=sys.stderr)
        return 3
    step = steps[a.step - 1]
    snap = snapshot(lines, step)
    total = sum(s["total_size"] for s in snap["segments"])
    if total != step.tracker_peak:
        print(f"memory_snapshot.py: {shown(a.trace)}: step {a.step}'s live blocks add up to {total} B, "
              f"the tracker's peak is {step.tracker_peak} B", file=sys.stderr)
        return 3
    try:
        replace_file(a.out, pickle.dumps(snap))
    except OSError as e:
        print(f"memory_snapshot.py: {shown(a.out)}: {e.strerror}", file=sys.stderr)
        return 2
    print(f"{shown(a.out)}: step {a.step}, {len(snap['segments'])} live blocks, {total} B at the peak, "
          f"{len(snap['device_traces'][0])} trace entries")
    return 0


if __name__ == "__main__":
    sys.exit(main())
