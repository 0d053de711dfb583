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
       [--list] [--seed N] [--malformed] [--zoo] [--ops]
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
    def __init__(self, d, heads, max_seq, dropout=0.0):
        super().__init__()
        # With dropout (HF GPT-2's attn_pdrop and resid_pdrop): the attention's probabilities
        # and the projection's output dropped in training.
        self.dropout = dropout
        # Head sizes from the config, not from x.shape: shape-derived scalars would trace as
        # aten::size chains and the 1/sqrt(dh) scale as a traced tensor.
        self.d, self.heads, self.dh = d, heads, d // heads
        # One fused qkv projection, as GPT-2 does: the importer must see through the split.
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)
        self.register_buffer("bias", torch.tril(torch.ones(max_seq, max_seq, dtype=torch.bool)))

    def forward(self, x):
        B, S, _ = x.shape
        q, k, v = self.c_attn(x).split(self.d, dim=-1)
        q, k, v = (t.view(B, S, self.heads, self.dh).transpose(1, 2) for t in (q, k, v))
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.dh)
        scores = scores.masked_fill(~self.bias[:S, :S], float("-inf"))
        probs = scores.softmax(dim=-1)
        if self.dropout:
            probs = nn.functional.dropout(probs, self.dropout, self.training)
        # Width from the config too: a tensor-parallel rank's attention is its share of the
        # heads (builtin_strategies.py divides heads and d), its input still the full width.
        y = self.c_proj((probs @ v).transpose(1, 2).contiguous().view(B, S, self.d))
        return nn.functional.dropout(y, self.dropout, self.training) if self.dropout else y


class GPT2Block(nn.Module):
    def __init__(self, d, heads, max_seq, dropout=0.0):
        super().__init__()
        self.ln_1, self.attn = nn.LayerNorm(d), GPT2Attention(d, heads, max_seq, dropout)
        self.ln_2 = nn.LayerNorm(d)
        layers = OrderedDict(c_fc=nn.Linear(d, 4 * d), act=nn.GELU(), c_proj=nn.Linear(4 * d, d))
        if dropout:
            layers["dropout"] = nn.Dropout(dropout)
        self.mlp = nn.Sequential(layers)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2(nn.Module):
    def __init__(self, vocab, max_seq, d, heads, layers, dropout=0.0):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(max_seq, d)
        self.h = nn.ModuleList(GPT2Block(d, heads, max_seq, dropout) for _ in range(layers))
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


# ---- The zoo: models as users write them, for the family-by-model table (ci/zoo_test.sh).
# ---- None of the suites' own checks was written against them.
class EncoderClassifier(nn.Module):
    """nn.TransformerEncoder (post- or pre-norm) over [B, T, d] features, mean-pooled, a head."""

    def __init__(self, d, heads, hidden, layers, classes, norm_first):
        super().__init__()
        layer = nn.TransformerEncoderLayer(d, heads, hidden, dropout=0.0, batch_first=True,
                                           norm_first=norm_first, activation="gelu")
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d, classes)

    def forward(self, x):
        return self.head(self.encoder(x).mean(1))


class CausalSelfAttention(nn.Module):
    """nn.MultiheadAttention with a causal mask (a bool buffer), a residual and a projection."""

    def __init__(self, d, heads, seq):
        super().__init__()
        self.attn = nn.MultiheadAttention(d, heads, dropout=0.0, batch_first=True)
        self.register_buffer("mask", torch.ones(seq, seq, dtype=torch.bool).triu(1))
        self.proj = nn.Linear(d, d)

    def forward(self, x):
        y, _ = self.attn(x, x, x, attn_mask=self.mask, need_weights=False)
        return self.proj(x + y)


