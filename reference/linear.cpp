// The Linear reference: y = x W^T + b, forward and backward with plain LibTorch autograd.
// The backward starts from a deterministic grad_output (not from a loss), so that every
// element of every gradient depends on the inputs in a way a sharding bug would disturb.

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <cmath>

#include "reference/block.h"
#include "reference/chain_nets.h"
#include "reference/evoformer.h"
#include "reference/graph.h"
#include "reference/moe.h"
#include "reference/ops.h"
#include "reference/transformer.h"
#include "reference/workload.h"

namespace sb::reference {

LinearShape LinearShape::parse(const nlohmann::json& shape) {
  TORCH_CHECK(shape.is_object(), "linear: shape must be a mapping with keys input, out_features",
              " and optionally bias");
  for (auto it = shape.begin(); it != shape.end(); ++it) {
    TORCH_CHECK(it.key() == "input" || it.key() == "out_features" || it.key() == "bias",
                "linear: unknown shape key '", it.key(), "' (expected input, out_features, bias)");
  }
  TORCH_CHECK(shape.contains("input"),
              "linear: shape key 'input' is missing (expected a list "
              "of dimensions such as [4, 4, 4, 16])");
  const auto& in = shape.at("input");
  TORCH_CHECK(in.is_array() && in.size() >= 2,
              "linear: shape key 'input' must be a list of at "
              "least 2 positive dimensions, got ",
              in.dump());
  LinearShape s;
  for (const auto& d : in) {
    TORCH_CHECK(d.is_number_integer() && d.get<int64_t>() > 0,
                "linear: shape key 'input' must "
                "hold positive integers, got ",
                in.dump());
    s.input.push_back(d.get<int64_t>());
  }
  s.inFeatures = s.input.back();
  TORCH_CHECK(shape.contains("out_features"), "linear: shape key 'out_features' is missing");
  const auto& out = shape.at("out_features");
  TORCH_CHECK(out.is_number_integer() && out.get<int64_t>() > 0,
              "linear: shape key 'out_features' must be a positive integer, got ", out.dump());
  s.outFeatures = out.get<int64_t>();
  if (shape.contains("bias")) {
    TORCH_CHECK(shape.at("bias").is_boolean(),
                "linear: shape key 'bias' must be true or false, "
                "got ",
                shape.at("bias").dump());
    s.bias = shape.at("bias").get<bool>();
  }
  // The input, the weight and the output: at most 2^40 elements each, as the chains' shapes (an
  // out_features of 2^63 - 1 reached the reference, which failed on a storage size overflow and
  // was blamed for it).
  constexpr int64_t kMax = int64_t{1} << 40;
  const auto within = [&](int64_t a, int64_t b) { return a <= kMax / b; };
  int64_t rows = 1;
  bool fits = within(s.inFeatures, s.outFeatures);
  for (size_t i = 0; fits && i + 1 < s.input.size(); ++i) {
    fits = within(rows, s.input[i]);
    if (fits) rows *= s.input[i];
  }
  fits = fits && within(rows, s.inFeatures) && within(rows, s.outFeatures);
  TORCH_CHECK(fits, "linear: shape keys input ", in.dump(), " and out_features ", out.dump(),
              " make a tensor of more than 2^40 elements (the input, the weight in_features x "
              "out_features, or the output)");
  return s;
}

std::vector<int64_t> LinearShape::output() const {
  auto o = input;
  o.back() = outFeatures;
  return o;
}

int64_t LinearShape::rows() const {
  int64_t n = 1;
  for (size_t i = 0; i + 1 < input.size(); ++i) n *= input[i];
  return n;
}

namespace {

class LinearWorkload final : public Workload {
 public:
  std::string name() const override { return "linear"; }
  std::string description() const override {
    return "y = x W^T + b (torch.nn.Linear), forward and backward";
  }
  void validate(const nlohmann::json& shape) const override { LinearShape::parse(shape); }
  std::string shapeString(const nlohmann::json& shape) const override {
    const auto s = LinearShape::parse(shape);
    return "input=" + dimsString(s.input) + ";out=" + std::to_string(s.outFeatures) +
           ";bias=" + (s.bias ? "1" : "0");
  }

  WorkloadData build(const nlohmann::json& shape, at::ScalarType dtype, uint64_t seed,
                     InputMode mode) const override {
    const auto s = LinearShape::parse(shape);
    // nn.Linear's initialisation bound, so random-mode values have the usual scale.
    const double bound = 1.0 / std::sqrt(static_cast<double>(s.inFeatures));
    WorkloadData d;
    d.inputs["input"] = makeNormal(s.input, dtype, seed, 0, mode);
    d.inputs["weight"] = makeUniform(s.weight(), bound, dtype, seed, 1, mode);
    if (s.bias) d.inputs["bias"] = makeUniform({s.outFeatures}, bound, dtype, seed, 2, mode);
    d.inputs["grad_output"] = makeNormal(s.output(), dtype, seed, 3, mode);

    at::Tensor x = d.inputs["input"].clone().set_requires_grad(true);
    at::Tensor w = d.inputs["weight"].clone().set_requires_grad(true);
    at::Tensor b = s.bias ? d.inputs["bias"].clone().set_requires_grad(true) : at::Tensor();
    at::Tensor y = at::linear(x, w, b);
    torch::autograd::backward({y}, {d.inputs["grad_output"]});

    d.expected["output"] = y.detach();
    d.expected["grad_input"] = x.grad();
    d.expected["grad_weight"] = w.grad();
    d.checked = {"output", "grad_input", "grad_weight"};
    if (s.bias) {
      d.expected["grad_bias"] = b.grad();
      d.checked.push_back("grad_bias");
    }
    return d;
  }
};

}  // namespace

const Workload* findWorkload(const std::string& name) {
  static const LinearWorkload linear;
  if (name == linear.name()) return &linear;
  if (name == tensorWorkload()->name()) return tensorWorkload();
  if (name == opWorkload()->name()) return opWorkload();
  if (name == blockWorkload()->name()) return blockWorkload();
  if (name == gpt2PrefillWorkload()->name()) return gpt2PrefillWorkload();
  if (name == vitEncoderWorkload()->name()) return vitEncoderWorkload();
  if (name == evoformerPairWorkload()->name()) return evoformerPairWorkload();
  if (name == moeWorkload()->name()) return moeWorkload();
  if (const Workload* g = findGraphWorkload(name)) return g;
  return findChainWorkload(name);
}

std::vector<std::string> workloadNames() {
  std::vector<std::string> names = {"linear",
                                    "tensor",
                                    "op",
                                    "transformer_block",
                                    "gpt2_prefill",
                                    "vit_encoder",
                                    "evoformer_pair",
                                    "moe",
                                    "gpt2",
                                    "bert",
                                    "mlp",
                                    "llama",
                                    "torchscript"};
  for (const Workload* w : chainWorkloads()) names.push_back(w->name());
  return names;
}

}  // namespace sb::reference
