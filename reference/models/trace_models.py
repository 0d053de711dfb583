#!/usr/bin/python3
"""Trace small reference models to TorchScript for the stratbench LibTorch importer.

The C++ importer (torch::jit::load, Inline, a walk over aten:: nodes) needs real-world
graphs to map onto its strategies, but CI has no network and no weights. This script builds
CI-sized models with random weights from a seed and traces them in TRAIN mode (the importer
checks gradients, so batch norm must use batch statistics) with every dropout probability
0.0, so that train-mode traces stay deterministic. Per model it writes DIR/NAME.pt (the
trace) and DIR/NAME.json = {"file", "inputs": [{"shape", "dtype"[, "low", "high"]}],
"description"}, loads the file back, compares it with the eager model and warns if its
inlined graph has control flow (prim::If / prim::Loop), which the importer rejects.
`--malformed` adds the inputs of the importer's error tests.

Usage: /usr/bin/python3 reference/models/trace_models.py --out DIR [--only NAME ...]
       [--list] [--seed N] [--malformed] [--ops]
"""
import argparse
from collections import OrderedDict
import json
import math
import os
import sys
import time
import warnings

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError as e:
    sys.exit(f"trace_models.py: {e}: python3-torch is not installed: run ci/setup.sh --test")


def import_torchvision():
    """torchvision, for its models (plain nn.Modules that trace to aten:: operators only).

    PyPI's torchvision for PyTorch 2.13 is built against a CUDA torch: beside the CPU build its
    C++ operators (nms, roi_align...) do not load, and its import stops where it registers their
    meta kernels ("operator torchvision::nms does not exist"). None of the models traced here
    calls those operators, so the import is retried without that registration; a model that did
    call one would fail to trace, not trace wrongly."""
    try:
        import torchvision
        return torchvision
    except RuntimeError as e:
        if "torchvision::" not in str(e):
            raise
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]
        import types
        sys.modules["torchvision._meta_registrations"] = types.ModuleType(
            "torchvision._meta_registrations")
        import torchvision
        print(f"trace_models.py: torchvision {torchvision.__version__} without its C++ operators "
              f"({e}); its models need none")
        return torchvision


try:
    torchvision = import_torchvision()
except ImportError as e:
    sys.exit(f"trace_models.py: {e}: torchvision is not installed: run ci/setup.sh --test")


# ---- GPT-2 style decoder; attribute names follow HF GPT-2 so that the importer's
# ---- name-based pattern matching is exercised on the names it will meet in practice.
class GPT2Attention(nn.Module):
    def __init__(self, d, heads, max_seq):
        super().__init__()
        # Head sizes from the config, not from x.shape: shape-derived scalars would trace as
        # aten::size chains and the 1/sqrt(dh) scale as a traced tensor.
        self.d, self.heads, self.dh = d, heads, d // heads
        # One fused qkv projection, as GPT-2 does: the importer must see through the split.
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)
        self.register_buffer("bias", torch.tril(torch.ones(max_seq, max_seq, dtype=torch.bool)))

    def forward(self, x):
        B, S, d = x.shape
        q, k, v = self.c_attn(x).split(self.d, dim=-1)
        q, k, v = (t.view(B, S, self.heads, self.dh).transpose(1, 2) for t in (q, k, v))
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.dh)
        scores = scores.masked_fill(~self.bias[:S, :S], float("-inf"))
        y = scores.softmax(dim=-1) @ v
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, S, d))


class GPT2Block(nn.Module):
    def __init__(self, d, heads, max_seq):
        super().__init__()
        self.ln_1, self.attn = nn.LayerNorm(d), GPT2Attention(d, heads, max_seq)
        self.ln_2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(OrderedDict(
            c_fc=nn.Linear(d, 4 * d), act=nn.GELU(), c_proj=nn.Linear(4 * d, d)))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2(nn.Module):
    def __init__(self, vocab, max_seq, d, heads, layers):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(max_seq, d)
        self.h = nn.ModuleList(GPT2Block(d, heads, max_seq) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # tied, as in GPT-2: one parameter, two uses

    def forward(self, ids):
        pos = torch.arange(ids.shape[1], device=ids.device)
        x = self.wte(ids) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


# ---- LLaMA style decoder; names follow HF LLaMA.
class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(d)), eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class LlamaAttention(nn.Module):
    def __init__(self, d, heads, kv_heads, max_seq):
        super().__init__()
        self.heads, self.kv_heads, self.dh = heads, kv_heads, d // heads
        self.q_proj = nn.Linear(d, d, bias=False)
        self.k_proj = nn.Linear(d, kv_heads * self.dh, bias=False)
        self.v_proj = nn.Linear(d, kv_heads * self.dh, bias=False)
        self.o_proj = nn.Linear(d, d, bias=False)
        # Rotary tables are buffers (not parameters): the importer must treat them as constants.
        inv_freq = 1.0 / (10000 ** (torch.arange(0, self.dh, 2).float() / self.dh))
        freqs = torch.outer(torch.arange(max_seq).float(), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", emb.cos())
        self.register_buffer("sin", emb.sin())

    def forward(self, x):
        B, S, d = x.shape
        q = self.q_proj(x).view(B, S, self.heads, self.dh).transpose(1, 2)
        k = self.k_proj(x).view(B, S, self.kv_heads, self.dh).transpose(1, 2)
        v = self.v_proj(x).view(B, S, self.kv_heads, self.dh).transpose(1, 2)
        cos, sin = self.cos[:S], self.sin[:S]
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        # Grouped-query attention: each kv head serves heads / kv_heads query heads
        # (expand + reshape, as HF's repeat_kv does).
        rep = self.heads // self.kv_heads
        k, v = (t[:, :, None].expand(B, self.kv_heads, rep, S, self.dh)
                .reshape(B, self.heads, S, self.dh) for t in (k, v))
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.dh)
        causal = torch.ones(S, S, dtype=torch.bool, device=x.device).tril()
        scores = scores.masked_fill(~causal, float("-inf"))
        y = F.softmax(scores, dim=-1) @ v
        return self.o_proj(y.transpose(1, 2).reshape(B, S, d))