class PaddedAttention(nn.Module):
    """nn.MultiheadAttention whose key-padding mask comes from a second input (token ids: id 0 is
    padding, the first position never is), the way a batch of uneven sequences arrives."""

    def __init__(self, d, heads):
        super().__init__()
        self.attn = nn.MultiheadAttention(d, heads, dropout=0.0, batch_first=True)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, 4)

    def forward(self, x, ids):
        first = torch.arange(ids.shape[1]) == 0
        pad = (ids == 0) & ~first
        y, _ = self.attn(x, x, x, key_padding_mask=pad, need_weights=False)
        return self.head(self.norm(x + y))


class MetaRMSNorm(nn.Module):
    """RMSNorm as Meta's reference code writes it."""

    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class MetaAttention(nn.Module):
    """Grouped-query attention as Meta's code writes it: repeat_interleave of the kv heads, the
    causal mask added as -inf, and rotary embeddings either as complex numbers
    (view_as_complex, as llama's reference does) or as real cos/sin arithmetic."""

    def __init__(self, d, heads, kv_heads, seq, complex_rope):
        super().__init__()
        self.heads, self.kv_heads, self.dh = heads, kv_heads, d // heads
        self.complex_rope = complex_rope
        self.wq = nn.Linear(d, d, bias=False)
        self.wk = nn.Linear(d, kv_heads * self.dh, bias=False)
        self.wv = nn.Linear(d, kv_heads * self.dh, bias=False)
        self.wo = nn.Linear(d, d, bias=False)
        freqs = 1.0 / (10000.0 ** (torch.arange(0, self.dh, 2).float() / self.dh))
        angles = torch.outer(torch.arange(seq).float(), freqs)
        self.register_buffer("cos", angles.cos())
        self.register_buffer("sin", angles.sin())
        self.register_buffer("mask", torch.full((seq, seq), float("-inf")).triu(1))

    def rope(self, x):
        B, T, H, D = x.shape
        if self.complex_rope:
            xc = torch.view_as_complex(x.float().reshape(B, T, H, D // 2, 2))
            freqs = torch.complex(self.cos, self.sin).view(1, T, 1, D // 2)
            return torch.view_as_real(xc * freqs).flatten(3).type_as(x)
        xr = x.reshape(B, T, H, D // 2, 2)
        a, b = xr[..., 0], xr[..., 1]
        c, s = self.cos.view(1, T, 1, D // 2), self.sin.view(1, T, 1, D // 2)
        return torch.stack([a * c - b * s, a * s + b * c], -1).flatten(3)

    def forward(self, x, bias=None):
        B, T, _ = x.shape
        q = self.rope(self.wq(x).view(B, T, self.heads, self.dh))
        k = self.rope(self.wk(x).view(B, T, self.kv_heads, self.dh))
        v = self.wv(x).view(B, T, self.kv_heads, self.dh)
        rep = self.heads // self.kv_heads
        k = torch.repeat_interleave(k, rep, dim=2)
        v = torch.repeat_interleave(v, rep, dim=2)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        scores = q @ k.transpose(2, 3) / math.sqrt(self.dh) + self.mask
        if bias is not None:  # a key-padding bias from an attention-mask input
            scores = scores + bias
        out = F.softmax(scores.float(), dim=-1).type_as(q) @ v
        return self.wo(out.transpose(1, 2).contiguous().view(B, T, -1))


class MetaBlock(nn.Module):
    def __init__(self, d, heads, kv_heads, hidden, seq, complex_rope):
        super().__init__()
        self.attention = MetaAttention(d, heads, kv_heads, seq, complex_rope)
        self.w1 = nn.Linear(d, hidden, bias=False)
        self.w2 = nn.Linear(hidden, d, bias=False)
        self.w3 = nn.Linear(d, hidden, bias=False)
        self.attention_norm = MetaRMSNorm(d)
        self.ffn_norm = MetaRMSNorm(d)

    def forward(self, x, bias=None):
        y = self.attention_norm(x)
        # Without a bias the attention is called as traced models call it: one argument.
        h = x + (self.attention(y) if bias is None else self.attention(y, bias))
        y = self.ffn_norm(h)
        return h + self.w2(F.silu(self.w1(y)) * self.w3(y))


class MetaLlama(nn.Module):
    def __init__(self, vocab, seq, d, heads, kv_heads, hidden, layers, complex_rope):
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(
            [MetaBlock(d, heads, kv_heads, hidden, seq, complex_rope) for _ in range(layers)])
        self.norm = MetaRMSNorm(d)
        self.output = nn.Linear(d, vocab, bias=False)

    def forward(self, ids):
        h = self.tok_embeddings(ids)
        for layer in self.layers:
            h = layer(h)
        return self.output(self.norm(h)).float()


class MaskedLlama(MetaLlama):
    """MetaLlama with an attention mask as a second input (1 a token, 0 padding), as Hugging
    Face's models take one: a key-padding bias of -1e4."""

    def __init__(self, vocab, seq, d, heads, kv_heads, hidden, layers):
        super().__init__(vocab, seq, d, heads, kv_heads, hidden, layers, complex_rope=False)

    def forward(self, ids, attention_mask):
        bias = (1.0 - attention_mask.to(torch.float32))[:, None, None, :] * -1e4
        h = self.tok_embeddings(ids)
        for layer in self.layers:
            h = layer(h, bias)
        return self.output(self.norm(h))


class MoEBlock(nn.Module):
    """A mixture-of-experts feed-forward block: a linear router, softmax, top-k experts per token
    with their gates renormalised, SwiGLU experts, a residual. Every expert runs every token and
    is weighted by its gate (0 where not chosen): the dense form of top-k routing, without
    capacity limits, whose numbers a dispatching implementation must equal."""

    def __init__(self, d, hidden, experts, top_k):
        super().__init__()
        self.top_k = top_k
        self.norm = nn.LayerNorm(d)
        self.router = nn.Linear(d, experts, bias=False)
        self.experts = nn.ModuleList([nn.ModuleDict({
            "w1": nn.Linear(d, hidden, bias=False), "w2": nn.Linear(hidden, d, bias=False),
            "w3": nn.Linear(d, hidden, bias=False)}) for _ in range(experts)])

    def forward(self, x):
        y = self.norm(x)
        probs = F.softmax(self.router(y), dim=-1)
        top, index = torch.topk(probs, self.top_k, dim=-1)
        top = top / top.sum(-1, keepdim=True)
        out = x
        for e, expert in enumerate(self.experts):
            gate = (top * (index == e).to(top.dtype)).sum(-1, keepdim=True)
            out = out + gate * expert["w2"](F.silu(expert["w1"](y)) * expert["w3"](y))
        return out


class RecurrentClassifier(nn.Module):
    """An LSTM or GRU over [B, T, features], its last step's hidden state to a head."""

    def __init__(self, cell, features, hidden, classes):
        super().__init__()
        self.rnn = cell(features, hidden, batch_first=True)
        self.head = nn.Linear(hidden, classes)

    def forward(self, x):
        out, _ = self.rnn(x)
        return self.head(out[:, -1])


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
    # The same with HF GPT-2's dropout (0.1 on the attention's probabilities, after each
    # projection and the MLP), traced in training: a model that draws random numbers (shape key
    # random: true), run by the executors that repeat its draws (torch/checkpoint, torch/sac).
    "gpt2_dropout": (lambda: GPT2(vocab=64, max_seq=16, d=32, heads=4, layers=2, dropout=0.1),
                     [ids(4, 16, 64)], "GPT-2 style decoder with dropout 0.1 (attention "
                     "probabilities, projections, MLP), traced in training"),
    "gpt2_12": (lambda: GPT2(vocab=64, max_seq=16, d=64, heads=4, layers=12), [ids(2, 16, 64)],
                "GPT-2 style decoder, 12 layers (import-speed benchmark): vocab 64, seq 16, "
                "d 64, 4 heads, tied lm_head"),
    "llama": (lambda: Llama(vocab=64, max_seq=16, d=32, heads=4, kv_heads=2, hidden=64,
                            layers=2), [ids(2, 16, 64)],
              "LLaMA style decoder: vocab 64, seq 16, d 32, 4 heads, 2 kv heads (GQA), "
              "SwiGLU hidden 64, RoPE, RMSNorm, 2 layers, untied lm_head"),
    # Meta's LLaMA (also in the zoo): the model the torch/* executors' TP and SP plans target.
    "meta_llama": (lambda: MetaLlama(64, 16, 32, 4, 2, 64, 2, complex_rope=False),
                   [ids(4, 16, 64)], "LLaMA as Meta's code writes it: rsqrt RMSNorm, "
                   "repeat_interleave GQA, -inf mask added, real rotary, SwiGLU, 2 layers"),
    "mlp_cumsum": (MlpCumsum, [f32(4, 16)],
                   "Linear(16,32) -> cumsum(-1) -> tanh -> Linear(32,16); cumsum has no "
                   "sharding strategy, so it must run replicated"),
}
# The models that draw random numbers in training (dropout), on purpose.
RANDOM = {"gpt2_dropout"}
# The zoo (--zoo): models no suite check was written against, traced for ci/zoo_test.sh's table
# of model x family. Small shapes, so that every family runs on each in CI; the CNNs' images
# are 64x64 in batches of 4 so that their last batch norms normalise over 16 values per
# channel, not over 2 (32x32 images end at 1x1: statistics of two numbers amplify rounding
# past any tolerance, the module's own float32 against itself in float64).
def _convnext_small():
    from torchvision.models.convnext import CNBlockConfig, ConvNeXt
    return ConvNeXt([CNBlockConfig(16, 32, 1), CNBlockConfig(32, None, 1)],
                    stochastic_depth_prob=0.0, num_classes=10)


def _efficientnet_b0():
    from torchvision.models.efficientnet import EfficientNet, _efficientnet_conf
    setting, last = _efficientnet_conf("efficientnet_b0", width_mult=1.0, depth_mult=1.0)
    return EfficientNet(setting, dropout=0.0, stochastic_depth_prob=0.0, num_classes=10,
                        last_channel=last)


ZOO = {
    "mobilenet_v3_small": (lambda: torchvision.models.mobilenet_v3_small(num_classes=10,
                                                                          dropout=0.0),
                           [f32(4, 3, 64, 64)], "torchvision mobilenet_v3_small (SE blocks, "
                           "hardswish, depthwise convs), 10 classes"),
    "efficientnet_b0": (_efficientnet_b0, [f32(4, 3, 64, 64)],
        "torchvision efficientnet_b0 (MBConv, SiLU, SE), 10 classes"),
    "shufflenet_v2": (lambda: torchvision.models.shufflenet_v2_x0_5(num_classes=10),
                      [f32(4, 3, 64, 64)], "torchvision shufflenet_v2_x0_5 (channel shuffle), "
                      "10 classes"),
    "squeezenet": (lambda: torchvision.models.squeezenet1_1(num_classes=10, dropout=0.0),
                   [f32(4, 3, 64, 64)], "torchvision squeezenet1_1 (fire modules, concat), "
                   "10 classes"),
    "regnet_y": (lambda: torchvision.models.regnet_y_400mf(num_classes=10), [f32(4, 3, 64, 64)],
                 "torchvision regnet_y_400mf (grouped convs, SE), 10 classes"),
    "convnext": (_convnext_small, [f32(4, 3, 32, 32)],
                 "torchvision ConvNeXt, 2 stages of 1 block (16, 32 channels): depthwise 7x7, "
                 "permuted LayerNorm, layer scale"),
    "mnasnet": (lambda: torchvision.models.mnasnet0_5(num_classes=10, dropout=0.0),
                [f32(4, 3, 64, 64)], "torchvision mnasnet0_5, 10 classes"),
    "encoder_post": (lambda: EncoderClassifier(32, 4, 64, 2, 10, norm_first=False),
                     [f32(4, 16, 32)], "nn.TransformerEncoder, post-norm, d 32, 4 heads, "
                     "ff 64, 2 layers, GELU, mean-pooled head"),
    "encoder_pre": (lambda: EncoderClassifier(32, 4, 64, 2, 10, norm_first=True),
                    [f32(4, 16, 32)], "nn.TransformerEncoder, pre-norm, d 32, 4 heads, ff 64, "
                    "2 layers, GELU, mean-pooled head"),
    "mha_causal": (lambda: CausalSelfAttention(32, 4, 16), [f32(4, 16, 32)],
                   "nn.MultiheadAttention with a causal bool mask, residual, projection"),
    "mha_padding": (lambda: PaddedAttention(32, 4), [f32(4, 16, 32), ids(4, 16, 4)],
                    "nn.MultiheadAttention with a key-padding mask from a second input (ids)"),
    "meta_llama": (lambda: MetaLlama(64, 16, 32, 4, 2, 64, 2, complex_rope=False),
                   [ids(4, 16, 64)], "LLaMA as Meta's code writes it: rsqrt RMSNorm, "
                   "repeat_interleave GQA, -inf mask added, real rotary, SwiGLU, 2 layers"),
    "meta_llama_complex": (lambda: MetaLlama(64, 16, 32, 4, 2, 64, 2, complex_rope=True),
                           [ids(4, 16, 64)], "meta_llama with rotary as complex numbers "
                           "(view_as_complex / view_as_real)"),
    "lstm": (lambda: RecurrentClassifier(nn.LSTM, 16, 32, 10), [f32(4, 8, 16)],
             "nn.LSTM(16, 32) over 8 steps, the last step to a head"),
    "gru": (lambda: RecurrentClassifier(nn.GRU, 16, 32, 10), [f32(4, 8, 16)],
            "nn.GRU(16, 32) over 8 steps, the last step to a head"),
}

MALFORMED = {
    "scripted_if": (ScriptedIf, [f32(2, 4)],
                    "MALFORMED: torch.jit.script module with data-dependent prim::If"),
    "not_torchscript": (None, [f32(2, 4)], "MALFORMED: plain text, not a TorchScript archive"),
}


# torch.export archives (--export, PyTorch 2.x): NAME.pt2 with a dynamic batch dimension (so a
# case runs them at a data-parallel rank's or a micro-batch's rows), NAME.pt2.json (the case's
# inputs) and NAME.pt2.expected.safetensors: the exported program's own numbers, computed here by
# PyTorch (reference/torchscript/export.h says how the importer checks them).
EXPORTS = {
    "resnet18": (lambda: torchvision.models.resnet18(num_classes=10), [f32(4, 3, 32, 32)],
                 "torchvision resnet18, 10 classes, 32x32 images (batch norm in training)"),
    "mobilenet_v3_small": (lambda: torchvision.models.mobilenet_v3_small(num_classes=10,
                                                                          dropout=0.0),
                           [f32(4, 3, 64, 64)], "torchvision mobilenet_v3_small, 10 classes"),
    "gpt2": (lambda: GPT2(vocab=64, max_seq=16, d=32, heads=4, layers=2), [ids(4, 16, 64)],
             "GPT-2 style decoder: vocab 64, seq 16, d 32, 4 heads, 2 layers, tied head"),
    "meta_llama": (lambda: MetaLlama(64, 16, 32, 4, 2, 64, 2, complex_rope=False),
                   [ids(4, 16, 64)], "LLaMA as Meta's code writes it, 2 layers"),
    "llama_masked": (lambda: MaskedLlama(64, 16, 32, 4, 2, 64, 2),
                     [ids(4, 16, 64), ids(4, 16, 2)],
                     "LLaMA blocks with an attention mask as a second input (0 pads a key)"),
    "moe": (lambda: MoEBlock(32, 64, 4, 2), [f32(4, 8, 32)],
            "mixture-of-experts block: router, softmax, top-2 of 4 SwiGLU experts, residual"),
    # Decomposed to core ATen (ep.run_decompositions()): convolution, addmm over permute,
    # _native_batch_norm_legit_functional whose new statistics are buffer-mutation outputs.
    "resnet18_core": (lambda: torchvision.models.resnet18(num_classes=10), [f32(4, 3, 32, 32)],
                      "resnet18 decomposed to core ATen (functional batch norm)"),
}
EXPORT_STEPS, EXPORT_LR = 3, 0.001


def export_model(name, args):
    """Writes NAME.pt2, NAME.pt2.json and NAME.pt2.expected.safetensors (export.h)."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import copy
    import tensor_bundle
    builder, specs, description = EXPORTS[name]
    torch.manual_seed(args.seed)
    model = builder()
    with torch.no_grad():  # constant initialisations made distinct, as for the traces
        for p in model.parameters():
            if p.numel() > 1 and bool((p == p.flatten()[0]).all()):
                p.add_(torch.randn_like(p) * 0.02)
    model.train()
    inputs = make_inputs(specs, torch.Generator().manual_seed(args.seed))
    batch = torch.export.Dim("batch", min=2, max=1024)
    try:
        ep = torch.export.export(copy.deepcopy(model), tuple(inputs),
                                 dynamic_shapes=tuple({0: batch} for _ in inputs))
        dynamic = True
    except Exception as e:  # a model that fixes its batch size: exported at its own
        print(f"{name}: no dynamic batch dimension ({type(e).__name__}: "
              f"{str(e).splitlines()[0][:120]}); exported static")
        ep = torch.export.export(copy.deepcopy(model), tuple(inputs))
        dynamic = False
    path = os.path.join(args.out, name + ".pt2")
    numbers_from = path
    if name.endswith("_core"):
        # PyTorch cannot train a decomposed program whose batch norm updates its statistics
        # (ep.module()'s backward meets the buffer copied into after the functional operator
        # saved it): its numbers come from the same program before decomposition.
        numbers_from = path + ".training-ir.pt2"
        torch.export.save(ep, numbers_from)
        program = ep.module()
        ep = ep.run_decompositions()
    else:
        program = None
    torch.export.save(ep, path)
    with open(path + ".json", "w") as f:
        f.write(json.dumps({"file": name + ".pt2", "inputs": specs, "description": description,
                            "dynamic_batch": dynamic,
                            "python": {"source": os.path.abspath(__file__), "model": name}},
                           indent=1) + "\n")
    # The program's own numbers: its module (ep.module(), what torch.export.load gives back) run
    # forward and backward on the example inputs, and EXPORT_STEPS steps of plain SGD on
    # sum(output * grad_output).
    program = program or ep.module()
    out = program(*inputs)
    gen = torch.Generator().manual_seed(args.seed + 1)
    grad_output = torch.randn(out.shape, generator=gen, dtype=out.dtype)
    params = dict(program.named_parameters())
    grads = torch.autograd.grad((out * grad_output).sum(), list(params.values()),
                                allow_unused=True)
    expected = {f"input/{i}": t for i, t in enumerate(inputs)}
    expected.update({"grad_output": grad_output, "output": out.detach()})
    for (pname, _), g in zip(params.items(), grads):
        if g is not None:
            expected[f"grad/{pname}"] = g
    stepped = torch.export.load(numbers_from).module()
    sgd = torch.optim.SGD(stepped.parameters(), lr=EXPORT_LR)
    losses = []
    for _ in range(EXPORT_STEPS):
        sgd.zero_grad()
        loss = (stepped(*inputs) * grad_output).sum()
        loss.backward()
        sgd.step()
        losses.append(loss.item())
    expected["losses"] = torch.tensor(losses, dtype=torch.float64)
    if numbers_from != path:
        os.remove(numbers_from)
    tensor_bundle.write(path + ".expected.safetensors", expected,
                        {"lr": str(EXPORT_LR), "steps": str(EXPORT_STEPS),
                         "torch": torch.__version__})
    print(f"{name:18s} exported {os.path.getsize(path):9d} bytes  "
          f"{len(ep.graph.nodes):5d} fx nodes  batch {'dynamic' if dynamic else 'static'}")


def build_model(name):
    """The nn.Module `name` is traced from, before its parameters are set: what a PyTorch-side
    executor (strategies/torch/rank_runner.py) builds and loads the harness's parameters into."""
    known = {**MODELS, **ZOO, **EXPORTS}
    if name not in known:
        raise ValueError(f"unknown model '{name}'; expected one of {[*known]}")
    return known[name][0]()


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
    builder, specs, description = (MALFORMED if malformed else {**MODELS, **ZOO})[name]
    path = os.path.join(args.out, name + ".pt")
    meta = {"file": name + ".pt", "inputs": specs, "description": description,
            # Where the module comes from, for the torch/* executors (build_model above).
            "python": {"source": os.path.abspath(__file__), "model": name}}
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
    # (assert it) so that a train-mode trace is still deterministic, except in the models that
    # draw random numbers on purpose (RANDOM: run with shape key random: true).
    model.train()
    for m in model.modules():
        p = m.p if isinstance(m, nn.modules.dropout._DropoutNd) else getattr(m, "dropout", 0.0)
        assert not isinstance(p, float) or p == 0.0 or name in RANDOM, \
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
        torch.manual_seed(1)  # the same draws for both, where the model draws
        ours = loaded(*inputs)
        torch.manual_seed(1)
        diff = (ours - model(*inputs)).abs().max().item()
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
    parser.add_argument("--zoo", action="store_true",
                        help="write the zoo (models no suite check was written against) instead")
    parser.add_argument("--ops", action="store_true", help="print each model's inlined op kinds")
    parser.add_argument("--export", action="store_true",
                        help="write torch.export archives (PyTorch 2.x) of EXPORTS instead")
    args = parser.parse_args()

    if args.export:
        if not hasattr(torch, "export") or not hasattr(torch.export, "save"):
            sys.exit(f"trace_models.py: --export needs PyTorch 2.x's torch.export; "
                     f"{sys.executable} has PyTorch {torch.__version__}")
        if args.list:
            for name, (_, _, description) in EXPORTS.items():
                print(f"{name:18s} {description}")
            return 0
        if not args.out:
            parser.error("--out DIR is required")
        names = list(args.only) if args.only else list(EXPORTS)
        unknown = [n for n in names if n not in EXPORTS]
        if unknown:
            parser.error(f"unknown export(s) {unknown}; expected one of {[*EXPORTS]}")
        os.makedirs(args.out, exist_ok=True)
        start = time.time()
        for name in names:
            export_model(name, args)
        print(f"exported {len(names)} model(s) to {args.out} in {time.time() - start:.1f} s")
        return 0

    if args.list:
        for name, (_, _, description) in (ZOO if args.zoo else {**MODELS, **MALFORMED}).items():
            print(f"{name:16s} {description}")
        return 0
    if not args.out:
        parser.error("--out DIR is required")
    names = list(args.only) if args.only else list(ZOO if args.zoo else MODELS)
    if args.malformed:
        names += [n for n in MALFORMED if n not in names]
    known = {**MODELS, **ZOO, **MALFORMED}
    unknown = [n for n in names if n not in known]
    if unknown:
        parser.error(f"unknown model(s) {unknown}; expected one of {[*known]}")

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
