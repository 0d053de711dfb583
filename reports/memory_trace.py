#!/usr/bin/env python3
"""What is live at a measured step's peak, from a SB_MEMORY_TRACE allocation trace.

    SB_MEMORY_TRACE=0 stratbench run suite.yaml --filter ID 2>trace.txt
    reports/memory_trace.py trace.txt

The trace (harness/memory.h) has one line per allocation and free of the traced rank, on the
CPU or on CUDA alike:

    mem +BYTES -> LIVE @PTR in OP < CALLER < ...     (innermost operator first)
    mem -BYTES -> LIVE @PTR
    mem reset at LIVE                                 (a measured step starts)
    mem end of the measured step at LIVE, peak PEAK
    mem NOTE at LIVE, peak PEAK                       (a strategy's own marks)

For each measured step (one per row that ran, in the order of the run), this prints the bytes
live at its start and at its peak, and what is live at the peak grouped by the operator that
allocated it: the terms a memory model has to have. The peak it reconstructs from the lines is
checked against the one the tracker itself kept; they differ only if lines are missing (then it
says so and exits 3); so does every line's live total against the sum of the lines before it.

A memory model that replays a step's allocations prints them into the same trace before the
step ("model +BYTES WHAT", "model -BYTES WHAT": sharding/cp does; the lines since the row's
"mem prepare" note are its replay); --model lines the replay up
against the measured step's allocations (consecutive allocations, and consecutive frees, taken
together, so a collective's buffers may be one term of the model) and shows where they first
part, with the operators that allocated around it: where a model needs its next term.

Exit codes: 0 done, 2 bad arguments or an unreadable file, 3 a step whose reconstructed peak
disagrees with the tracker's (or, with --model, with the model's replay).
"""
import argparse
import io
import os
import re
import signal
import stat
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from out_file import MAX_INPUT_BYTES, install_shown_output  # noqa: E402

# The tracker's numbers are 64-bit: at most 19 digits (a longer one is no line it wrote).
N = r"\d{1,19}"
ALLOC = re.compile(rf"^mem \+({N}) -> (-?{N}) @(\S+)(?: in (.*))?$")
FREE = re.compile(rf"^mem -({N}) -> (-?{N}) @(\S+)$")
RESET = re.compile(rf"^mem reset at (-?{N})$")
END = re.compile(rf"^mem end of the measured step at (-?{N}), peak (-?{N})$")
NOTE = re.compile(rf"^mem (.*) at (-?{N}), peak (-?{N})$")
MODEL = re.compile(rf"^model ([+-]{N}) (.*)$")


class TraceError(ValueError):
    """A line that starts as the tracker's allocation or free lines do but is not one."""

    def __init__(self, line, why):
        super().__init__(f"{line}: {why}")
        self.line = line


GENERIC = {"aten::empty", "aten::empty_strided", "aten::empty_like", "aten::new_empty",
           "aten::new_empty_strided", "aten::resize_"}


class Step:
    def __init__(self, index, line, start):
        self.index, self.line, self.start = index, line, start
        self.peak, self.peak_line = start, line
        self.tracker_peak = None
        self.notes = []  # (line, text): a strategy's marks inside the step
        self.live_at_peak = {}
        self.model = []   # (signed bytes, what): a model's replay printed before the step
        self.events = []  # (signed bytes, operator): the step's allocations and frees


def group_key(context, depth):
    if not context:
        return "(no operator: the runner, a backend or a strategy's own code)"
    parts = [p for p in context.split(" < ") if p != "..."]
    # The autograd engine's wrapper repeats the node's name: keep the node itself.
    parts = [p for p in parts if not p.startswith("autograd::engine::evaluate_function: ")] or parts
    # A factory that every operator allocates through says less than the operator that called it.
    while len(parts) > 1 and parts[0] in GENERIC:
        parts = parts[1:]
    return " < ".join(parts[:depth])