class LlamaMLP(nn.Module):
    def __init__(self, d, hidden):
        super().__init__()
        self.gate_proj = nn.Linear(d, hidden, bias=False)
        self.up_proj = nn.Linear(d, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, d, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaLayer(nn.Module):
    def __init__(self, d, heads, kv_heads, hidden, max_seq):
        super().__init__()
        self.input_layernorm, self.post_attention_layernorm = RMSNorm(d), RMSNorm(d)
        self.self_attn = LlamaAttention(d, heads, kv_heads, max_seq)
        self.mlp = LlamaMLP(d, hidden)

    def forward(self, x):
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class Llama(nn.Module):
    def __init__(self, vocab, max_seq, d, heads, kv_heads, hidden, layers):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(
            LlamaLayer(d, heads, kv_heads, hidden, max_seq) for _ in range(layers))
        self.norm, self.lm_head = RMSNorm(d), nn.Linear(d, vocab, bias=False)

    def forward(self, ids):
        x = self.embed_tokens(ids)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.norm(x))


class MlpCumsum(nn.Module):
    """cumsum is an op no sharding strategy knows: the importer must run it replicated."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 32), nn.Linear(32, 16)

    def forward(self, x):
        return self.fc2(torch.tanh(torch.cumsum(self.fc1(x), dim=-1)))


class ScriptedIf(nn.Module):
    """Data-dependent control flow: scripted, it keeps a prim::If the importer must reject."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        if x.sum() > 0:
            return self.fc(x)
        return -x


def f32(*shape):
    return {"shape": list(shape), "dtype": "float32"}


def ids(batch, seq, vocab):
    return {"shape": [batch, seq], "dtype": "int64", "low": 0, "high": vocab}


# name -> (builder, inputs, description, malformed). Builders run after manual_seed.
MODELS = {
    "resnet18": (lambda: torchvision.models.resnet18(num_classes=10), [f32(2, 3, 32, 32)],
                 "torchvision resnet18, 10 classes, 32x32 images"),
    "densenet121": (lambda: torchvision.models.densenet121(num_classes=10, memory_efficient=False),
                    [f32(2, 3, 32, 32)], "torchvision densenet121, 10 classes, 32x32 images"),
    "vit": (lambda: torchvision.models.VisionTransformer(
        image_size=32, patch_size=8, num_layers=2, num_heads=4, hidden_dim=64, mlp_dim=128,
        num_classes=10, dropout=0.0, attention_dropout=0.0), [f32(2, 3, 32, 32)],
        "torchvision VisionTransformer (ViT-B/16 class) at CI size: 32x32, patch 8, 2 layers, "
        "4 heads, hidden 64, mlp 128"),
    "gpt2": (lambda: GPT2(vocab=64, max_seq=16, d=32, heads=4, layers=2), [ids(2, 16, 64)],
             "GPT-2 style decoder: vocab 64, seq 16, d 32, 4 heads, 2 layers, tied lm_head"),
    "gpt2_12": (lambda: GPT2(vocab=64, max_seq=16, d=64, heads=4, layers=12), [ids(2, 16, 64)],
                "GPT-2 style decoder, 12 layers (import-speed benchmark): vocab 64, seq 16, "
                "d 64, 4 heads, tied lm_head"),
    "llama": (lambda: Llama(vocab=64, max_seq=16, d=32, heads=4, kv_heads=2, hidden=64,
                            layers=2), [ids(2, 16, 64)],
              "LLaMA style decoder: vocab 64, seq 16, d 32, 4 heads, 2 kv heads (GQA), "
              "SwiGLU hidden 64, RoPE, RMSNorm, 2 layers, untied lm_head"),
    "mlp_cumsum": (MlpCumsum, [f32(4, 16)],
                   "Linear(16,32) -> cumsum(-1) -> tanh -> Linear(32,16); cumsum has no "
                   "sharding strategy, so it must run replicated"),
}
MALFORMED = {
    "scripted_if": (ScriptedIf, [f32(2, 4)],
                    "MALFORMED: torch.jit.script module with data-dependent prim::If"),
    "not_torchscript": (None, [f32(2, 4)], "MALFORMED: plain text, not a TorchScript archive"),
}


