// The GPT-2-style stack the chunking family chunks (transformer.h), and its plain reference.

#include "reference/transformer.h"

#include "reference/reference_step.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <cmath>

namespace sb::reference {

TransformerShape TransformerShape::parse(const nlohmann::json& shape, const std::string& workload) {
  TORCH_CHECK(shape.is_object(), workload, ": shape must be a mapping");
  TransformerShape s;
  s.causal = workload != "vit_encoder";
  for (auto it = shape.begin(); it != shape.end(); ++it) {
    const std::string& k = it.key();
    const auto& v = it.value();
    if (k == "mode") {
      TORCH_CHECK(v.is_string() && (v == "inference" || v == "training"), workload,
                  ": shape key 'mode' must be inference or training, got ", v.dump());
      s.training = v == "training";
      continue;
    }
    int64_t* field = k == "batch"     ? &s.batch
                     : k == "seq"     ? &s.seq
                     : k == "d_model" ? &s.dModel
                     : k == "heads"   ? &s.heads
                     : k == "layers"  ? &s.layers
                                      : nullptr;
    TORCH_CHECK(field, workload, ": unknown shape key '", k,
                "' (expected batch, seq, d_model, heads, layers, mode)");
    TORCH_CHECK(v.is_number_integer() && v.get<int64_t>() > 0, workload, ": shape key '", k,
                "' must be a positive integer, got ", v.dump());
    *field = v.get<int64_t>();
  }
  // Built a layer at a time, so bounded as the graph workloads are (layers 10^8 passed the
  // element bound and grew gigabytes before a row ran).
  TORCH_CHECK(s.layers <= 1024, workload, ": shape key 'layers' must be at most 1024, got ",
              s.layers);
  TORCH_CHECK(s.dModel % s.heads == 0, workload, ": shape key 'd_model' (", s.dModel,
              ") must be a multiple of 'heads' (", s.heads, ")");
  return s;
}

std::string TransformerShape::toString() const {
  return "batch=" + std::to_string(batch) + ";seq=" + std::to_string(seq) +
         ";d_model=" + std::to_string(dModel) + ";heads=" + std::to_string(heads) +
         ";layers=" + std::to_string(layers) + ";mode=" + (training ? "training" : "inference");
}

at::Tensor Transformer::param(const std::string& name, at::Tensor value) {
  value = value.detach().requires_grad_(shape_.training);
  params_.emplace_back(name, value);
  return value;
}

Transformer::Transformer(const TransformerShape& s, at::ScalarType dtype, uint64_t seed)
    : shape_(s) {
  int stream = 0;
  const int64_t D = s.dModel;
  const auto w = [&](const std::string& n, at::IntArrayRef shape, int64_t fanIn) {
    return param(n, scaledAsCase(makeNormal(shape, dtype, seed, stream++, InputMode::kRandom),
                                 std::sqrt(1.0 / static_cast<double>(fanIn))));
  };
  const auto b = [&](const std::string& n, int64_t len) {
    return param(n,
                 scaledAsCase(makeNormal({len}, dtype, seed, stream++, InputMode::kRandom), 0.02));
  };
  const auto ones = [&](const std::string& n) {
    return param(n, at::ones({D}, caseOptions(dtype)));
  };
  const auto zeros = [&](const std::string& n) {
    return param(n, at::zeros({D}, caseOptions(dtype)));
  };
  for (int64_t l = 0; l < s.layers; ++l) {
    const std::string n = "h" + std::to_string(l);
    Layer L;
    L.ln1w = ones(n + ".ln_1.weight");
    L.ln1b = zeros(n + ".ln_1.bias");
    L.wqkv = w(n + ".attn.c_attn.weight", {3 * D, D}, D);
    L.bqkv = b(n + ".attn.c_attn.bias", 3 * D);
    L.wo = w(n + ".attn.c_proj.weight", {D, D}, D);
    L.bo = b(n + ".attn.c_proj.bias", D);
    L.ln2w = ones(n + ".ln_2.weight");
    L.ln2b = zeros(n + ".ln_2.bias");
    L.w1 = w(n + ".mlp.c_fc.weight", {4 * D, D}, D);
    L.b1 = b(n + ".mlp.c_fc.bias", 4 * D);
    L.w2 = w(n + ".mlp.c_proj.weight", {D, 4 * D}, 4 * D);
    L.b2 = b(n + ".mlp.c_proj.bias", D);
    layers_.push_back(L);
  }
  input_ = makeNormal({s.batch, s.seq, D}, dtype, seed, 1000, InputMode::kRandom);
  target_ = makeNormal({s.batch, s.seq, D}, dtype, seed, 1001, InputMode::kRandom);
}

at::Tensor Transformer::ln1(int l, const at::Tensor& x) const {
  const auto& L = layers_[l];
  return at::layer_norm(x, {shape_.dModel}, L.ln1w, L.ln1b, 1e-5);
}

at::Tensor Transformer::ln2(int l, const at::Tensor& x) const {
  const auto& L = layers_[l];
  return at::layer_norm(x, {shape_.dModel}, L.ln2w, L.ln2b, 1e-5);
}

std::pair<at::Tensor, at::Tensor> Transformer::keysValues(int l, const at::Tensor& h) const {
  const auto& L = layers_[l];
  const int64_t D = shape_.dModel, H = shape_.heads;
  // Rows D..3D of the fused projection are the keys' and values'.
  const at::Tensor kv = at::linear(h, L.wqkv.narrow(0, D, 2 * D), L.bqkv.narrow(0, D, 2 * D));
  const auto parts = kv.chunk(2, -1);
  const auto heads = [&](const at::Tensor& t) {
    return t.reshape({t.size(0), t.size(1), H, D / H}).transpose(1, 2);
  };
  return {heads(parts[0]), heads(parts[1])};
}

at::Tensor Transformer::attention(int l, const at::Tensor& hRows, int64_t begin,
                                  const at::Tensor& k, const at::Tensor& v, int64_t keyEnd) const {
  const int64_t D = shape_.dModel, H = shape_.heads, rows = hRows.size(1);
  const at::Tensor q = queries(l, hRows);
  const at::Tensor kk = k.narrow(2, 0, keyEnd), vv = v.narrow(2, 0, keyEnd);
  at::Tensor att = at::matmul(q, kk.transpose(-2, -1)) / std::sqrt(static_cast<double>(D / H));
  if (shape_.causal) {  // query begin + i sees keys 0 .. begin + i
    const at::Tensor qpos =
        at::arange(begin, begin + rows, att.options().dtype(at::kLong)).unsqueeze(1);
    const at::Tensor kpos = at::arange(0, keyEnd, att.options().dtype(at::kLong)).unsqueeze(0);
    att = att.masked_fill(kpos.gt(qpos), -INFINITY);
  }
  att = at::softmax(att, -1);
  const at::Tensor y = at::matmul(att, vv).transpose(1, 2).reshape({hRows.size(0), rows, D});
  return project(l, y);
}

at::Tensor Transformer::queries(int l, const at::Tensor& hRows) const {
  const auto& L = layers_[l];
  const int64_t D = shape_.dModel, H = shape_.heads;
  return at::linear(hRows, L.wqkv.narrow(0, 0, D), L.bqkv.narrow(0, 0, D))
      .reshape({hRows.size(0), hRows.size(1), H, D / H})
      .transpose(1, 2);
}

at::Tensor Transformer::project(int l, const at::Tensor& merged) const {
  const auto& L = layers_[l];
  return at::linear(merged, L.wo, L.bo);
}

at::Tensor Transformer::ffn(int l, const at::Tensor& h) const {
  const auto& L = layers_[l];
  return at::linear(at::gelu(at::linear(h, L.w1, L.b1), "tanh"), L.w2, L.b2);
}

at::Tensor Transformer::block(int l, const at::Tensor& x) const {
  const at::Tensor h = ln1(l, x);
  const auto [k, v] = keysValues(l, h);
  const at::Tensor r = x + attention(l, h, 0, k, v, shape_.seq);
  return r + ffn(l, ln2(l, r));
}

at::Tensor Transformer::forward(const at::Tensor& x) const {
  at::Tensor h = x;
  for (int l = 0; l < layers(); ++l) h = block(l, h);
  return h;
}

void Transformer::zeroGrad() const { zeroGrads(params_); }

namespace {

class TransformerWorkload final : public Workload {
 public:
  TransformerWorkload(std::string name, std::string description)
      : name_(std::move(name)), description_(std::move(description)) {}
  std::string name() const override { return name_; }
  std::string description() const override { return description_; }
  void validate(const nlohmann::json& shape) const override {
    TransformerShape::parse(shape, name_);
  }
  std::string shapeString(const nlohmann::json& shape) const override {
    return TransformerShape::parse(shape, name_).toString();
  }
  WorkloadData build(const nlohmann::json& shape, at::ScalarType dtype, uint64_t seed,
                     InputMode) const override {
    const auto s = TransformerShape::parse(shape, name_);
    return referenceStep(Transformer(s, dtype, seed), s.training);
  }

 private:
  std::string name_, description_;
};

}  // namespace

const Workload* gpt2PrefillWorkload() {
  static const TransformerWorkload w(
      "gpt2_prefill",
      "GPT-2-style pre-LN blocks, causal, on [batch, seq, d_model]; inference or training");
  return &w;
}

const Workload* vitEncoderWorkload() {
  static const TransformerWorkload w(
      "vit_encoder",
      "ViT-style pre-LN encoder blocks, bidirectional, on [batch, patches, d_model]");
  return &w;
}

}  // namespace sb::reference
