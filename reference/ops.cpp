// The "op" reference workload: one operator, forward and backward with plain LibTorch (ops.h);
// its shape's grammar is op_shape.cpp's.

#include "reference/ops.h"

#include "reference/torchscript/aten_op.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <cmath>
#include <functional>
#include <numeric>

namespace sb::reference {

at::Tensor dropoutKeepMask(const std::vector<int64_t>& fullShape,
                           const std::vector<int64_t>& offset, const std::vector<int64_t>& length,
                           uint64_t seed, double p, at::ScalarType dtype) {
  const auto opts = caseOptions(at::kLong);
  const int64_t nd = static_cast<int64_t>(fullShape.size());
  // The row-major index in the full tensor of every element of the box, then splitmix64 of
  // (seed, index) in place, its logical shifts made of arithmetic ones and masks. In place, so
  // that it holds at most two int64 tensors of the box's size (the memory models count them).
  at::Tensor z = at::zeros(length, opts);
  int64_t stride = 1;
  for (int64_t d = nd - 1; d >= 0; --d) {
    std::vector<int64_t> view(nd, 1);
    view[d] = length[d];
    z.add_(at::arange(offset[d], offset[d] + length[d], opts).mul_(stride).view(view));
    stride *= fullShape[d];
  }
  const auto shr = [](const at::Tensor& t, int k) {
    return at::__rshift__(t, k).bitwise_and_(static_cast<int64_t>((~0ull) >> k));
  };
  z.mul_(static_cast<int64_t>(0x9E3779B97F4A7C15ull))
      .add_(static_cast<int64_t>(seed * 0xD1B54A32D192ED03ull));
  z.bitwise_xor_(shr(z, 30)).mul_(static_cast<int64_t>(0xBF58476D1CE4E5B9ull));
  z.bitwise_xor_(shr(z, 27)).mul_(static_cast<int64_t>(0x94D049BB133111EBull));
  z.bitwise_xor_(shr(z, 31));
  at::Tensor bits = shr(z, 11);
  z.reset();
  at::Tensor u = bits.to(at::kDouble);
  bits.reset();
  u.mul_(std::ldexp(1.0, -53));
  at::Tensor keep = u.ge(p);
  u.reset();
  return keep.to(dtype);
}

std::vector<at::Tensor> opForward(const OpShape& s, const std::map<std::string, at::Tensor>& t,
                                  uint64_t seed) {
  if (s.op == "aten") {
    std::vector<at::Tensor> operands;
    for (const auto& name : s.operands()) operands.push_back(t.at(name));
    return atenForward(s, operands);
  }
  const at::Tensor& x = t.at("input");
  const auto get = [&](const char* name) {
    const auto it = t.find(name);
    return it == t.end() ? at::Tensor() : it->second;
  };
  const at::Tensor other = get("other"), w = get("weight"), b = get("bias");
  const std::string& op = s.op;
  if (op == "addmm") return {at::addmm(b, x, other)};
  if (op == "mm") return {at::mm(x, other)};
  if (op == "rms_norm") return {rmsNorm(x, w)};
  if (op == "rope") return {rotary(x, 0, s.theta())};
  if (op == "bmm") return {at::bmm(x, other)};
  if (op == "matmul") return {at::matmul(x, other)};
  if (op == "embedding") return {at::embedding(w, x)};
  if (op == "layer_norm") return {at::layer_norm(x, {s.input.back()}, w, b, 1e-5)};
  if (op == "batch_norm") {
    return {at::batch_norm(x, w, b, {}, {}, /*training=*/true, 0.1, 1e-5, false)};
  }
  if (op == "conv2d") {
    const int64_t st = s.stride(), p = s.padding();
    return {at::conv2d(x, w, b, {st, st}, {p, p})};
  }
  if (op == "max_pool2d" || op == "avg_pool2d") {
    const int64_t k = s.kernel(), st = s.stride();
    return {op == "max_pool2d" ? at::max_pool2d(x, {k, k}, {st, st})
                               : at::avg_pool2d(x, {k, k}, {st, st})};
  }
  if (op == "add") return {x + other};
  if (op == "mul") return {x * other};
  if (op == "gelu") return {at::gelu(x)};
  if (op == "relu") return {at::relu(x)};
  if (op == "silu") return {at::silu(x)};
  if (op == "dropout") {
    const double p = s.attrDouble("p");
    std::vector<int64_t> zero(s.input.size(), 0);
    return {
        x *
        dropoutKeepMask(s.input, zero, s.input, seed, p, x.scalar_type()).mul_(1.0 / (1.0 - p))};
  }
  if (op == "softmax") {
    return {attentionSoftmax(x, s.reducedDims()[0], s.scale(), s.causal(), 0, s.queryGroup())};
  }
  if (op == "view" || op == "reshape") return {x.reshape(s.outputs()[0])};
  if (op == "getitem") {
    const auto [start, stop] = s.rows();
    if (s.attrs.at("index").is_number_integer()) return {x.select(0, start)};
    return {x.slice(0, start, stop)};
  }
  if (op == "permute" || op == "transpose") return {x.permute(s.permutation())};
  if (op == "contiguous") return {x.contiguous()};
  if (op == "split") {
    auto parts = x.split(s.attrInt("split_size"), s.reducedDims()[0]);
    return std::vector<at::Tensor>(parts.begin(), parts.end());
  }
  if (op == "sum") return {x.sum(s.reducedDims())};
  TORCH_CHECK(false, "op: no reference for ", op);
}

namespace {

class OpWorkload final : public Workload {
 public:
  std::string name() const override { return "op"; }
  std::string description() const override {
    return "one operator (addmm, bmm, embedding, layer_norm, conv2d, softmax, ...), forward and "
           "backward";
  }
  void validate(const nlohmann::json& shape) const override {
    const OpShape s = OpShape::parse(shape);
    // Its memory and cost are not modelled alone: it runs inside imported graphs only.
    TORCH_CHECK(s.op != "aten", "op: 'aten' is an imported model's operator without a ",
                "strategy set; it runs inside a torchscript workload's graph, not alone");
    s.outputs();
  }
  std::string shapeString(const nlohmann::json& shape) const override {
    return OpShape::parse(shape).toString();
  }

