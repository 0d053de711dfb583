// The plain LibTorch models the graph workloads are checked against (graph_internal.h),
// written apart from the graphs (graph.cpp): GPT-2 and BERT, the residual MLP, LLaMA.

#include <ATen/ATen.h>

#include <cmath>
#include <limits>

#include "reference/graph_internal.h"
#include "reference/ops.h"

namespace sb::reference {
namespace {

using Dims = std::vector<int64_t>;
using Params = std::map<std::string, at::Tensor>;

at::Tensor layerNormRef(const Params& p, const std::string& name, const at::Tensor& x) {
  return at::layer_norm(x, {x.size(-1)}, p.at(name + ".weight"), p.at(name + ".bias"), 1e-5);
}

at::Tensor linearRef(const Params& p, const std::string& name, const at::Tensor& x) {
  return at::addmm(p.at(name + ".bias"), x, p.at(name + ".weight"));
}

at::Tensor mlpRef(const Params& p, const std::string& h, const at::Tensor& x) {
  return linearRef(p, h + "mlp.proj", at::gelu(linearRef(p, h + "mlp.fc", x)));
}

at::Tensor attentionRef(const Params& p, const std::string& h, const at::Tensor& x,
                        const GraphShape& s, bool causal, uint64_t seed) {
  const int64_t B = s.batch, S = s.seq, H = s.heads, dh = s.dHead();
  const auto heads = [&](const at::Tensor& t) { return t.view({B, S, H, dh}).transpose(1, 2); };
  const at::Tensor q = heads(linearRef(p, h + "attn.q", x)),
                   k = heads(linearRef(p, h + "attn.k", x)),
                   v = heads(linearRef(p, h + "attn.v", x));
  at::Tensor scores =
      at::matmul(q, k.transpose(-1, -2)).mul(1.0 / std::sqrt(static_cast<double>(dh)));
  if (causal) {
    scores = scores.masked_fill(at::ones({S, S}, scores.options().dtype(at::kBool)).triu(1),
                                -std::numeric_limits<double>::infinity());
  }
  at::Tensor probs = at::softmax(scores, -1);
  if (s.dropout > 0) {
    const Dims full = {B * H, S, S};
    probs = probs * dropoutKeepMask(full, {0, 0, 0}, full, seed, s.dropout, probs.scalar_type())
                        .view({B, H, S, S})
                        .mul_(1.0 / (1.0 - s.dropout));
  }
  const at::Tensor ctx = at::matmul(probs, v).transpose(1, 2).reshape({B * S, -1});
  return linearRef(p, h + "attn.proj", ctx);
}

// LLaMA's attention as it is usually written: keys and values repeated per query head.
at::Tensor llamaAttentionRef(const Params& p, const std::string& h, const at::Tensor& x,
                             const GraphShape& s) {
  const int64_t B = s.batch, S = s.seq, H = s.heads, Hk = s.kvHeads, dh = s.dHead();
  const auto proj = [&](const std::string& name, const at::Tensor& t) {
    return at::mm(t, p.at(h + name + ".weight"));
  };
  const at::Tensor q = rotary(proj("attn.q", x).view({B, S, H, dh}), 0, 10000.0).transpose(1, 2);
  at::Tensor k = rotary(proj("attn.k", x).view({B, S, Hk, dh}), 0, 10000.0);
  at::Tensor v = proj("attn.v", x).view({B, S, Hk, dh});
  k = k.repeat_interleave(H / Hk, 2).transpose(1, 2);
  v = v.repeat_interleave(H / Hk, 2).transpose(1, 2);
  at::Tensor scores =
      at::matmul(q, k.transpose(-1, -2)).mul(1.0 / std::sqrt(static_cast<double>(dh)));
  scores = scores.masked_fill(at::ones({S, S}, scores.options().dtype(at::kBool)).triu(1),
                              -std::numeric_limits<double>::infinity());
  const at::Tensor ctx =
      at::matmul(at::softmax(scores, -1), v).transpose(1, 2).reshape({B * S, H * dh});
  return proj("attn.proj", ctx);
}

at::Tensor llamaRef(const GraphShape& s, const Params& p,
                    const std::map<std::string, at::Tensor>& in) {
  const auto norm = [&](const std::string& name, const at::Tensor& t) {
    return rmsNorm(t, p.at(name + ".weight"));
  };
  at::Tensor x = at::embedding(p.at("wte"), in.at("ids"));
  for (int l = 0; l < s.layers; ++l) {
    const std::string h = "h" + std::to_string(l) + ".";
    x = x + llamaAttentionRef(p, h, norm(h + "ln_1", x), s);
    const at::Tensor y = norm(h + "ln_2", x);
    const at::Tensor gated =
        at::silu(at::mm(y, p.at(h + "mlp.gate.weight"))) * at::mm(y, p.at(h + "mlp.up.weight"));
    x = x + at::mm(gated, p.at(h + "mlp.down.weight"));
  }
  return at::mm(norm("ln_f", x), p.at("lm_head.weight"));
}

}  // namespace

at::Tensor graphModelRef(const std::string& workload, const GraphShape& s, const Params& p,
                         const std::map<std::string, at::Tensor>& in, uint64_t seed) {
  if (workload == "llama") return llamaRef(s, p, in);
  if (workload == "mlp") {
    at::Tensor x = in.at("x");
    for (int l = 0; l < s.layers; ++l) {
      const std::string h = "h" + std::to_string(l) + ".";
      x = x + mlpRef(p, h, x);
    }
    return x;
  }
  const bool encoder = workload == "bert";
  at::Tensor x =
      at::embedding(p.at("wte"), in.at("ids")) + at::embedding(p.at("wpe"), in.at("positions"));
  if (encoder) x = layerNormRef(p, "ln_emb", x);
  for (int l = 0; l < s.layers; ++l) {
    const std::string h = "h" + std::to_string(l) + ".";
    const uint64_t ds = seed + 1 + static_cast<uint64_t>(l);
    if (encoder) {
      x = layerNormRef(p, h + "ln_1", x + attentionRef(p, h, x, s, false, ds));
      x = layerNormRef(p, h + "ln_2", x + mlpRef(p, h, x));
    } else {
      x = x + attentionRef(p, h, layerNormRef(p, h + "ln_1", x), s, true, ds);
      x = x + mlpRef(p, h, layerNormRef(p, h + "ln_2", x));
    }
  }
  if (encoder) return x;
  return at::addmm(p.at("lm_head.bias"), layerNormRef(p, "ln_f", x), p.at("wte").t());
}

}  // namespace sb::reference
