#include "reference/graph.h"

#include "reference/graph_internal.h"

#include "reference/torchscript/import.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

namespace sb::reference {
namespace {

using Dims = std::vector<int64_t>;

int64_t shapeInt(const nlohmann::json& shape, const std::string& workload, const std::string& key,
                 int64_t fallback) {
  if (!shape.contains(key)) return fallback;
  const auto& v = shape.at(key);
  if (!v.is_number_integer() || v.get<int64_t>() <= 0 || v.get<int64_t>() > (1 << 24)) {
    throw std::invalid_argument(workload + ": shape key '" + key +
                                "' must be a positive integer, got " + v.dump());
  }
  return v.get<int64_t>();
}

// Builds a graph node by node; inside a block, names are prefixed with "h<layer>.".
class Builder {
 public:
  explicit Builder(Graph& g) : g_(g) {}

  void block(int layer) { layer_ = layer; }
  std::string prefix() const { return layer_ < 0 ? "" : "h" + std::to_string(layer_) + "."; }

  std::string param(const std::string& name, Dims dims) {
    const std::string full = prefix() + name;
    g_.parameters.emplace_back(full, std::move(dims));
    return full;
  }

  // One node; returns its first output's value name.
  std::string node(const std::string& role, nlohmann::json shape, std::vector<std::string> args,
                   uint64_t seedOffset = 0) {
    GraphNode n;
    n.name = prefix() + role;
    n.role = role;
    n.layer = layer_;
    n.shape = OpShape::parse(shape);
    n.args = std::move(args);
    n.seedOffset = seedOffset;
    TORCH_INTERNAL_ASSERT(n.args.size() == n.shape.operands().size(), n.name, ": ", n.args.size(),
                          " arguments for operands of ", n.shape.toString());
    g_.nodes.push_back(n);
    return n.outputs()[0];
  }

  std::string layerNorm(const std::string& role, const std::string& x, const Dims& shape) {
    const int64_t d = shape.back();
    return node(role, {{"op", "layer_norm"}, {"input", shape}},
                {x, param(role + ".weight", {d}), param(role + ".bias", {d})});
  }

  std::string linear(const std::string& role, const std::string& x, int64_t rows, int64_t in,
                     int64_t out) {
    return node(role, {{"op", "addmm"}, {"input", {rows, in}}, {"other", {in, out}}},
                {x, param(role + ".weight", {in, out}), param(role + ".bias", {out})});
  }

  // [T, D] -> [B, H, S, dh] (or [B, H, dh, S] for keys), through [B, S, H, dh]: the permuted
  // heads made contiguous for the batched matmul (the copy bmm's flattening view makes), with
  // the batch and the heads two dimensions a plan can split on different mesh axes.
  std::string heads(const std::string& what, const std::string& x, const GraphShape& s, bool keys) {
    const int64_t B = s.batch, S = s.seq, H = s.heads, dh = s.dHead();
    const std::string v =
        node("attn." + what + "_view",
             {{"op", "view"}, {"input", {B * S, H * dh}}, {"size", {B, S, H, dh}}}, {x});
    const Dims perm = keys ? Dims{0, 2, 3, 1} : Dims{0, 2, 1, 3};
    const std::string p = node("attn." + what + "_heads",
                               {{"op", "permute"}, {"input", {B, S, H, dh}}, {"dims", perm}}, {v});
    const Dims permuted = keys ? Dims{B, H, dh, S} : Dims{B, H, S, dh};
    return node("attn." + what + "_batched", {{"op", "contiguous"}, {"input", permuted}}, {p});
  }

