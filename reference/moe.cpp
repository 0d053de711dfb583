#include "reference/moe.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>
#include <vector>

#include "reference/autograd_engine.h"
#include "reference/training.h"

namespace sb::reference {
namespace {

int64_t positiveInt(const nlohmann::json& shape, const char* key, int64_t dflt, int64_t hi) {
  if (!shape.contains(key)) return dflt;
  const auto& v = shape.at(key);
  if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() > hi) {
    throw std::invalid_argument(std::string("moe: ") + key + " must be a whole number from 1 to " +
                                std::to_string(hi) + ", got " + v.dump());
  }
  return v.get<int64_t>();
}

std::string oneOf(const nlohmann::json& shape, const char* key, const std::string& dflt,
                  const std::vector<std::string>& allowed) {
  if (!shape.contains(key)) return dflt;
  const auto& v = shape.at(key);
  if (v.is_string() && std::count(allowed.begin(), allowed.end(), v.get<std::string>())) {
    return v.get<std::string>();
  }
  std::string list;
  for (const auto& a : allowed) list += (list.empty() ? "" : " or ") + a;
  throw std::invalid_argument(std::string("moe: ") + key + " must be " + list + ", got " +
                              v.dump());
}

WorkloadData moeInputs(const MoeShape& s, at::ScalarType dtype, uint64_t seed, InputMode mode) {
  const int64_t T = s.tokens(), D = s.dModel, F = s.ffn, E = s.experts;
  const double inBound = 1.0 / std::sqrt(static_cast<double>(D));
  WorkloadData d;
  d.inputs["input"] = makeNormal({T, D}, dtype, seed, 0, mode);
  d.inputs["router"] = makeUniform({E, D}, inBound, dtype, seed, 1, mode);
  d.inputs["w1"] = makeUniform({E, F, D}, inBound, dtype, seed, 2, mode);
  d.inputs["w3"] = makeUniform({E, F, D}, inBound, dtype, seed, 3, mode);
  d.inputs["w2"] = makeUniform({E, D, F}, 1.0 / std::sqrt(static_cast<double>(F)), dtype, seed, 4,
                               mode);
  d.inputs["grad_output"] = makeNormal({T, D}, dtype, seed, 5, mode);
  return d;
}

class MoeWorkload final : public Workload {
 public:
  std::string name() const override { return "moe"; }
  std::string description() const override {
    return "a mixture-of-experts layer: a router's top-k over SwiGLU experts, dropless or with a "
           "capacity, with Switch's load-balancing loss";
  }
  void validate(const nlohmann::json& shape) const override { MoeShape::parse(shape); }
  std::string shapeString(const nlohmann::json& shape) const override {
    const auto s = MoeShape::parse(shape);
    std::string out = "tokens=" + std::to_string(s.batch) + "x" + std::to_string(s.seq) +
                      ";d_model=" + std::to_string(s.dModel) + ";ffn=" + std::to_string(s.ffn) +
                      ";experts=" + std::to_string(s.experts) + ";k=" + std::to_string(s.topK) +
                      ";score=" + (s.sigmoid ? "sigmoid" : "softmax");
    if (s.normTopk) out += ";norm_topk=1";
    out += s.capacity() < 0 ? ";dropless"
                            : ";capacity=" + std::to_string(s.capacity()) +
                                  (s.dropByPosition ? ";drop=position" : ";drop=probability");
    return out;
  }

  WorkloadData build(const nlohmann::json& shape, at::ScalarType dtype, uint64_t seed,
                     InputMode mode) const override {
    const auto s = MoeShape::parse(shape);
    WorkloadData d = moeInputs(s, dtype, seed, mode);
    at::Tensor x = d.inputs["input"].clone().set_requires_grad(true);
    at::Tensor router = d.inputs["router"].clone().set_requires_grad(true);
    at::Tensor w1 = d.inputs["w1"].clone().set_requires_grad(true);
    at::Tensor w3 = d.inputs["w3"].clone().set_requires_grad(true);
    at::Tensor w2 = d.inputs["w2"].clone().set_requires_grad(true);
    const MoeForward f = moeForward(s, x, router, w1, w3, w2);
    const at::Tensor loss = (f.output * d.inputs["grad_output"]).sum() + s.auxCoef * f.aux;
    backward({loss});

    d.expected["output"] = f.output.detach();
    d.expected["aux_loss"] = f.aux.detach().reshape({1});
    d.expected["expert_index"] = f.expertIndex.to(dtype);
    d.expected["kept"] = f.kept.to(dtype);
    d.expected["tokens_per_expert"] = f.tokensPerExpert.to(dtype);
    d.expected["grad_input"] = x.grad();
    d.expected["grad_router"] = router.grad();
    d.expected["grad_w1"] = w1.grad();
    d.expected["grad_w3"] = w3.grad();
    d.expected["grad_w2"] = w2.grad();
    d.checked = {"output",     "aux_loss",    "expert_index", "kept",    "tokens_per_expert",
                 "grad_input", "grad_router", "grad_w1",      "grad_w3", "grad_w2"};
    return d;
  }
};

}  // namespace