def parse(lines):
    """The measured steps, each with its peak and what is live there."""
    events = []  # (line, '+'|'-', ptr, bytes, context)
    steps, step = [], None
    model = []
    for n, raw in enumerate(lines, 1):
        line = raw.rstrip("\n")
        m = MODEL.match(line)
        if m:
            model.append((int(m[1]), m[2]))
            continue
        if not line.startswith("mem "):
            continue
        m = ALLOC.match(line)
        if m:
            if step and int(m[1]):
                step.events.append((int(m[1]), m[4] or ""))
            events.append((n, "+", m[3], int(m[1]), m[4] or "", step.index if step else None,
                           int(m[2])))
            if step and int(m[2]) > step.peak:
                step.peak, step.peak_line = int(m[2]), n
            continue
        m = FREE.match(line)
        if m:
            if step and int(m[1]):
                step.events.append((-int(m[1]), ""))
            events.append((n, "-", m[3], int(m[1]), "", None, int(m[2])))
            continue
        if line.startswith(("mem +", "mem -")):
            raise TraceError(n, "not an allocation or free line as the tracker writes it "
                                "('mem +BYTES -> LIVE @PTR [in OPS]', numbers of at most 19 "
                                "digits)")
        m = RESET.match(line)
        if m:
            step = Step(len(steps), n, int(m[1]))
            step.model, model = [e for e in model if e[0]], []
            steps.append(step)
            continue
        m = END.match(line)
        if m and step:
            step.tracker_peak = int(m[2])
            step = None
            continue
        m = NOTE.match(line)
        if m and step:
            step.notes.append((n, m[1]))
        elif m and m[1] == "prepare":  # a row begins: a replay printed before is not its
            model = []
    # Replay once, keeping what is live at each step's peak (its start, if nothing rose above),
    # and checking every line's live bytes against the sum of what the lines before it left
    # live (the tracker writes each line under the lock of its update, so they agree to the
    # byte unless a line is missing). The first line fixes what was live before the trace.
    at = {s.peak_line: s for s in steps}
    starts = {s.line: s for s in steps if s.peak_line == s.line}
    live = {}  # ptr -> (bytes, context, line, step index or None)
    total, offset, gap = 0, None, None
    for n, kind, ptr, nbytes, ctx, idx, now in events:
        for line in [l for l in starts if l < n]:
            starts.pop(line).live_at_peak = dict(live)
        if kind == "+":
            old = live.get(ptr)
            total += nbytes - (old[0] if old else 0)
            live[ptr] = (nbytes, ctx, n, idx)
        else:
            old = live.pop(ptr, None)
            total -= old[0] if old else 0
        if offset is None:
            offset = now - total
        elif gap is None and now - total != offset:
            gap = (n, now, total + offset)
        if n in at:
            at[n].live_at_peak = dict(live)
    for s in starts.values():
        s.live_at_peak = dict(live)
    return [s for s in steps if s.tracker_peak is not None], gap


def runs(seq):
    """Consecutive allocations (and consecutive frees) taken together."""
    out = []
    for b, what in seq:
        if out and (out[-1][0] > 0) == (b > 0):
            out[-1] = (out[-1][0] + b, out[-1][1] + [what])
        else:
            out.append((b, [what]))
    return out


def compare_model(step, out):
    """Lines a model's replay up against the step; True where they agree to the byte."""
    if not step.model:
        out.write("  model: none printed before this step\n")
        return True
    model, meas = runs(step.model), runs(step.events)
    for i in range(max(len(model), len(meas))):
        a = model[i] if i < len(model) else (0, ["(the model has ended)"])
        b = meas[i] if i < len(meas) else (0, ["(the step has ended)"])
        if a[0] == b[0]:
            continue
        out.write(f"  model: parts from the measurement at run {i + 1} of {len(meas)} "
                  "(model bytes, its terms | measured bytes, their operators):\n")
        for j in range(max(0, i - 6), min(max(len(model), len(meas)), i + 6)):
            a = model[j] if j < len(model) else (0, ["-"])
            b = meas[j] if j < len(meas) else (0, ["-"])
            mark = ">>" if j == i else "  "
            terms = ", ".join(a[1])[:60]
            ops = ", ".join(group_key(c, 1) for c in b[1] if c)[:60]
            out.write(f"  {mark} {a[0]:+12d} {terms:60s} | {b[0]:+12d} {ops}\n")
        return False
    peak = cur = 0
    for b, _ in step.model:
        cur += b
        peak = max(peak, cur)
    out.write(f"  model: agrees with every allocation ({len(step.model)} terms, "
              f"{len(meas)} runs); its peak +{peak} B\n")
    return True