  std::string attention(const std::string& x, const GraphShape& s, bool causal) {
    const int64_t B = s.batch, S = s.seq, H = s.heads, dh = s.dHead(), D = s.dModel, T = s.tokens();
    const std::string q = heads("q", linear("attn.q", x, T, D, D), s, false);
    const std::string k = heads("k", linear("attn.k", x, T, D, D), s, true);
    const std::string v = heads("v", linear("attn.v", x, T, D, D), s, false);
    const std::string scores =
        node("attn.scores", {{"op", "matmul"}, {"input", {B, H, S, dh}}, {"other", {B, H, dh, S}}},
             {q, k});
    std::string probs = node("attn.softmax",
                             {{"op", "softmax"},
                              {"input", {B, H, S, S}},
                              {"dim", -1},
                              {"scale", 1.0 / std::sqrt(static_cast<double>(dh))},
                              {"causal", causal}},
                             {scores});
    if (s.dropout > 0) {
      probs = node("attn.dropout", {{"op", "dropout"}, {"input", {B, H, S, S}}, {"p", s.dropout}},
                   {probs}, 1 + static_cast<uint64_t>(layer_));
    }
    const std::string ctx =
        node("attn.context", {{"op", "matmul"}, {"input", {B, H, S, S}}, {"other", {B, H, S, dh}}},
             {probs, v});
    const std::string c5 =
        node("attn.context_heads",
             {{"op", "permute"}, {"input", {B, H, S, dh}}, {"dims", {0, 2, 1, 3}}}, {ctx});
    const std::string c2 = node("attn.context_flat",
                                {{"op", "view"}, {"input", {B, S, H, dh}}, {"size", {T, D}}}, {c5});
    return linear("attn.proj", c2, T, D, D);
  }

  std::string mlp(const std::string& x, int64_t rows, int64_t d) {
    const std::string fc = linear("mlp.fc", x, rows, d, 4 * d);
    const std::string g = node("mlp.gelu", {{"op", "gelu"}, {"input", {rows, 4 * d}}}, {fc});
    return linear("mlp.proj", g, rows, 4 * d, d);
  }

  std::string add(const std::string& role, const std::string& a, const std::string& b,
                  const Dims& shape) {
    return node(role, {{"op", "add"}, {"input", shape}, {"other", shape}}, {a, b});
  }

  std::string mm(const std::string& role, const std::string& x, int64_t rows, int64_t in,
                 int64_t out) {
    return node(role, {{"op", "mm"}, {"input", {rows, in}}, {"other", {in, out}}},
                {x, param(role + ".weight", {in, out})});
  }
  std::string rmsNorm(const std::string& role, const std::string& x, const Dims& shape) {
    return node(role, {{"op", "rms_norm"}, {"input", shape}},
                {x, param(role + ".weight", {shape.back()})});
  }