  WorkloadData build(const nlohmann::json& shape, at::ScalarType dtype, uint64_t seed,
                     InputMode mode) const override {
    const OpShape s = OpShape::parse(shape);
    WorkloadData d;
    int stream = 0;
    for (const std::string& name : s.operands()) {
      const auto& dims = s.operandShape(name);
      if (s.op == "embedding" && name == "input") {
        // Ids spread over the whole vocabulary, so every vocabulary shard sees some.
        const at::Tensor u =
            makeUniformAsDrawn(dims, 1.0, seed, stream++);
        d.inputs[name] = u.add(1)
                             .mul(0.5 * static_cast<double>(s.weight[0]))
                             .floor()
                             .clamp(0, static_cast<double>(s.weight[0] - 1))
                             .to(at::kLong);
      } else if (name == "weight" || name == "bias") {
        // Layer and batch norm start near their identity, as nn initialises them.
        const bool norm = s.op == "layer_norm" || s.op == "batch_norm";
        at::Tensor v = makeUniform(
            dims,
            norm ? 0.5
                 : 1.0 / std::sqrt(
                             static_cast<double>(std::accumulate(dims.begin(), dims.end(),
                                                                 int64_t{1}, std::multiplies<>()) /
                                                 dims[0])),
            dtype, seed, stream++, mode);
        if (norm && name == "weight" && mode == InputMode::kRandom) v = asCaseValues(v.add(1));
        d.inputs[name] = v;
      } else {
        d.inputs[name] = makeNormal(dims, dtype, seed, stream++, mode);
      }
    }
    const auto outputs = s.outputs();
    const auto outNames = s.outputNames();
    for (size_t i = 0; i < outputs.size(); ++i) {
      d.inputs["grad_" + outNames[i]] = makeNormal(outputs[i], dtype, seed, 10 + i, mode);
    }

    std::map<std::string, at::Tensor> leaves;
    for (const std::string& name : s.operands()) {
      leaves[name] = d.inputs[name].clone();
      if (s.differentiable(name)) leaves[name].set_requires_grad(true);
    }
    const auto ys = opForward(s, leaves, seed);
    std::vector<at::Tensor> grads;
    for (size_t i = 0; i < ys.size(); ++i) grads.push_back(d.inputs["grad_" + outNames[i]]);
    torch::autograd::backward(ys, grads);
    for (size_t i = 0; i < ys.size(); ++i) {
      d.expected[outNames[i]] = ys[i].detach();
      d.checked.push_back(outNames[i]);
    }
    for (const std::string& name : s.operands()) {
      if (!s.differentiable(name)) continue;
      d.expected["grad_" + name] = leaves[name].grad();
      d.checked.push_back("grad_" + name);
    }
    return d;
  }
};

}  // namespace

const Workload* opWorkload() {
  static const OpWorkload w;
  return &w;
}

}  // namespace sb::reference
