"""Tensor bundles: the files the harness and a PyTorch rank hand tensors over in.

The format is safetensors' (8 bytes of little-endian header length, a JSON header naming each
tensor's dtype, shape and byte range, then the bytes), written and read here without the
safetensors package so that a rank needs nothing but torch. The C++ side is
reference/tensor_bundle.cpp; the header's "__metadata__" (strings only, as safetensors
requires) carries what goes with the tensors (placements, measurements).
"""

import json
import struct

import torch

DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
    "U8": torch.uint8, "BOOL": torch.bool,
}
NAMES = {v: k for k, v in DTYPES.items()}


def read(path):
    """{name: tensor} and the metadata dict of the bundle at `path`."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise ValueError(f"{path}: not a tensor bundle ({len(data)} bytes)")
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {})
    base = 8 + n
    out = {}
    for name, e in header.items():
        if e["dtype"] not in DTYPES:
            raise ValueError(f"{path}: tensor '{name}' has dtype {e['dtype']}, expected one of "
                             f"{sorted(DTYPES)}")
        begin, end = e["data_offsets"]
        dtype = DTYPES[e["dtype"]]
        if end > begin:
            t = torch.frombuffer(bytearray(data[base + begin:base + end]), dtype=dtype)
        else:
            t = torch.empty(0, dtype=dtype)
        out[name] = t.reshape(e["shape"])
    return out, meta


def write(path, tensors, meta=None):
    """Writes {name: tensor} (any device, layout or dtype in DTYPES) and `meta` (str: str)."""
    header, chunks, offset = {}, [], 0
    for name, t in tensors.items():
        t = t.detach().to("cpu").contiguous()
        if t.dtype not in NAMES:
            raise ValueError(f"tensor '{name}' has dtype {t.dtype}, which a bundle cannot hold")
        raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    if meta:
        header["__metadata__"] = {k: str(v) for k, v in meta.items()}
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-aligned, as safetensors writes it
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for c in chunks:
            f.write(c)