  // LLaMA's attention: bias-free projections, rotary positions on queries and keys, and
  // grouped-query attention without repeating the keys and values: a key head's G query heads
  // stacked by row ([B, Hkv, S * G, dh], row s * G + g), each row masked as its position s.
  std::string llamaAttention(const std::string& x, const GraphShape& s) {
    const int64_t B = s.batch, S = s.seq, H = s.heads, Hk = s.kvHeads, G = H / Hk, dh = s.dHead(),
                  D = s.dModel, T = s.tokens();
    const auto rope = [&](const std::string& what, const std::string& t, int64_t heads) {
      const std::string v =
          node("attn." + what + "_view",
               {{"op", "view"}, {"input", {T, heads * dh}}, {"size", {B, S, heads, dh}}}, {t});
      return node("attn." + what + "_rope", {{"op", "rope"}, {"input", {B, S, heads, dh}}}, {v});
    };
    const std::string q0 = rope("q", mm("attn.q", x, T, D, H * dh), H);
    const std::string k0 = rope("k", mm("attn.k", x, T, D, Hk * dh), Hk);
    const std::string v0 =
        node("attn.v_view", {{"op", "view"}, {"input", {T, Hk * dh}}, {"size", {B, S, Hk, dh}}},
             {mm("attn.v", x, T, D, Hk * dh)});
    const std::string qg =
        node("attn.q_group",
             {{"op", "view"}, {"input", {B, S, H, dh}}, {"size", {B, S, Hk, G, dh}}}, {q0});
    const std::string qh =
        node("attn.q_heads",
             {{"op", "permute"}, {"input", {B, S, Hk, G, dh}}, {"dims", {0, 2, 1, 3, 4}}}, {qg});
    // The rows of a key head's queries flattened: a copy of the permuted heads.
    const std::string q =
        node("attn.q_batched",
             {{"op", "view"}, {"input", {B, Hk, S, G, dh}}, {"size", {B, Hk, S * G, dh}}}, {qh});
    const std::string kh =
        node("attn.k_heads", {{"op", "permute"}, {"input", {B, S, Hk, dh}}, {"dims", {0, 2, 3, 1}}},
             {k0});
    const std::string k =
        node("attn.k_batched", {{"op", "contiguous"}, {"input", {B, Hk, dh, S}}}, {kh});
    const std::string vh =
        node("attn.v_heads", {{"op", "permute"}, {"input", {B, S, Hk, dh}}, {"dims", {0, 2, 1, 3}}},
             {v0});
    const std::string v =
        node("attn.v_batched", {{"op", "contiguous"}, {"input", {B, Hk, S, dh}}}, {vh});
    const std::string scores =
        node("attn.scores",
             {{"op", "matmul"}, {"input", {B, Hk, S * G, dh}}, {"other", {B, Hk, dh, S}}}, {q, k});
    nlohmann::json soft = {{"op", "softmax"},
                           {"input", {B, Hk, S * G, S}},
                           {"dim", -1},
                           {"scale", 1.0 / std::sqrt(static_cast<double>(dh))},
                           {"causal", true}};
    if (G > 1) soft["query_group"] = G;
    const std::string probs = node("attn.softmax", soft, {scores});
    const std::string ctx = node(
        "attn.context", {{"op", "matmul"}, {"input", {B, Hk, S * G, S}}, {"other", {B, Hk, S, dh}}},
        {probs, v});
    const std::string c5 =
        node("attn.context_view",
             {{"op", "view"}, {"input", {B, Hk, S * G, dh}}, {"size", {B, Hk, S, G, dh}}}, {ctx});
    const std::string c6 =
        node("attn.context_heads",
             {{"op", "permute"}, {"input", {B, Hk, S, G, dh}}, {"dims", {0, 2, 1, 3, 4}}}, {c5});
    const std::string c2 =
        node("attn.context_flat", {{"op", "view"}, {"input", {B, S, Hk, G, dh}}, {"size", {T, D}}},
             {c6});
    return mm("attn.proj", c2, T, D, D);
  }

  // LLaMA's SwiGLU MLP: down(silu(gate(x)) * up(x)).
  std::string swiglu(const std::string& x, const GraphShape& s) {
    const int64_t T = s.tokens(), D = s.dModel, F = s.ffn;
    const std::string gate = mm("mlp.gate", x, T, D, F);
    const std::string up = mm("mlp.up", x, T, D, F);
    const std::string act = node("mlp.silu", {{"op", "silu"}, {"input", {T, F}}}, {gate});
    const std::string prod =
        node("mlp.prod", {{"op", "mul"}, {"input", {T, F}}, {"other", {T, F}}}, {act, up});
    return mm("mlp.down", prod, T, F, D);
  }

  // Token and position embeddings, summed: [T, D].
  std::string embeddings(const GraphShape& s) {
    const int64_t T = s.tokens();
    g_.inputs.push_back({"ids", {T}});
    g_.inputs.push_back({"positions", {T}});
    const std::string tok = node("wte_lookup",
                                 {{"op", "embedding"},
                                  {"input", {T}},
                                  {"num_embeddings", s.vocab},
                                  {"embedding_dim", s.dModel}},
                                 {"ids", param("wte", {s.vocab, s.dModel})});
    const std::string pos = node("wpe_lookup",
                                 {{"op", "embedding"},
                                  {"input", {T}},
                                  {"num_embeddings", s.seq},
                                  {"embedding_dim", s.dModel}},
                                 {"positions", param("wpe", {s.seq, s.dModel})});
    return add("embed", tok, pos, {T, s.dModel});
  }