at::Tensor moeExpert(const at::Tensor& x, const at::Tensor& w1, const at::Tensor& w3,
                     const at::Tensor& w2) {
  return at::linear(at::silu(at::linear(x, w1)) * at::linear(x, w3), w2);
}

MoeForward moeForward(const MoeShape& s, const at::Tensor& x, const at::Tensor& router,
                      const at::Tensor& w1, const at::Tensor& w3, const at::Tensor& w2) {
  const int64_t T = s.tokens(), E = s.experts, k = s.topK;
  const at::Tensor logits = at::linear(x, router);
  const at::Tensor probs = s.sigmoid ? at::sigmoid(logits) : at::softmax(logits, -1);
  const auto [vals, idx] = at::topk(probs, k, -1);
  const at::Tensor gates = s.normTopk ? vals / vals.sum(-1, true) : vals;

  // Which assignments (token t, slot j) each expert keeps: all, or the first `capacity` in
  // the drop policy's order.
  const at::Tensor idxCpu = idx.cpu().contiguous();
  const at::Tensor valCpu = vals.detach().to(at::kDouble).cpu().contiguous();
  const int64_t* ix = idxCpu.data_ptr<int64_t>();
  const double* vx = valCpu.data_ptr<double>();
  std::vector<uint8_t> keep(static_cast<size_t>(T * k), 1);
  const int64_t cap = s.capacity();
  if (cap >= 0) {
    for (int64_t e = 0; e < E; ++e) {
      std::vector<int64_t> mine;  // flat t * k + j
      for (int64_t a = 0; a < T * k; ++a) {
        if (ix[a] == e) mine.push_back(a);
      }
      if (!s.dropByPosition) {
        std::stable_sort(mine.begin(), mine.end(),
                         [vx](int64_t a, int64_t b) { return vx[a] > vx[b]; });
      }
      for (size_t i = static_cast<size_t>(cap); i < mine.size(); ++i) keep[mine[i]] = 0;
    }
  }

  // The output: each expert on its kept tokens, gated, added in expert order.
  at::Tensor y = at::zeros_like(x);
  std::vector<double> perExpert(static_cast<size_t>(E), 0.0), routed(static_cast<size_t>(E), 0.0);
  for (int64_t e = 0; e < E; ++e) {
    std::vector<int64_t> tok, slot;
    for (int64_t a = 0; a < T * k; ++a) {
      if (ix[a] != e) continue;
      routed[e] += 1;
      if (!keep[a]) continue;
      tok.push_back(a / k);
      slot.push_back(a % k);
    }
    perExpert[e] = static_cast<double>(tok.size());
    if (tok.empty()) continue;
    const at::Tensor t = at::tensor(tok, at::kLong).to(x.device());
    const at::Tensor j = at::tensor(slot, at::kLong).to(x.device());
    const at::Tensor out = moeExpert(x.index_select(0, t), w1[e], w3[e], w2[e]);
    y = y.index_add(0, t, out * gates.index({t, j}).unsqueeze(1));
  }
  // Switch's load-balancing loss over the assignments before dropping.
  const at::Tensor f = at::tensor(routed, at::kDouble).to(x.device()).to(x.scalar_type()) /
                       static_cast<double>(T * k);
  const at::Tensor p = (s.sigmoid ? probs / probs.sum(-1, true) : probs).mean(0);
  MoeForward out;
  out.output = y;
  out.aux = static_cast<double>(E) * (f * p).sum();
  out.expertIndex = idx;
  out.kept = at::tensor(std::vector<double>(keep.begin(), keep.end()), at::kDouble)
                 .reshape({T, k})
                 .to(x.device());
  out.tokensPerExpert = at::tensor(perExpert, at::kDouble).to(x.device());
  return out;
}

