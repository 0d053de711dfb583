#!/usr/bin/env python3
"""Summary of a GPU run (ci/gpu/run.sh): per backend, the rows by status, every row that did
not pass or was mispredicted, and the table of times, peaks and achieved rates, with the
achieved TFLOP/s and HBM bandwidth of the Linear and prefill cases against the H100's limits.

Usage: summary.py OUT   (OUT holds threads/results.csv and nccl/results.csv)

FLOPs and bytes are counted from the case's shape: a Linear step (forward and backward) does
6*M*K*N (M tokens, K in, N out: the output, the input's gradient and the weight's gradient are
one M*K*N product each); the fewest bytes it must move are its operands and results once
(x, w, dy read; y, dx, dw written). A GPT-2 prefill layer does 24*B*T*d^2 (the projections and
the 4d MLP) + 4*B*T^2*d (scores and their product with V, the full square as the reference
computes it, masked after). Rates are the whole step's over the slowest rank's median time: on
`threads` every rank of the mesh shares the one GPU, so this is the GPU's aggregate rate.
"""
import csv
import os
import re
import sys

H100_BF16_TFLOPS = 989.0  # dense, SXM datasheet
H100_FP32_TFLOPS = 67.0  # non-tensor-core fp32 (TF32 is off in LibTorch by default)
H100_HBM_TBS = 3.35

SIZE = {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8}


def shape_of(s):
    out = {}
    for part in s.split(";"):
        if "=" in part:
            k, v = part.split("=", 1)
            out[k] = v
    return out


def linear_counts(row):
    sh = shape_of(row["shape"])
    dims = [int(x) for x in sh["input"].split("x")]
    k = dims[-1]
    m = 1
    for d in dims[:-1]:
        m *= d
    n = int(sh["out"])
    e = SIZE.get(row["dtype"], 4)
    flops = 6.0 * m * k * n
    bytes_ = e * (2 * m * k + 2 * k * n + 2 * m * n)  # x,dx; w,dw; y,dy
    return flops, bytes_


def prefill_flops(row):
    sh = shape_of(row["shape"])
    try:
        b, t, d, layers = (int(sh[x]) for x in ("batch", "seq", "d_model", "layers"))
    except (KeyError, ValueError):
        return None
    f = layers * (24.0 * b * t * d * d + 4.0 * b * t * t * d)
    if sh.get("mode") == "training":
        f *= 3
    return f


def fnum(x):
    try:
        return float(x)
    except (TypeError, ValueError):
        return None


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "out/gpu"
    for backend in ("threads", "nccl"):
        path = os.path.join(root, backend, "results.csv")
        if not os.path.exists(path):
            print(f"## {backend}: no results ({path})")
            continue
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
        by = {}
        for r in rows:
            by[r["status"]] = by.get(r["status"], 0) + 1
        mis = [r for r in rows if r.get("mispredicted")]
        device = rows[0]["device"] if rows else ""
        print(f"## {backend}: {len(rows)} rows on {device}: " +
              ", ".join(f"{k} {v}" for k, v in sorted(by.items())) +
              f"; mispredicted {len(mis)}")
        shown = 0
        for r in rows:
            if r["status"] not in ("pass", "skipped", "unsupported") or r.get("mispredicted"):
                shown += 1
                if shown > 25:
                    continue
                msg = (r.get("message") or "").replace("\n", " ")[:300]
                print(f"  {r['status']:5} {r.get('mispredicted') or '-':7} {r['case']} "
                      f"{r['strategy_id']}: {msg}")
        if shown > 25:
            print(f"  ... and {shown - 25} more")
        print(f"  {'case':38} {'strategy':36} {'status':6} {'ms':>9} {'peak MiB':>9} "
              f"{'pred MiB':>9} {'TFLOP/s':>8} {'TB/s':>6}")
        for r in rows:
            if r["status"] in ("skipped",):
                continue
            t = fnum(r["time_us_median"])
            peak = fnum(r["peak_mem_bytes"])
            pred = fnum(r["predicted_mem_bytes"])
            rate = bw = ""
            if t and r["status"] == "pass":
                if r["workload"] == "linear":
                    fl, by_ = linear_counts(r)
                    rate = f"{fl / t / 1e6:.1f}"
                    bw = f"{by_ / t / 1e6:.2f}"
                elif r["workload"] == "gpt2_prefill":
                    fl = prefill_flops(r)
                    if fl:
                        rate = f"{fl / t / 1e6:.1f}"
            print(f"  {r['case'][:38]:38} {r['strategy_id'][:36]:36} {r['status'][:6]:6} "
                  f"{(t or 0) / 1e3:9.3f} {(peak or 0) / 2**20:9.1f} {(pred or 0) / 2**20:9.1f} "
                  f"{rate:>8} {bw:>6}")
        best = {}
        for r in rows:
            t = fnum(r["time_us_median"])
            if not t or r["status"] != "pass" or r["workload"] != "linear":
                continue
            fl, by_ = linear_counts(r)
            key = r["case"]
            tflops = fl / t / 1e6  # FLOP per microsecond / 1e6 = TFLOP/s
            if key not in best or tflops > best[key][0]:
                best[key] = (tflops, by_ / t / 1e6, r["strategy_id"], r["dtype"], t)
        for case, (tf, tb, sid, dt, t) in sorted(best.items()):
            peak = H100_BF16_TFLOPS if dt == "bfloat16" else H100_FP32_TFLOPS
            print(f"  best {case}: {sid} {t / 1e3:.3f} ms, {tf:.1f} TFLOP/s = "
                  f"{100 * tf / peak:.0f}% of {peak:.0f}; {tb:.2f} TB/s = "
                  f"{100 * tb / H100_HBM_TBS:.0f}% of {H100_HBM_TBS}")


if __name__ == "__main__":
    main()
