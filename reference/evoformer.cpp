// The Evoformer-style pair stack of the chunking family (evoformer.h) and its reference.

#include "reference/evoformer.h"

#include "reference/reference_step.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <cmath>

namespace sb::reference {

PairShape PairShape::parse(const nlohmann::json& shape) {
  TORCH_CHECK(shape.is_object(), "evoformer_pair: shape must be a mapping");
  PairShape s;
  for (auto it = shape.begin(); it != shape.end(); ++it) {
    const std::string& k = it.key();
    const auto& v = it.value();
    if (k == "mode") {
      TORCH_CHECK(v.is_string() && (v == "inference" || v == "training"),
                  "evoformer_pair: shape key 'mode' must be inference or training, got ", v.dump());
      s.training = v == "training";
      continue;
    }
    int64_t* field = k == "batch"    ? &s.batch
                     : k == "n"      ? &s.n
                     : k == "c"      ? &s.c
                     : k == "hidden" ? &s.hidden
                     : k == "layers" ? &s.layers
                                     : nullptr;
    TORCH_CHECK(field, "evoformer_pair: unknown shape key '", k,
                "' (expected batch, n, c, hidden, layers, mode)");
    TORCH_CHECK(v.is_number_integer() && v.get<int64_t>() > 0, "evoformer_pair: shape key '", k,
                "' must be a positive integer, got ", v.dump());
    *field = v.get<int64_t>();
  }
  TORCH_CHECK(s.layers <= 1024, "evoformer_pair: shape key 'layers' must be at most 1024, got ",
              s.layers);  // built a layer at a time, as the transformers are
  return s;
}

std::string PairShape::toString() const {
  return "batch=" + std::to_string(batch) + ";n=" + std::to_string(n) + ";c=" + std::to_string(c) +
         ";hidden=" + std::to_string(hidden) + ";layers=" + std::to_string(layers) +
         ";mode=" + (training ? "training" : "inference");
}

at::Tensor PairStack::param(const std::string& name, at::Tensor value) {
  value = value.detach().requires_grad_(shape.training);
  params_.emplace_back(name, value);
  return value;
}

PairStack::PairStack(const PairShape& s, at::ScalarType dtype, uint64_t seed) : shape(s) {
  int stream = 0;
  const auto w = [&](const std::string& n, int64_t out, int64_t in) {
    return param(n, scaledAsCase(makeNormal({out, in}, dtype, seed, stream++, InputMode::kRandom),
                                 std::sqrt(1.0 / static_cast<double>(in))));
  };
  const auto b = [&](const std::string& n, int64_t len) {
    return param(n,
                 scaledAsCase(makeNormal({len}, dtype, seed, stream++, InputMode::kRandom), 0.02));
  };
  const auto ones = [&](const std::string& n, int64_t len) {
    return param(n, at::ones({len}, caseOptions(dtype)));
  };
  const auto zeros = [&](const std::string& n, int64_t len) {
    return param(n, at::zeros({len}, caseOptions(dtype)));
  };
  const int64_t C = s.c, H = s.hidden;
  for (int64_t l = 0; l < s.layers; ++l) {
    const std::string n = "pair" + std::to_string(l);
    Layer L;
    L.lnw = ones(n + ".tri.ln_in.weight", C);
    L.lnb = zeros(n + ".tri.ln_in.bias", C);
    L.wag = w(n + ".tri.a_gate.weight", H, C);
    L.bag = b(n + ".tri.a_gate.bias", H);
    L.wa = w(n + ".tri.a_proj.weight", H, C);
    L.ba = b(n + ".tri.a_proj.bias", H);
    L.wbg = w(n + ".tri.b_gate.weight", H, C);
    L.bbg = b(n + ".tri.b_gate.bias", H);
    L.wb = w(n + ".tri.b_proj.weight", H, C);
    L.bb = b(n + ".tri.b_proj.bias", H);
    L.lnxw = ones(n + ".tri.ln_out.weight", H);
    L.lnxb = zeros(n + ".tri.ln_out.bias", H);
    L.wo = w(n + ".tri.out.weight", C, H);
    L.bo = b(n + ".tri.out.bias", C);
    L.wg = w(n + ".tri.gate.weight", C, C);
    L.bg = b(n + ".tri.gate.bias", C);
    L.lntw = ones(n + ".transition.ln.weight", C);
    L.lntb = zeros(n + ".transition.ln.bias", C);
    L.w1 = w(n + ".transition.w1.weight", 4 * C, C);
    L.b1 = b(n + ".transition.w1.bias", 4 * C);
    L.w2 = w(n + ".transition.w2.weight", C, 4 * C);
    L.b2 = b(n + ".transition.w2.bias", C);
    layers_.push_back(L);
  }
  input_ = makeNormal({s.batch, s.n, s.n, C}, dtype, seed, 1000, InputMode::kRandom);
  target_ = makeNormal({s.batch, s.n, s.n, C}, dtype, seed, 1001, InputMode::kRandom);
}

at::Tensor PairStack::normIn(int l, const at::Tensor& z) const {
  const auto& L = layers_[l];
  return at::layer_norm(z, {shape.c}, L.lnw, L.lnb, 1e-5);
}

at::Tensor PairStack::projA(int l, const at::Tensor& zn) const {
  const auto& L = layers_[l];
  return at::sigmoid(at::linear(zn, L.wag, L.bag)) * at::linear(zn, L.wa, L.ba);
}

at::Tensor PairStack::projB(int l, const at::Tensor& zn) const {
  const auto& L = layers_[l];
  return at::sigmoid(at::linear(zn, L.wbg, L.bbg)) * at::linear(zn, L.wb, L.bb);
}

at::Tensor PairStack::triangleOut(int l, const at::Tensor& a, const at::Tensor& b,
                                  const at::Tensor& znOut) const {
  const auto& L = layers_[l];
  const at::Tensor x = at::einsum("bikh,bjkh->bijh", {a, b});
  const at::Tensor o =
      at::linear(at::layer_norm(x, {shape.hidden}, L.lnxw, L.lnxb, 1e-5), L.wo, L.bo);
  return at::sigmoid(at::linear(znOut, L.wg, L.bg)) * o;
}

at::Tensor PairStack::transition(int l, const at::Tensor& z) const {
  const auto& L = layers_[l];
  const at::Tensor h = at::layer_norm(z, {shape.c}, L.lntw, L.lntb, 1e-5);
  return z + at::linear(at::relu(at::linear(h, L.w1, L.b1)), L.w2, L.b2);
}

at::Tensor PairStack::layer(int l, const at::Tensor& z) const {
  const at::Tensor zn = normIn(l, z);
  const at::Tensor u = z + triangleOut(l, projA(l, zn), projB(l, zn), zn);
  return transition(l, u);
}

at::Tensor PairStack::forward(const at::Tensor& z) const {
  at::Tensor h = z;
  for (int l = 0; l < layers(); ++l) h = layer(l, h);
  return h;
}

void PairStack::zeroGrad() const { zeroGrads(params_); }

namespace {

class EvoformerPair final : public Workload {
 public:
  std::string name() const override { return "evoformer_pair"; }
  std::string description() const override {
    return "Evoformer-style pair stack: triangle multiplicative update and transition on "
           "[batch, n, n, c]";
  }
  void validate(const nlohmann::json& shape) const override { PairShape::parse(shape); }
  std::string shapeString(const nlohmann::json& shape) const override {
    return PairShape::parse(shape).toString();
  }
  WorkloadData build(const nlohmann::json& shape, at::ScalarType dtype, uint64_t seed,
                     InputMode) const override {
    const auto s = PairShape::parse(shape);
    return referenceStep(PairStack(s, dtype, seed), s.training);
  }
};

}  // namespace

const Workload* evoformerPairWorkload() {
  static const EvoformerPair w;
  return &w;
}

}  // namespace sb::reference
