#!/usr/bin/env python3
"""Malformed torch.export archives for the reader's error tests (ci/export_test.sh), made from a
good one with the standard library alone: OUT/truncated.pt2 (the first half of the bytes),
schema9.pt2 (schema_version major 9), unknown_op.pt2 (a node's target an operator no LibTorch
has), short_weight.pt2 (a weight record shorter than its tensor_meta), cond.pt2 (a node a
higher-order operator), old_layout.pt2 (the 2.7-era serialized_exported_program.json).

Usage: ci/malform_pt2.py GOOD.pt2 OUTDIR"""
import json
import os
import sys
import zipfile


def rewrite(src, dst, change):
    """Copies the archive, each record through change(name, bytes) -> bytes or None (dropped)."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            data = change(info.filename, zin.read(info.filename))
            if data is not None:
                zout.writestr(info.filename, data)


def program(change):
    def f(name, data):
        if name.endswith("/models/model.json"):
            j = json.loads(data)
            change(j)
            return json.dumps(j).encode()
        return data
    return f


def node_target(target):
    def f(j):
        nodes = j["graph_module"]["graph"]["nodes"]
        node = next(n for n in nodes if n["target"].startswith("torch.ops.aten.silu") or
                    n["target"].startswith("torch.ops.aten.relu"))
        node["target"] = target
    return f


def main():
    src, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    data = open(src, "rb").read()
    open(os.path.join(out, "truncated.pt2"), "wb").write(data[:len(data) // 2])
    rewrite(src, os.path.join(out, "schema9.pt2"),
            program(lambda j: j["schema_version"].update(major=9)))
    rewrite(src, os.path.join(out, "unknown_op.pt2"),
            program(node_target("torch.ops.aten.not_an_operator.default")))
    rewrite(src, os.path.join(out, "cond.pt2"), program(node_target("torch.ops.higher_order.cond")))
    rewrite(src, os.path.join(out, "short_weight.pt2"),
            lambda name, d: d[:len(d) // 2] if name.endswith("/data/weights/weight_0") else d)
    rewrite(src, os.path.join(out, "old_layout.pt2"),
            lambda name, d: d if not name.endswith("/models/model.json") else None)
    with zipfile.ZipFile(os.path.join(out, "old_layout.pt2"), "a") as z:
        z.writestr(os.path.dirname(os.path.dirname(
            [n for n in zipfile.ZipFile(src).namelist() if n.endswith("/models/model.json")][0]))
            + "/serialized_exported_program.json", b"{}")
    print("wrote 6 malformed archives to", out)


if __name__ == "__main__":
    main()