def make_inputs(specs, gen):
    return [torch.randint(s["low"], s["high"], s["shape"], generator=gen)
            if s["dtype"] == "int64" else torch.randn(s["shape"], generator=gen) for s in specs]


def node_kinds(block, kinds):
    for node in block.nodes():
        kinds.add(node.kind())
        for sub in node.blocks():
            node_kinds(sub, kinds)
    return kinds


def write_model(name, args, malformed):
    builder, specs, description = (MALFORMED if malformed else MODELS)[name]
    path = os.path.join(args.out, name + ".pt")
    meta = {"file": name + ".pt", "inputs": specs, "description": description}
    with open(os.path.join(args.out, name + ".json"), "w") as f:
        f.write(json.dumps({**meta, "malformed": True} if malformed else meta, indent=1) + "\n")
    if builder is None:
        with open(path, "w") as f:
            f.write("this is not a TorchScript archive\n")
        print(f"{name:12s} {'-':>10s} params {os.path.getsize(path):9d} bytes  (malformed)")
        return None

    torch.manual_seed(args.seed)
    model = builder()
    # Constant initialisations (torchvision's ViT head is all zeros, every norm's scale all
    # ones and its bias all zeros) would make the checks blind: a zero head passes no gradient
    # to anything before it, and a parameter bound to another of the same constant computes
    # the same numbers. Each becomes its constant plus noise of 0.02.
    with torch.no_grad():
        for p in model.parameters():
            if p.numel() > 1 and bool((p == p.flatten()[0]).all()):
                p.add_(torch.randn_like(p) * 0.02)
    # Train mode so batch norm traces with batch statistics; dropout probabilities are 0.0
    # (assert it) so that a train-mode trace is still deterministic.
    model.train()
    for m in model.modules():
        p = m.p if isinstance(m, nn.modules.dropout._DropoutNd) else getattr(m, "dropout", 0.0)
        assert not isinstance(p, float) or p == 0.0, \
            f"{name}: {type(m).__name__} has dropout {p}, expected 0.0"
    inputs = make_inputs(specs, torch.Generator().manual_seed(args.seed))
    # check_trace=False: the check re-runs the model several times, which is slow and adds
    # nothing here because the load-back comparison below covers it.
    module = torch.jit.script(model) if malformed else \
        torch.jit.trace(model, tuple(inputs), check_trace=False)
    module.save(path)

    nparams = sum(p.numel() for p in model.parameters())  # parameters() dedups tied weights
    loaded = torch.jit.load(path)
    with torch.no_grad():
        diff = (loaded(*inputs) - model(*inputs)).abs().max().item()
    graph = loaded.graph.copy()
    torch._C._jit_pass_inline(graph)
    kinds = node_kinds(graph, set())
    control = sorted(k for k in kinds if k in ("prim::If", "prim::Loop"))
    print(f"{name:12s} {nparams:10d} params {os.path.getsize(path):9d} bytes  "
          f"load-back max abs diff {diff:.3g}")
    if diff > 1e-5:
        print(f"WARNING: {name}: loaded module differs from eager model by {diff:.3g}")
    if control and not malformed:
        print(f"WARNING: {name}: inlined graph has control flow {control}; the importer "
              f"expects a straight-line trace")
    return kinds


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="directory to write NAME.pt / NAME.json into")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="models to write")
    parser.add_argument("--list", action="store_true", help="list model names and exit")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--malformed", action="store_true",
                        help="also write the malformed inputs for the importer's error tests")
    parser.add_argument("--ops", action="store_true", help="print each model's inlined op kinds")
    args = parser.parse_args()

    if args.list:
        for name, (_, _, description) in {**MODELS, **MALFORMED}.items():
            print(f"{name:16s} {description}")
        return 0
    if not args.out:
        parser.error("--out DIR is required")
    names = list(args.only) if args.only else list(MODELS)
    if args.malformed:
        names += [n for n in MALFORMED if n not in names]
    unknown = [n for n in names if n not in MODELS and n not in MALFORMED]
    if unknown:
        parser.error(f"unknown model(s) {unknown}; expected one of {[*MODELS, *MALFORMED]}")

    torch.set_default_dtype(torch.float32)
    # torchvision's ViT checks shapes with torch._assert, which warns under tracing; the check
    # holds for the fixed example shape. Our own models' warnings (other modules) still show.
    warnings.filterwarnings("ignore", category=torch.jit.TracerWarning, module=r"torch$")
    os.makedirs(args.out, exist_ok=True)
    start = time.time()
    for name in names:
        kinds = write_model(name, args, name in MALFORMED)
        if args.ops and kinds is not None:
            print(f"  aten: {' '.join(sorted(k for k in kinds if k.startswith('aten::')))}")
            print(f"  other: {' '.join(sorted(k for k in kinds if not k.startswith('aten::')))}")
    print(f"wrote {len(names)} model(s) to {args.out} in {time.time() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
