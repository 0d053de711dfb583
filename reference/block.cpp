// The "transformer_block" reference workload (block.h).

#include "reference/block.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <cmath>

#include "reference/ops.h"

namespace sb::reference {

BlockShape BlockShape::parse(const nlohmann::json& shape) {
  TORCH_CHECK(shape.is_object(),
              "transformer_block: shape must be a mapping with keys batch, seq, "
              "d_model, heads, dropout, causal");
  BlockShape s;
  for (auto it = shape.begin(); it != shape.end(); ++it) {
    const std::string& k = it.key();
    const auto& v = it.value();
    if (k == "dropout") {
      TORCH_CHECK(v.is_number() && v.get<double>() >= 0 && v.get<double>() < 1,
                  "transformer_block: shape key 'dropout' must be in [0, 1), got ", v.dump());
      s.dropout = v.get<double>();
      continue;
    }
    if (k == "causal") {
      TORCH_CHECK(v.is_boolean(),
                  "transformer_block: shape key 'causal' must be true or false, got ", v.dump());
      s.causal = v.get<bool>();
      continue;
    }
    int64_t* field = k == "batch"     ? &s.batch
                     : k == "seq"     ? &s.seq
                     : k == "d_model" ? &s.dModel
                     : k == "heads"   ? &s.heads
                                      : nullptr;
    TORCH_CHECK(field, "transformer_block: unknown shape key '", k,
                "' (expected batch, seq, d_model, heads, dropout, causal)");
    TORCH_CHECK(v.is_number_integer() && v.get<int64_t>() > 0 && v.get<int64_t>() <= (1 << 20),
                "transformer_block: shape key '", k, "' must be a positive integer, got ",
                v.dump());
    *field = v.get<int64_t>();
  }
  TORCH_CHECK(s.dModel % s.heads == 0, "transformer_block: shape key 'd_model' (", s.dModel,
              ") must be a multiple of 'heads' (", s.heads, ")");
  return s;
}

std::string BlockShape::toString() const {
  char p[32];
  std::snprintf(p, sizeof(p), "%g", dropout);
  return "batch=" + std::to_string(batch) + ";seq=" + std::to_string(seq) +
         ";d_model=" + std::to_string(dModel) + ";heads=" + std::to_string(heads) +
         ";dropout=" + p + ";causal=" + (causal ? "1" : "0");
}

std::vector<std::pair<std::string, std::vector<int64_t>>> blockParameters(const BlockShape& s) {
  const int64_t D = s.dModel;
  return {{"ln_1.weight", {D}},
          {"ln_1.bias", {D}},
          {"attn.qkv.weight", {3 * D, D}},
          {"attn.qkv.bias", {3 * D}},
          {"attn.proj.weight", {D, D}},
          {"attn.proj.bias", {D}},
          {"ln_2.weight", {D}},
          {"ln_2.bias", {D}},
          {"mlp.fc.weight", {4 * D, D}},
          {"mlp.fc.bias", {4 * D}},
          {"mlp.proj.weight", {D, 4 * D}},
          {"mlp.proj.bias", {D}}};
}

at::Tensor blockAttention(const at::Tensor& qkv, int64_t heads, int64_t dHead, bool causal) {
  const int64_t B = qkv.size(0), T = qkv.size(1);
  const at::Tensor v5 = qkv.view({B, T, heads, 3, dHead});
  const at::Tensor q = v5.select(3, 0).transpose(1, 2);  // [B, H, T, dh]
  const at::Tensor k = v5.select(3, 1).transpose(1, 2);
  const at::Tensor v = v5.select(3, 2).transpose(1, 2);
  at::Tensor scores = at::matmul(q, k.transpose(-2, -1)).mul_(1.0 / std::sqrt(double(dHead)));
  if (causal) {
    const at::Tensor future = at::ones({T, T}, qkv.options().dtype(at::kBool)).triu_(1);
    scores.masked_fill_(future, -std::numeric_limits<double>::infinity());
  }
  const at::Tensor probs = at::softmax(scores, -1);
  return at::matmul(probs, v).transpose(1, 2).reshape({B, T, heads * dHead});
}

const std::vector<std::string>& blockTapNames() {
  static const std::vector<std::string> names = {"ln_1", "attn.proj", "attn.residual",
                                                 "ln_2", "mlp.proj",  "block.out"};
  return names;
}

at::Tensor blockForward(const BlockShape& s, const std::map<std::string, at::Tensor>& p,
                        const at::Tensor& x, uint64_t seed,
                        std::vector<std::pair<std::string, at::Tensor>>* taps) {
  const auto tap = [&](int i, const at::Tensor& t) {
    if (taps) taps->emplace_back(blockTapNames()[i], t);
    return t;
  };
  const int64_t D = s.dModel;
  const auto drop = [&](const at::Tensor& t, int site) {
    if (s.dropout == 0) return t;
    const std::vector<int64_t> zero(3, 0);
    return t * dropoutKeepMask(s.activation(), zero, s.activation(), seed + site, s.dropout,
                               t.scalar_type())
                   .mul_(1.0 / (1.0 - s.dropout));
  };
  const at::Tensor h = tap(0, at::layer_norm(x, {D}, p.at("ln_1.weight"), p.at("ln_1.bias"), 1e-5));
  const at::Tensor qkv = at::linear(h, p.at("attn.qkv.weight"), p.at("attn.qkv.bias"));
  const at::Tensor att = blockAttention(qkv, s.heads, s.dHead(), s.causal);
  const at::Tensor a = tap(1, at::linear(att, p.at("attn.proj.weight"), p.at("attn.proj.bias")));
  const at::Tensor r = tap(2, x + drop(a, 0));
  const at::Tensor h2 =
      tap(3, at::layer_norm(r, {D}, p.at("ln_2.weight"), p.at("ln_2.bias"), 1e-5));
  const at::Tensor u = at::gelu(at::linear(h2, p.at("mlp.fc.weight"), p.at("mlp.fc.bias")));
  const at::Tensor m = tap(4, at::linear(u, p.at("mlp.proj.weight"), p.at("mlp.proj.bias")));
  return tap(5, r + drop(m, 1));
}

namespace {

class BlockWorkload final : public Workload {
 public:
  std::string name() const override { return "transformer_block"; }
  std::string description() const override {
    return "one pre-LN transformer block with hidden dropout (Megatron's unit of tensor and "
           "sequence parallelism), forward and backward";
  }
  void validate(const nlohmann::json& shape) const override { BlockShape::parse(shape); }
  std::string shapeString(const nlohmann::json& shape) const override {
    return BlockShape::parse(shape).toString();
  }
  WorkloadData build(const nlohmann::json& shape, at::ScalarType dtype, uint64_t seed,
                     InputMode mode) const override {
    const BlockShape s = BlockShape::parse(shape);
    WorkloadData d;
    int stream = 0;
    d.inputs["input"] = makeNormal(s.activation(), dtype, seed, stream++, mode);
    std::map<std::string, at::Tensor> leaves;
    for (const auto& [name, dims] : blockParameters(s)) {
      at::Tensor v;
      if (name.rfind("ln_", 0) == 0) {
        v = makeUniform(dims, 0.2, dtype, seed, stream++, mode);
        if (name.find("weight") != std::string::npos && mode == InputMode::kRandom) v = asCaseValues(v.add(1));
      } else {
        const double fanIn = static_cast<double>(dims.size() == 2 ? dims[1] : s.dModel);
        v = makeUniform(dims, 1.0 / std::sqrt(fanIn), dtype, seed, stream++, mode);
      }
      d.inputs[name] = v;
      leaves[name] = v.clone().set_requires_grad(true);
    }
    d.inputs["grad_output"] = makeNormal(s.activation(), dtype, seed, stream++, mode);
    at::Tensor x = d.inputs["input"].clone().set_requires_grad(true);
    const at::Tensor y = blockForward(s, leaves, x, seed);
    torch::autograd::backward({y}, {d.inputs["grad_output"]});
    d.expected["output"] = y.detach();
    d.expected["grad_input"] = x.grad();
    d.checked = {"output", "grad_input"};
    for (const auto& [name, dims] : blockParameters(s)) {
      d.expected["grad/" + name] = leaves[name].grad();
      d.checked.push_back("grad/" + name);
    }
    return d;
  }
};

}  // namespace

const Workload* blockWorkload() {
  static const BlockWorkload w;
  return &w;
}

}  // namespace sb::reference