def mib(b):
    return f"{b / 2**20:10.2f} MiB"


def report(step, depth, listing, out, label=None):
    live = step.live_at_peak or {}
    total = sum(b for b, *_ in live.values())
    before = [(p, v) for p, v in live.items() if v[3] != step.index]
    during = [(p, v) for p, v in live.items() if v[3] == step.index]
    notes = [t for n, t in step.notes if n < step.peak_line]
    if label:
        out.write(f"== {label}\n")
    out.write(f"measured step {step.index + 1} (trace line {step.line}): {step.start} B live at "
              f"its start, peak {step.peak} B (+{step.peak - step.start} B) at line "
              f"{step.peak_line}" + (f", after the mark '{notes[-1]}'" if notes else "") + "\n")
    ok = step.peak == step.tracker_peak and total == step.peak
    if not ok:
        out.write(f"  MISMATCH: the tracker's peak is {step.tracker_peak} B and the allocations "
                  f"live at the reconstructed peak sum to {total} B: lines are missing\n")
    out.write(f"  live at the peak: {len(live)} allocations, {total} B ({mib(total).strip()})\n")
    groups = {}
    for _, (b, ctx, _, _) in during:
        g = groups.setdefault(group_key(ctx, depth), [0, 0])
        g[0] += b
        g[1] += 1
    made_before = sum(b for _, (b, *_rest) in before)
    out.write(f"  {mib(made_before)}  {len(before):4d}x  allocated before the step (inputs, "
              "parameters, what the executor holds)\n")
    for key, (b, count) in sorted(groups.items(), key=lambda kv: -kv[1][0]):
        out.write(f"  {mib(b)}  {count:4d}x  {key}\n")
    if listing:
        out.write("  in the order they were made:\n")
        for ptr, (b, ctx, n, s) in sorted(live.items(), key=lambda kv: kv[1][2]):
            where = "before" if s != step.index else "step"
            out.write(f"    line {n:7d} {where:6s} {b:14d} B  {ctx or '-'}\n")
    return ok



def step_number(least, note=""):
    """An argparse type: a step number, at least `least` (argparse exits 2 naming it)."""
    def parse(text):
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"'{text}' is not a whole number")
        if n < least:
            raise argparse.ArgumentTypeError(f"{n}: steps count from 1{note}")
        return n
    return parse

