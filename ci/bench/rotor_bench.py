#!/usr/bin/env python3
"""rotor timed as a whole process, side by side in one run: stratbench builds (this one and,
for an A/B, another commit's) and, where given, ColossalAI's C rotor (ci/bench/colossal_rotor.py).

  ci/bench/rotor_bench.py --run new=build/stratbench --run old=/tmp/old/stratbench \\
      --colossal /tmp/colossal/mod --stages 20,60,120,200,500 --rounds 4 --out /tmp/rotor.json

Chains: random heterogeneous ones (seeded; stage times uniform in [1, 10] with the backward about
twice the forward, activations of 1 to 100 KiB, tapes 1x to 3x them, temporaries up to a fifth),
each plain (rotor's model) and with the step terms every profiled chain carries (output_kept,
loss_bytes, loss_grad_kept, and a taped forward's own temporaries, fetmp). The budget is half of
what keeping every tape peaks at, at --slots slots. Every round runs every command on every chain
in an order rotated round by round; each is one process, timed from start to exit (start-up
counts), with its peak resident memory. The runs of stratbench must agree on the schedule's
predicted time (the optimum is unchanged). ColossalAI runs the plain chains only (its model has no
step terms): `colossal` as its solver runs it (compute_table converts the table into Python
lists and dicts, then the schedule is read back), `colossal-C` its C loop alone (the process still
starts Python). Prints a table of medians and the ratios of each command's median to the first
--run's (on a chain with step terms, against ColossalAI's time on the plain chain of that length);
--out keeps every sample.

Exit codes: 0 measured; 1 a run failed or the stratbench runs disagreed; 2 bad usage.
"""
import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def random_chain(stages, seed, terms):
    rng = random.Random(seed)
    kib = 1024
    c = {k: [] for k in ("ftime", "btime", "x", "xbar", "ftmp", "btmp")}
    if terms:
        c["fetmp"] = []
    for i in range(stages + 1):
        x = round(rng.uniform(1, 100)) * kib
        c["x"].append(x)
        c["xbar"].append(round(x * rng.uniform(1, 3)))
        c["btmp"].append(round(x * rng.uniform(0, 0.2)))
        if i < stages:
            f = rng.uniform(1, 10)
            c["ftime"].append(f)
            c["ftmp"].append(round(x * rng.uniform(0, 0.2)))
            if terms:
                c["fetmp"].append(round(c["ftmp"][-1] * rng.uniform(0.3, 1)))
            c["btime"].append(2 * f * rng.uniform(0.8, 1.2))
        else:
            c["btime"].append(1.0)
    if terms:
        c.update(output_kept=True, loss_bytes=8.0, loss_grad_kept=True)
    return c