WorkloadData buildMoeTraining(const nlohmann::json& shape, at::ScalarType dtype, uint64_t seed,
                              InputMode mode, const TrainingSpec& training) {
  const auto s = MoeShape::parse(shape);
  WorkloadData d = moeInputs(s, dtype, seed, mode);
  d.inputs["target"] = d.inputs.at("grad_output");
  std::vector<std::pair<std::string, at::Tensor>> params;
  for (const char* name : {"router", "w1", "w3", "w2"}) {
    params.emplace_back(name, d.inputs.at(name).clone().requires_grad_(true));
  }
  TrainingLoop loop(training, params);
  std::vector<at::Tensor> index, kept, perExpert;
  for (int step = 0; step < training.steps; ++step) {
    for (auto& [name, p] : params) p.mutable_grad() = at::Tensor();
    const MoeForward f = moeForward(s, d.inputs.at("input"), params[0].second, params[1].second,
                                    params[2].second, params[3].second);
    index.push_back(f.expertIndex.to(dtype));
    kept.push_back(f.kept.to(dtype));
    perExpert.push_back(f.tokensPerExpert.to(dtype));
    const at::Tensor loss = (f.output * d.inputs.at("target")).sum() + s.auxCoef * f.aux;
    backward({loss});
    loop.update(loss.item<double>());
  }
  loop.write(d.expected, &d.checked);
  // Every step's routing, as the parameters of that step chose it.
  d.expected["expert_index"] = at::stack(index);
  d.expected["kept"] = at::stack(kept);
  d.expected["tokens_per_expert"] = at::stack(perExpert);
  for (const char* name : {"expert_index", "kept", "tokens_per_expert"}) d.checked.push_back(name);
  return d;
}

int64_t MoeShape::capacity() const {
  if (capacityFactor <= 0) return -1;
  return static_cast<int64_t>(
      std::ceil(static_cast<double>(tokens() * topK) / static_cast<double>(experts) * capacityFactor));
}

MoeShape MoeShape::parse(const nlohmann::json& shape) {
  if (!shape.is_object()) throw std::invalid_argument("moe: shape must be a mapping");
  static const std::vector<std::string> keys = {
      "batch", "seq", "d_model", "ffn", "experts", "top_k", "score", "norm_topk",
      "capacity_factor", "drop", "aux_coef"};
  for (auto it = shape.begin(); it != shape.end(); ++it) {
    if (!std::count(keys.begin(), keys.end(), it.key())) {
      throw std::invalid_argument("moe: unknown shape key '" + it.key() +
                                  "' (expected batch, seq, d_model, ffn, experts, top_k, score, "
                                  "norm_topk, capacity_factor, drop, aux_coef)");
    }
  }
  MoeShape s;
  s.batch = positiveInt(shape, "batch", s.batch, 1 << 16);
  s.seq = positiveInt(shape, "seq", s.seq, 1 << 20);
  s.dModel = positiveInt(shape, "d_model", s.dModel, 1 << 16);
  s.ffn = positiveInt(shape, "ffn", s.ffn, 1 << 18);
  s.experts = positiveInt(shape, "experts", s.experts, 1024);
  s.topK = positiveInt(shape, "top_k", s.topK, 1024);
  if (s.topK > s.experts) {
    throw std::invalid_argument("moe: top_k (" + std::to_string(s.topK) +
                                ") must be at most experts (" + std::to_string(s.experts) + ")");
  }
  if (s.tokens() * s.dModel > (int64_t{1} << 28) || s.experts * s.ffn * s.dModel > (int64_t{1} << 28)) {
    throw std::invalid_argument("moe: tokens x d_model and experts x ffn x d_model must be at most 2^28");
  }
  s.sigmoid = oneOf(shape, "score", "softmax", {"softmax", "sigmoid"}) == "sigmoid";
  if (shape.contains("norm_topk")) {
    if (!shape.at("norm_topk").is_boolean()) {
      throw std::invalid_argument("moe: norm_topk must be true or false, got " +
                                  shape.at("norm_topk").dump());
    }
    s.normTopk = shape.at("norm_topk").get<bool>();
  }
  if (shape.contains("capacity_factor")) {
    const auto& v = shape.at("capacity_factor");
    if (!v.is_number() || !(v.get<double>() >= 0) || v.get<double>() > 1024) {
      throw std::invalid_argument(
          "moe: capacity_factor must be a number from 0 (dropless) to 1024, got " + v.dump());
    }
    s.capacityFactor = v.get<double>();
  }
  s.dropByPosition = oneOf(shape, "drop", "probability", {"probability", "position"}) == "position";
  if (shape.contains("aux_coef")) {
    const auto& v = shape.at("aux_coef");
    if (!v.is_number() || !(v.get<double>() >= 0) || v.get<double>() > 1e6) {
      throw std::invalid_argument("moe: aux_coef must be a number from 0 to 1e6, got " + v.dump());
    }
    s.auxCoef = v.get<double>();
  }
  return s;
}

const Workload* moeWorkload() {
  static const MoeWorkload w;
  return &w;
}

}  // namespace sb::reference