def not_a_file(path, new_ok=False):
    """Why `path` cannot be read (or, new_ok, replaced) as a file: a FIFO blocked the reader
    forever and /dev/zero was read until memory ran out. None where it is a regular file (or,
    new_ok, where nothing is there yet)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None if new_ok else "no such file"
    except OSError as e:
        return e.strerror
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file (a folder, a FIFO or a device); give the file itself"
    return None


def main():
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `| head` ends it quietly
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace", help="the stderr of a run with SB_MEMORY_TRACE=<rank> set ('-': stdin)")
    ap.add_argument("--step", type=step_number(0, " (0: every step)"), default=0,
                    help="only the N-th measured step (1 = the first row that ran; default: all)")
    ap.add_argument("--depth", type=int, default=2,
                    help="how many operator scopes name a group, innermost first (default 2)")
    ap.add_argument("--list", action="store_true", help="also list every live allocation")
    ap.add_argument("--model", action="store_true",
                    help="line a model's replay ('model +BYTES WHAT' lines) up against each "
                         "step and show where they first part")
    ap.add_argument("--results", metavar="CSV",
                    help="the run's results.csv: names each step by its row (case, strategy, "
                         "measured and predicted peak); the rows that have a measured peak are "
                         "the steps, in order")
    a = ap.parse_args()
    install_shown_output()
    if a.depth < 1:
        ap.error("--depth must be at least 1")
    for path in ([a.trace] if a.trace != "-" else []) + ([a.results] if a.results else []):
        why = not_a_file(path)
        if why:
            print(f"memory_trace.py: {path}: {why}", file=sys.stderr)
            return 2
    try:
        if a.trace == "-":
            # A stream has no size to check first: read at most the bound files have (an endless
            # one, `< /dev/zero`, filled memory and ended in a MemoryError traceback).
            data = sys.stdin.buffer.read(MAX_INPUT_BYTES + 1)
            if len(data) > MAX_INPUT_BYTES:
                print(f"memory_trace.py: standard input: more than the {MAX_INPUT_BYTES} bytes "
                      "this tool reads", file=sys.stderr)
                return 2
            # Read as a file is (universal newlines), not split at every Unicode line break.
            lines = io.StringIO(data.decode("utf-8", errors="replace"), newline=None).readlines()
        else:
            with open(a.trace, encoding="utf-8", errors="replace") as f:
                lines = f.readlines()
    except OSError as e:
        print(f"memory_trace.py: {a.trace}: {e.strerror}", file=sys.stderr)
        return 2
    try:
        steps, gap = parse(lines)
    except TraceError as e:
        print(f"memory_trace.py: {a.trace}:{e}", file=sys.stderr)
        return 2
    if gap:
        n, said, summed = gap
        print(f"memory_trace.py: {a.trace}:{n}: the trace says {said} B live, its lines add up to "
              f"{summed} B: a line is missing (or two threads wrote it unordered)", file=sys.stderr)
    if not steps:
        print(f"memory_trace.py: {a.trace}: no measured step (no 'mem reset' ... 'mem end of the "
              "measured step' lines): was SB_MEMORY_TRACE set to a rank that ran?", file=sys.stderr)
        return 2
    labels = [None] * len(steps)
    if a.results:
        import csv
        try:
            with open(a.results, encoding="utf-8", newline="") as f:
                reader = csv.DictReader(f)
                missing = [c for c in ("case", "strategy_id", "peak_mem_bytes")
                           if c not in (reader.fieldnames or [])]
                if missing:
                    print(f"memory_trace.py: {a.results}: no column '{missing[0]}': not the "
                          "results.csv a run writes", file=sys.stderr)
                    return 2
                rows = [r for r in reader if r.get("peak_mem_bytes")]
        except OSError as e:
            print(f"memory_trace.py: {a.results}: {e.strerror}", file=sys.stderr)
            return 2
        except (UnicodeDecodeError, csv.Error) as e:
            print(f"memory_trace.py: {a.results}: not the results.csv a run writes ({e})",
                  file=sys.stderr)
            return 2
        if len(rows) != len(steps):
            print(f"memory_trace.py: {a.results} has {len(rows)} rows with a measured peak and "
                  f"{a.trace} {len(steps)} measured steps: not the same run?", file=sys.stderr)
            return 2
        labels = [f"{r['case']} {r['strategy_id']}: row peak {r['peak_mem_bytes']} B (its "
                  f"largest rank), predicted {r.get('predicted_mem_bytes') or 'none'}"
                  for r in rows]
    if a.step:
        if a.step > len(steps):
            print(f"memory_trace.py: {a.trace}: --step {a.step}, but the trace has "
                  f"{len(steps)} measured steps", file=sys.stderr)
            return 2
        steps, labels = [steps[a.step - 1]], [labels[a.step - 1]]
    ok = True
    for s, label in zip(steps, labels):
        ok = report(s, a.depth, a.list, sys.stdout, label) and ok
        if a.model:
            ok = compare_model(s, sys.stdout) and ok
    return 0 if ok and not gap else 3


if __name__ == "__main__":
    sys.exit(main())