def timed(cmd, timeout):
    """Wall seconds, peak resident MiB, exit code, stdout and stderr of one process."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=out, stderr=err)
        timer = threading.Timer(timeout, p.kill)
        timer.start()
        _, status, usage = os.wait4(p.pid, 0)
        seconds = time.perf_counter() - start
        timer.cancel()
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return (seconds, usage.ru_maxrss / 1024, p.returncode, out.read().decode(),
                err.read().decode())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--run", action="append", required=True, metavar="NAME=STRATBENCH",
                    help="a stratbench binary to time (the first is the ratios' base)")
    ap.add_argument("--colossal", metavar="DIR",
                    help="ColossalAI's built rotorc (colossal_rotor.py build)")
    ap.add_argument("--stages", default="20,60,120,200,500")
    ap.add_argument("--slots", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--timeout", type=int, default=1800, help="seconds a run may take")
    ap.add_argument("--colossal-full-upto", type=int, default=200, metavar="STAGES",
                    help="run ColossalAI's whole solver (its table converted into Python objects: "
                         "tens of GB at 500 stages) only up to this many stages; its C loop "
                         "alone runs at every length")
    ap.add_argument("--out", help="JSON file for every sample")
    a = ap.parse_args()
    runs = []
    for r in a.run:
        name, _, path = r.partition("=")
        if not name or not path or not os.access(path, os.X_OK):
            print(f"rotor_bench: --run {r!r}: expected NAME=EXECUTABLE", file=sys.stderr)
            return 2
        runs.append((name, path))
    try:
        stages = [int(s) for s in a.stages.split(",")]
    except ValueError:
        print(f"rotor_bench: --stages {a.stages!r}: expected numbers separated by commas",
              file=sys.stderr)
        return 2

    work = tempfile.mkdtemp(prefix="rotor_bench.")
    chains = []  # (label, path, budget, terms)
    for n in stages:
        for terms in (False, True):
            path = os.path.join(work, f"chain{n}{'_terms' if terms else ''}.json")
            with open(path, "w") as f:
                json.dump(random_chain(n, 1000 + n, terms), f)
            none = subprocess.run([runs[0][1], "solve", "checkpoint", "--chain", path, "--budget",
                                   "none", "--solver", "none"], capture_output=True, text=True)
            if none.returncode != 0:
                print(f"rotor_bench: {path}: {none.stderr}", file=sys.stderr)
                return 1
            budget = json.loads(none.stdout)["predicted_peak"] / 2
            chains.append((f"{n}{' + step terms' if terms else ''}", path, budget, terms, n))

    jobs = []  # (chain index, command name, argv)
    for ci, (label, path, budget, terms, n) in enumerate(chains):
        for name, exe in runs:
            jobs.append((ci, name, [exe, "solve", "checkpoint", "--chain", path, "--budget",
                                    repr(budget), "--slots", str(a.slots), "--time-limit",
                                    str(a.timeout)]))
        if a.colossal and not terms:
            for name, extra in (("colossal", []), ("colossal-C", ["--table-only"])):
                if name == "colossal" and n > a.colossal_full_upto:
                    continue
                jobs.append((ci, name, [sys.executable, os.path.join(HERE, "colossal_rotor.py"),
                                        "solve", a.colossal, path, repr(budget), str(a.slots)] +
                             extra))
    samples, peaks = {}, {}
    agree = {}
    failed = False
    for r in range(a.rounds):
        # Each chain's commands run together, in an order rotated round by round.
        order = []
        for ci in range(len(chains)):
            mine = [j for j in jobs if j[0] == ci]
            k = r % len(mine)
            order += mine[k:] + mine[:k]
        for ci, name, argv in order:
            secs, mib, rc, out, err = timed(argv, a.timeout)
            label = chains[ci][0]
            if rc != 0:
                print(f"rotor_bench: {name} on {label}: exit {rc}: {err.strip()[:300]}",
                      file=sys.stderr)
                failed = True
                continue
            samples.setdefault((label, name), []).append(secs)
            peaks.setdefault((label, name), []).append(mib)
            if not name.startswith("colossal"):
                t = json.loads(out)["predicted_time"]
                agree.setdefault(label, {})[name] = t
            print(f"round {r + 1} {label:>20} {name:>9} {secs * 1000:10.1f} ms {mib:8.1f} MiB",
                  file=sys.stderr)
    for label, times in agree.items():
        if len(set(times.values())) > 1:
            print(f"rotor_bench: {label}: the predicted times differ: {times}", file=sys.stderr)
            failed = True

    names = [n for n, _ in runs] + (["colossal", "colossal-C"] if a.colossal else [])
    base = runs[0][0]
    print("| chain (stages) | " + " | ".join(f"{n} (ms)" for n in names) + " | " +
          " | ".join(f"{n} / {base}" for n in names if n != base) + " | peak MiB (" +
          " / ".join(names) + ") |")
    print("|---" * (2 * len(names) + 1) + "|")
    plain = {}
    for label, _, _, terms, n in chains:
        med = {n2: statistics.median(samples[(label, n2)]) for n2 in names
               if (label, n2) in samples}
        if not terms:
            plain[n] = {k: v for k, v in med.items() if k.startswith("colossal")}
        cells = [f"{med[n2] * 1000:,.1f}" if n2 in med else "-" for n2 in names]
        ratios = []
        for n2 in names:
            if n2 == base:
                continue
            ref = med.get(n2, plain.get(n, {}).get(n2))
            note = "" if n2 in med else " (plain)"
            ratios.append(f"{ref / med[base]:.2f}x{note}" if ref and base in med else "-")
        mem = [f"{statistics.median(peaks[(label, n2)]):,.0f}" if (label, n2) in peaks else "-"
               for n2 in names]
        print(f"| {label} | " + " | ".join(cells) + " | " + " | ".join(ratios) + " | " +
              " / ".join(mem) + " |")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"slots": a.slots, "rounds": a.rounds,
                       "samples": {f"{k[0]}|{k[1]}": v for k, v in samples.items()},
                       "peak_mib": {f"{k[0]}|{k[1]}": v for k, v in peaks.items()},
                       "predicted_time": agree}, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
