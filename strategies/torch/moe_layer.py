"""A mixture-of-experts layer as a PyTorch user writes one (torchtitan's MoE: a token-choice
router, grouped experts called on the rows sorted by expert), the model torch/ep runs when a moe
case names none (params.model "file.py:name" names a user's; docs/moe.md, "PyTorch's MoE layer
under EP"). Its semantics are stratbench's moe workload's (reference/moe.h), dropless.

What torch/ep relies on in a layer (this one, or a user's):
  constructor        called with the case's shape as a dict of the moe workload's keys
                     (batch, seq, d_model, ffn, experts, top_k, score, norm_topk, aux_coef)
  forward(x)         x [T, d_model], the rank's tokens -> (output [T, d_model], aux): aux is this
                     rank's share of the load-balancing loss (the shares sum to the batch's)
  experts            a submodule called as experts(rows, num_tokens_per_expert): rows [R, d_model]
                     grouped by expert in expert order, the counts per expert [E]; its
                     parameters w1, w3 [E, ffn, d_model] and w2 [E, d_model, ffn] may be DTensors
                     sharded on dim 0 (it computes with their local pieces). Expert parallelism
                     wraps exactly this call: the rows go to the experts' ranks and come back.
  routing            set by forward: expert_index [T, k] (each token's top-k experts), kept
                     [T, k] (1 where an assignment was computed: all of them, dropless) and
                     tokens_per_expert [E] (its tokens' assignments per expert)
  aux_group          None, or the process group the batch is split over: the load-balancing
                     loss's counts and token total are then the whole batch's (Megatron's
                     global load balancing), each rank's share from its own scores
  REFERENCE_NAMES    (optional) the module's parameter name of each of the reference's: router,
                     w1, w3, w2; by default torchtitan's (router.gate.weight, experts.w1, ...)
"""

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


def local(t):
    return t.to_local() if hasattr(t, "to_local") else t


class TokenChoiceRouter(nn.Module):
    def __init__(self, dim, experts, top_k, score, norm_topk):
        super().__init__()
        self.gate = nn.Linear(dim, experts, bias=False)
        self.top_k, self.score, self.norm_topk = top_k, score, norm_topk

    def forward(self, x):
        logits = self.gate(x)
        probs = torch.sigmoid(logits) if self.score == "sigmoid" else torch.softmax(logits, -1)
        gates, index = probs.topk(self.top_k, dim=-1)
        if self.norm_topk:
            gates = gates / gates.sum(-1, keepdim=True)
        return probs, gates, index


class GroupedExperts(nn.Module):
    """E SwiGLU experts, down(silu(gate x) * up x), each on its contiguous run of the rows."""

    def __init__(self, dim, hidden, experts):
        super().__init__()
        self.w1 = nn.Parameter(torch.empty(experts, hidden, dim))
        self.w3 = nn.Parameter(torch.empty(experts, hidden, dim))
        self.w2 = nn.Parameter(torch.empty(experts, dim, hidden))

    def forward(self, rows, num_tokens_per_expert):
        w1, w3, w2 = local(self.w1), local(self.w3), local(self.w2)
        counts = [int(n) for n in num_tokens_per_expert.tolist()]
        if len(counts) != w1.shape[0]:
            raise ValueError(f"{len(counts)} counts for {w1.shape[0]} experts")
        outs = []
        for e, x in enumerate(torch.split(rows, counts)):
            outs.append(F.linear(F.silu(F.linear(x, w1[e])) * F.linear(x, w3[e]), w2[e]))
        return torch.cat(outs) if outs else rows.new_zeros((0, w2.shape[1]))


class MoE(nn.Module):
    def __init__(self, shape):
        super().__init__()
        self.experts_n = int(shape.get("experts", 4))
        self.top_k = int(shape.get("top_k", 2))
        self.score = shape.get("score", "softmax")
        dim, hidden = int(shape.get("d_model", 16)), int(shape.get("ffn", 32))
        self.router = TokenChoiceRouter(dim, self.experts_n, self.top_k, self.score,
                                        bool(shape.get("norm_topk", False)))
        self.experts = GroupedExperts(dim, hidden, self.experts_n)
        self.aux_group = None
        self.routing = {}

    def forward(self, x):
        T, k, E = x.shape[0], self.top_k, self.experts_n
        probs, gates, index = self.router(x)
        flat = index.reshape(-1)
        # The assignments by expert, then token, then slot (a stable sort of t k + j).
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=E)
        token = order // k
        out = self.experts(x[token], counts)
        weighted = out * gates.reshape(-1)[order].unsqueeze(1)
        # Each token's experts added in expert order (the order of `order`), as the reference.
        y = torch.zeros_like(x).index_add(0, token, weighted)

        # Switch's load-balancing loss: E x sum_e f_e P_e over the batch (over aux_group's
        # ranks where the batch is split): f_e the share of the assignments routed to e, P_e the
        # mean of e's score (sigmoid scores normalised per token first).
        routed = counts.to(torch.float64)
        tokens = torch.tensor([float(T)], dtype=torch.float64)
        if self.aux_group is not None:
            both = torch.cat([routed, tokens])
            dist.all_reduce(both, group=self.aux_group)
            routed, tokens = both[:E], both[E:]
        total = tokens.item()
        f = routed.to(x.dtype) / (total * k)
        p = probs / probs.sum(-1, keepdim=True) if self.score == "sigmoid" else probs
        aux = E * (f * (p.sum(0) / total)).sum()
        self.routing = {"expert_index": index.detach(),
                        "kept": torch.ones(T, k, dtype=torch.float64),
                        "tokens_per_expert": counts.detach().to(torch.float64)}
        return y, aux

