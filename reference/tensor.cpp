// The "tensor" reference: one tensor, moved and moved back. Its output is its input and the
// gradient of its input is the gradient of its output, so a redistribution (which only moves
// and sums data) is checked element by element, forward and backward, against the full tensor.

#include <ATen/ATen.h>

#include "reference/workload.h"

namespace sb::reference {

TensorShape TensorShape::parse(const nlohmann::json& shape) {
  TORCH_CHECK(shape.is_object(), "tensor: shape must be a mapping with the key 'tensor'");
  for (auto it = shape.begin(); it != shape.end(); ++it) {
    TORCH_CHECK(it.key() == "tensor", "tensor: unknown shape key '", it.key(),
                "' (expected tensor)");
  }
  TORCH_CHECK(shape.contains("tensor"),
              "tensor: shape key 'tensor' is missing (expected a list of dimensions such as "
              "[8, 6, 4])");
  const auto& t = shape.at("tensor");
  TORCH_CHECK(t.is_array() && !t.empty() && t.size() <= 8,
              "tensor: shape key 'tensor' must be a list of 1 to 8 dimensions, got ", t.dump());
  TensorShape s;
  for (const auto& d : t) {
    TORCH_CHECK(d.is_number_integer() && d.get<int64_t>() >= 0 && d.get<int64_t>() <= (1 << 30),
                "tensor: shape key 'tensor' must hold integers from 0 to 2^30, got ", t.dump());
    s.dims.push_back(d.get<int64_t>());
  }
  return s;
}

namespace {

class TensorWorkload final : public Workload {
 public:
  std::string name() const override { return "tensor"; }
  std::string description() const override {
    return "one tensor redistributed: output = input, grad_input = grad_output";
  }
  void validate(const nlohmann::json& shape) const override { TensorShape::parse(shape); }
  std::string shapeString(const nlohmann::json& shape) const override {
    return "tensor=" + dimsString(TensorShape::parse(shape).dims);
  }
  WorkloadData build(const nlohmann::json& shape, at::ScalarType dtype, uint64_t seed,
                     InputMode mode) const override {
    const auto s = TensorShape::parse(shape);
    WorkloadData d;
    d.inputs["input"] = makeNormal(s.dims, dtype, seed, 0, mode);
    d.inputs["grad_output"] = makeNormal(s.dims, dtype, seed, 1, mode);
    d.expected["output"] = d.inputs["input"].clone();
    d.expected["grad_input"] = d.inputs["grad_output"].clone();
    d.checked = {"output", "grad_input"};
    return d;
  }
};

}  // namespace

const Workload* tensorWorkload() {
  static const TensorWorkload w;
  return &w;
}

}  // namespace sb::reference