 private:
  Graph& g_;
  int layer_ = -1;
};

Graph gpt2(const GraphShape& s, bool encoder) {
  Graph g;
  g.workload = encoder ? "bert" : "gpt2";
  g.shape = s;
  Builder b(g);
  const Dims act = {s.tokens(), s.dModel};
  std::string x = b.embeddings(s);
  if (encoder) x = b.layerNorm("ln_emb", x, act);
  for (int l = 0; l < s.layers; ++l) {
    b.block(l);
    if (encoder) {
      x = b.layerNorm("ln_1", b.add("attn.residual", x, b.attention(x, s, false), act), act);
      x = b.layerNorm("ln_2", b.add("mlp.residual", x, b.mlp(x, s.tokens(), s.dModel), act), act);
    } else {
      x = b.add("attn.residual", x, b.attention(b.layerNorm("ln_1", x, act), s, true), act);
      x = b.add("mlp.residual", x, b.mlp(b.layerNorm("ln_2", x, act), s.tokens(), s.dModel), act);
    }
  }
  b.block(-1);
  if (!encoder) {
    const std::string xf = b.layerNorm("ln_f", x, act);
    const std::string wt = b.node(
        "lm_head.wte_t",
        {{"op", "transpose"}, {"input", {s.vocab, s.dModel}}, {"dim0", 0}, {"dim1", 1}}, {"wte"});
    x = b.node("lm_head",
               {{"op", "addmm"}, {"input", {s.tokens(), s.dModel}}, {"other", {s.dModel, s.vocab}}},
               {xf, wt, b.param("lm_head.bias", {s.vocab})});
  }
  g.output = x;
  return g;
}

// LLaMA-style decoder: token embedding, pre-RMSNorm blocks of grouped-query attention with
// rotary positions and a SwiGLU MLP, no biases, an untied head.
Graph llama(const GraphShape& s) {
  Graph g;
  g.workload = "llama";
  g.shape = s;
  Builder b(g);
  const Dims act = {s.tokens(), s.dModel};
  g.inputs.push_back({"ids", {s.tokens()}});
  std::string x = b.node("wte_lookup",
                         {{"op", "embedding"},
                          {"input", {s.tokens()}},
                          {"num_embeddings", s.vocab},
                          {"embedding_dim", s.dModel}},
                         {"ids", b.param("wte", {s.vocab, s.dModel})});
  for (int l = 0; l < s.layers; ++l) {
    b.block(l);
    x = b.add("attn.residual", x, b.llamaAttention(b.rmsNorm("ln_1", x, act), s), act);
    x = b.add("mlp.residual", x, b.swiglu(b.rmsNorm("ln_2", x, act), s), act);
  }
  b.block(-1);
  g.output = b.mm("lm_head", b.rmsNorm("ln_f", x, act), s.tokens(), s.dModel, s.vocab);
  return g;
}

Graph mlpGraph(const GraphShape& s) {
  Graph g;
  g.workload = "mlp";
  g.shape = s;
  Builder b(g);
  g.inputs.push_back({"x", {s.batch, s.dModel}});
  std::string x = "x";
  for (int l = 0; l < s.layers; ++l) {
    b.block(l);
    x = b.add("mlp.residual", x, b.mlp(x, s.batch, s.dModel), {s.batch, s.dModel});
  }
  g.output = x;
  return g;
}

class GraphWorkload final : public Workload {
 public:
  explicit GraphWorkload(std::string name) : name_(std::move(name)) {}
  std::string name() const override { return name_; }
  std::string description() const override {
    if (name_ == "mlp") return "residual MLP blocks (the graph auto-sharding solves over)";
    if (name_ == "bert") return "BERT-style post-LN encoder with embeddings (a graph workload)";
    if (name_ == "llama") {
      return "LLaMA-style decoder: RMSNorm, rotary grouped-query attention, SwiGLU, untied head "
             "(a graph workload)";
    }
    return "GPT-2-style decoder: embeddings, pre-LN blocks, tied LM head (a graph workload)";
  }
  void validate(const nlohmann::json& shape) const override { buildGraph(name_, shape); }
  std::string shapeString(const nlohmann::json& shape) const override {
    const GraphShape s = GraphShape::parse(name_, shape);
    std::string out = "batch=" + std::to_string(s.batch) + ";d_model=" + std::to_string(s.dModel);
    if (name_ != "mlp") {
      out += ";seq=" + std::to_string(s.seq) + ";heads=" + std::to_string(s.heads) +
             ";vocab=" + std::to_string(s.vocab);
    }
    if (name_ == "llama") {
      out += ";kv_heads=" + std::to_string(s.kvHeads) + ";ffn=" + std::to_string(s.ffn);
    }
    out += ";layers=" + std::to_string(s.layers);
    if (name_ != "mlp" && s.dropout > 0) out += ";dropout=" + nlohmann::json(s.dropout).dump();
    return out;
  }

  WorkloadData build(const nlohmann::json& shape, at::ScalarType dtype, uint64_t seed,
                     InputMode mode) const override {
    const Graph g = buildGraph(name_, shape);
    WorkloadData d;
    d.inputs = graphInputs(g, dtype, seed, mode);
    std::map<std::string, at::Tensor> leaves;
    for (const auto& [name, dims] : g.parameters) {
      leaves[name] = d.inputs.at(name).clone().set_requires_grad(true);
    }
    std::map<std::string, at::Tensor> in;
    for (const auto& [name, dims] : g.inputs) in[name] = d.inputs.at(name);
    const at::Tensor out = graphModelRef(name_, g.shape, leaves, in, seed);
    d.inputs["grad_output"] = makeNormal(out.sizes(), dtype, seed, 999, mode);
    torch::autograd::backward({out}, {d.inputs.at("grad_output")});
    d.expected["output"] = out.detach();
    d.checked.push_back("output");
    for (const auto& [name, dims] : g.parameters) {
      d.expected["grad/" + name] = leaves.at(name).grad();
      d.checked.push_back("grad/" + name);
    }
    return d;
  }

 private:
  std::string name_;
};

}  // namespace

std::vector<std::string> GraphNode::outputs() const {
  const size_t n = shape.outputs().size();
  if (n == 1) return {name};
  std::vector<std::string> out;
  for (size_t i = 0; i < n; ++i) out.push_back(name + ":" + std::to_string(i));
  return out;
}

GraphShape GraphShape::parse(const std::string& workload, const nlohmann::json& shape) {
  if (!shape.is_object()) {
    throw std::invalid_argument(workload + ": shape must be a mapping, got " + shape.dump());
  }
  const bool mlp = workload == "mlp", isLlama = workload == "llama";
  const std::vector<std::string> keys =
      mlp       ? std::vector<std::string>{"batch", "d_model", "layers"}
      : isLlama ? std::vector<std::string>{"batch",    "seq", "d_model", "heads",
                                           "kv_heads", "ffn", "layers",  "vocab"}
                : std::vector<std::string>{"batch",  "seq",   "d_model", "heads",
                                           "layers", "vocab", "dropout"};
  for (auto it = shape.begin(); it != shape.end(); ++it) {
    if (std::find(keys.begin(), keys.end(), it.key()) == keys.end()) {
      std::string known;
      for (const auto& k : keys) known += (known.empty() ? "" : ", ") + k;
      throw std::invalid_argument(workload + ": unknown shape key '" + it.key() + "' (expected " +
                                  known + ")");
    }
  }
  GraphShape s;
  s.batch = shapeInt(shape, workload, "batch", mlp ? 16 : 2);
  s.dModel = shapeInt(shape, workload, "d_model", 32);
  s.layers = shapeInt(shape, workload, "layers", 2);
  if (s.layers > 1024) {
    throw std::invalid_argument(workload + ": shape key 'layers' must be at most 1024, got " +
                                std::to_string(s.layers));
  }
  // Every dimension an operator of the graph gets stays within the operators' bound (2^24:
  // reference/ops.h), said here in the shape's own keys rather than an operator's.
  const auto within = [&](long double v, const std::string& what) {
    if (v > static_cast<long double>(int64_t{1} << 24)) {
      throw std::invalid_argument(workload + ": shape " + what + " (" +
                                  std::to_string(static_cast<int64_t>(v)) +
                                  ") is over 2^24, the largest dimension an operator takes");
    }
  };
  within(4.0L * s.dModel, "4 x d_model");
  within(s.batch, "batch");
  if (mlp) return s;
  s.seq = shapeInt(shape, workload, "seq", 16);
  s.heads = shapeInt(shape, workload, "heads", 4);
  s.vocab = shapeInt(shape, workload, "vocab", 64);
  s.kvHeads = s.heads;
  s.ffn = 4 * s.dModel;
  if (isLlama) {
    s.dropout = 0;
    s.kvHeads = shapeInt(shape, workload, "kv_heads", s.heads);
    s.ffn = shapeInt(shape, workload, "ffn", 4 * s.dModel);
    within(s.ffn, "ffn");
    if (s.heads % s.kvHeads != 0) {
      throw std::invalid_argument(workload + ": shape key 'kv_heads' (" +
                                  std::to_string(s.kvHeads) + ") must divide 'heads' (" +
                                  std::to_string(s.heads) + ")");
    }
  }
  if (shape.contains("dropout")) {
    const auto& v = shape.at("dropout");
    if (!v.is_number() || v.get<double>() < 0 || v.get<double>() >= 1) {
      throw std::invalid_argument(
          workload + ": shape key 'dropout' must be a number in [0, 1), got " + v.dump());
    }
    s.dropout = v.get<double>();
  }
  // The largest tensor's elements (the MLP's hidden, the attention scores, the logits), so
  // that every byte count the planners sum from the graph stays far inside int64.
  const long double rows = static_cast<long double>(s.batch) * s.seq;
  const long double widest =
      std::max({4.0L * s.dModel, static_cast<long double>(s.heads) * s.seq,
                static_cast<long double>(s.vocab), static_cast<long double>(s.ffn)});
  if (rows * widest > static_cast<long double>(int64_t{1} << 48)) {
    throw std::invalid_argument(workload + ": shape " + shape.dump() +
                                " makes a tensor of more than 2^48 elements; choose a smaller one");
  }
  within(static_cast<long double>(s.batch) * s.seq, "batch x seq");
  within(static_cast<long double>(s.batch) * s.heads, "batch x heads");
  within(s.vocab, "vocab");
  if (s.dModel % s.heads != 0) {
    throw std::invalid_argument(workload + ": shape key 'd_model' (" + std::to_string(s.dModel) +
                                ") must be a multiple of 'heads' (" + std::to_string(s.heads) +
                                ")");
  }
  return s;
}

const std::vector<std::string>& graphWorkloads() {
  static const std::vector<std::string> names = {"gpt2", "bert", "mlp", "llama"};
  return names;
}

Graph buildGraph(const std::string& workload, const nlohmann::json& shape) {
  if (workload == "torchscript") {
    Graph g = torchscript::importModel(torchscript::ImportSpec::fromJson(shape))->graph;
    g.importShape = shape;
    return g;
  }
  const auto& names = graphWorkloads();
  if (std::find(names.begin(), names.end(), workload) == names.end()) {
    throw std::invalid_argument("unknown graph workload '" + workload +
                                "' (expected gpt2, bert, mlp or llama)");
  }
  const GraphShape s = GraphShape::parse(workload, shape);
  Graph g = workload == "mlp"     ? mlpGraph(s)
            : workload == "llama" ? llama(s)
                                  : gpt2(s, workload == "bert");
  g.index();
  return g;
}

void Graph::index() {
  nodeIndex.clear();
  isParameterName.clear();
  for (size_t i = 0; i < nodes.size(); ++i) nodeIndex[nodes[i].name] = static_cast<int>(i);
  for (const auto& [name, dims] : parameters) isParameterName[name] = true;
  for (const auto& [name, dims] : inputs) isParameterName[name] = false;
  gradOf.clear();
  for (const auto& n : nodes) {
    bool grad = false;
    const auto operands = n.shape.operands();
    for (size_t i = 0; i < n.args.size(); ++i) {
      grad = grad || (n.shape.differentiable(operands[i]) && requiresGrad(n.args[i]));
    }
    for (const auto& o : n.outputs()) gradOf[o] = grad;
  }
}

bool Graph::requiresGrad(const std::string& value) const {
  if (isParameter(value)) return true;
  const auto it = gradOf.find(value);
  return it != gradOf.end() && it->second;
}

std::pair<int, int> Graph::producer(const std::string& value) const {
  if (auto it = nodeIndex.find(value); it != nodeIndex.end()) return {it->second, 0};
  const auto colon = value.rfind(':');
  if (colon == std::string::npos) return {-1, 0};
  const auto it = nodeIndex.find(value.substr(0, colon));
  if (it == nodeIndex.end()) return {-1, 0};
  return {it->second, std::stoi(value.substr(colon + 1))};
}

bool Graph::isParameter(const std::string& value) const {
  const auto it = isParameterName.find(value);
  return it != isParameterName.end() && it->second;
}

bool Graph::isInput(const std::string& value) const {
  const auto it = isParameterName.find(value);
  return it != isParameterName.end() && !it->second;
}

std::vector<int64_t> Graph::valueShape(const std::string& value) const {
  for (const auto& [name, dims] : inputs) {
    if (name == value) return dims;
  }
  for (const auto& [name, dims] : parameters) {
    if (name == value) return dims;
  }
  const auto [node, index] = producer(value);
  TORCH_CHECK(node >= 0, "graph: no value named ", value);
  return nodes[node].shape.outputs()[index];
}

nlohmann::json Graph::toJson() const {
  nlohmann::json j;
  j["workload"] = workload;
  nlohmann::json ins = nlohmann::json::array(), ps = nlohmann::json::array();
  for (const auto& [name, dims] : inputs) ins.push_back({{"name", name}, {"shape", dims}});
  for (const auto& [name, dims] : parameters) ps.push_back({{"name", name}, {"shape", dims}});
  j["inputs"] = ins;
  j["parameters"] = ps;
  nlohmann::json ns = nlohmann::json::array();
  for (const auto& n : nodes) {
    nlohmann::json shape = n.shape.attrs;
    shape["op"] = n.shape.op;
    shape["input"] = n.shape.input;
    if (!n.shape.other.empty()) shape["other"] = n.shape.other;
    nlohmann::json args = nlohmann::json::object();
    const auto operands = n.shape.operands();
    for (size_t i = 0; i < operands.size(); ++i) args[operands[i]] = n.args[i];
    nlohmann::json outs = nlohmann::json::array();
    const auto shapes = n.shape.outputs();
    const auto names = n.outputs();
    for (size_t i = 0; i < names.size(); ++i) {
      outs.push_back({{"name", names[i]}, {"shape", shapes[i]}});
    }
    nlohmann::json node = {{"name", n.name},  {"op", n.shape.op}, {"shape", shape}, {"args", args},
                           {"outputs", outs}, {"layer", n.layer}, {"role", n.role}};
    ns.push_back(node);
  }
  j["nodes"] = ns;
  j["output"] = output;
  j["node_count"] = nodes.size();
  return j;
}

std::vector<at::Tensor> runNode(const GraphNode& node,
                                const std::function<at::Tensor(const std::string&)>& arg,
                                uint64_t seed) {
  std::map<std::string, at::Tensor> t;
  const auto operands = node.shape.operands();
  for (size_t i = 0; i < operands.size(); ++i) t[operands[i]] = arg(node.args[i]);
  return opForward(node.shape, t, seed + node.seedOffset);
}

std::map<std::string, at::Tensor> runGraph(const Graph& g, std::map<std::string, at::Tensor> values,
                                           uint64_t seed) {
  for (const auto& n : g.nodes) {
    const auto ys = runNode(
        n, [&](const std::string& a) { return values.at(a); }, seed);
    const auto names = n.outputs();
    for (size_t i = 0; i < ys.size(); ++i) values[names[i]] = ys[i];
  }
  return values;
}

std::map<std::string, at::Tensor> graphInputs(const Graph& g, at::ScalarType dtype, uint64_t seed,
                                              InputMode mode) {
  if (g.workload == "torchscript") {
    const auto spec = torchscript::ImportSpec::fromJson(g.importShape);
    const auto m = torchscript::importModel(spec);
    auto out = torchscript::importedInputs(*m, dtype, seed, mode);
    for (auto& [name, t] : torchscript::importedParameters(*m, spec, dtype, seed)) out[name] = t;
    return out;
  }
  std::map<std::string, at::Tensor> out;
  const GraphShape& s = g.shape;
  int stream = 0;
  for (const auto& [name, dims] : g.inputs) {
    if (name == "ids") {
      const at::Tensor u = makeUniformAsDrawn(dims, 1.0, seed, stream++);
      out[name] = u.add(1)
                      .mul(0.5 * static_cast<double>(s.vocab))
                      .floor()
                      .clamp(0, static_cast<double>(s.vocab - 1))
                      .to(at::kLong);
    } else if (name == "positions") {
      out[name] = at::arange(s.tokens(), caseOptions(at::kLong)).remainder(s.seq);
    } else {
      out[name] = makeNormal(dims, dtype, seed, stream++, mode);
    }
  }
  for (const auto& [name, dims] : g.parameters) {
    const bool norm = name.find("ln_") != std::string::npos;
    const bool embedding = name == "wte" || name == "wpe";
    at::Tensor v;
    if (embedding) {
      v = makeNormal(dims, dtype, seed, stream++, mode);
    } else {
      // Layer norms near their identity; linear weights and biases as nn.Linear draws them,
      // from the fan-in (the first dimension of an [in, out] weight).
      const bool bias = name.size() > 5 && name.compare(name.size() - 5, 5, ".bias") == 0;
      const std::string weight = bias ? name.substr(0, name.size() - 5) + ".weight" : name;
      int64_t fanIn = dims[0];
      for (const auto& [n2, d2] : g.parameters) {
        if (n2 == weight && d2.size() == 2) fanIn = d2[0];
      }
      if (name == "lm_head.bias") fanIn = s.dModel;
      v = makeUniform(dims, norm ? 0.5 : 1.0 / std::sqrt(static_cast<double>(fanIn)), dtype, seed,
                      stream++, mode);
      if (norm && !bias && mode == InputMode::kRandom) v = asCaseValues(v.add(1));
    }
    out[name] = v;
  }
  return out;
}

const Workload* findGraphWorkload(const std::string& name) {
  static const GraphWorkload gpt2("gpt2"), bert("bert"), mlp("mlp"), llama("llama");
  if (name == "gpt2") return &gpt2;
  if (name == "llama") return &llama;
  if (name == "bert") return &bert;
  if (name == "mlp") return &mlp;
  if (name == "torchscript") return torchscript::torchscriptWorkload();
  return nullptr;
}

}  // namespace sb::reference
