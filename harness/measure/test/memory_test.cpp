#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <map>
#include <string>
#include <thread>
#include <vector>

#include <torch/csrc/autograd/autograd.h>

#include "harness/measure/memory.h"
#include "reference/autograd_facts.h"
#include "reference/ops.h"
#include "reference/torchscript/aten_op.h"

namespace sb::harness {
namespace {

TEST(MemoryTracker, CountsTensorBytesAgainstTheAllocatingRank) {
  auto& m = MemoryTracker::instance();
  m.install();
  ASSERT_TRUE(m.installed());
  const int rank = 5;
  const int64_t before = m.current(rank);
  at::Tensor t;
  {
    ScopedMemoryRank scope(rank);
    m.resetPeak(rank);
    t = at::empty({1000, 250}, at::kFloat);          // exactly 1,000,000 bytes
    at::Tensor tmp = at::empty({500}, at::kDouble);  // 4,000 bytes, freed at scope end
  }
  EXPECT_EQ(m.current(rank) - before, 1000000);
  EXPECT_EQ(m.peak(rank) - before, 1004000);
  // Freed on another thread: still given back to rank 5.
  std::thread([&] { t = at::Tensor(); }).join();
  EXPECT_EQ(m.current(rank), before);
}

TEST(MemoryTracker, UnattributedAllocationsDoNotCountAgainstRanks) {
  auto& m = MemoryTracker::instance();
  m.install();
  const int64_t before = m.current(0);
  at::Tensor t = at::empty({4096}, at::kFloat);
  EXPECT_EQ(m.current(0), before);
}

// The probe the context-parallel memory model asks (reference/autograd_facts.h) against the
// allocator itself: a leaf used by two products gets two fresh gradients of its size in the
// backward, and a third, the sum, only where LibTorch does not add them in place.
TEST(AutogradFacts, TheInPlaceSumProbeAgreesWithTheAllocationsOfABackward) {
  auto& m = MemoryTracker::instance();
  m.install();
  const int rank = 6;
  const int64_t bytes = 4096 * 4;
  int gradients = 0;
  {
    ScopedMemoryRank scope(rank);
    const at::Tensor w = at::zeros({4096}, at::kFloat).set_requires_grad(true);
    const at::Tensor a = w * 2;
    const at::Tensor b = w * 3;
    const at::Tensor loss = (a + b).sum();
    m.setListener(rank, [&](int64_t delta, int64_t, const void*) { gradients += delta == bytes; });
    torch::autograd::backward({loss});
    m.setListener(rank, nullptr);
  }
  EXPECT_TRUE(gradients == 2 || gradients == 3) << gradients << " allocations of the leaf's size";
  EXPECT_EQ(reference::autogradSumsGradientsInPlace(), gradients == 2)
      << gradients << " allocations of the leaf's size in its backward";
}

// The probe of what an imported operator's autograd node keeps (reference/torchscript/aten_op.h,
// which counts references) against the allocator: with the node held, an operand or output it
// saved stays allocated when the last handle outside the node goes, one it did not save is
// freed. pow keeps its input, rsqrt and tanh their result, sum neither (derivatives.yaml, every
// version); mean is the one that differs (1.13 keeps its input, 2.x its element count).
TEST(AutogradFacts, TheAtenSavedProbeAgreesWithTheAllocator) {
  auto& m = MemoryTracker::instance();
  m.install();
  const int rank = 7;
  const std::vector<std::string> shapes = {
      R"({"op": "aten", "schema": "aten::mean.dim", "operands": [[4, 16, 32]], "dtypes": ["float"],
          "args": [{"tensor": 0}, {"ints": [-1]}, {"bool": true}, {"none": true}],
          "outputs": [[4, 16, 1]]})",
      R"({"op": "aten", "schema": "aten::pow.Tensor_Scalar", "operands": [[4, 16, 32]],
          "dtypes": ["float"], "args": [{"tensor": 0}, {"int": 2}], "outputs": [[4, 16, 32]]})",
      R"({"op": "aten", "schema": "aten::rsqrt", "operands": [[4, 16, 32]], "dtypes": ["float"],
          "args": [{"tensor": 0}], "outputs": [[4, 16, 32]]})",
      R"({"op": "aten", "schema": "aten::tanh", "operands": [[64, 32]], "dtypes": ["float"],
          "args": [{"tensor": 0}], "outputs": [[64, 32]]})",
      R"({"op": "aten", "schema": "aten::sum.dim_IntList", "operands": [[4, 16, 32]],
          "dtypes": ["float"], "args": [{"tensor": 0}, {"ints": [1]}, {"bool": false},
          {"none": true}], "outputs": [[4, 32]]})",
      R"({"op": "aten", "schema": "aten::mul.Tensor", "operands": [[8, 32], [8, 32]],
          "dtypes": ["float", "float"], "args": [{"tensor": 0}, {"tensor": 1}],
          "outputs": [[8, 32]]})"};
  // Whether the allocator sees the tensor `which` (an operand's index, or -1: the output) freed
  // when this function lets go of it, the node being held.
  const auto freedWhenDropped = [&](const reference::OpShape& s, int which) {
    ScopedMemoryRank scope(rank);
    std::vector<at::Tensor> in;
    for (const auto& name : s.operands()) {
      in.push_back(at::zeros(s.operandShape(name)).requires_grad_(true).mul(1));
    }
    std::vector<at::Tensor> out = reference::atenForward(s, in);
    const auto node = out.at(0).grad_fn();
    at::Tensor& t = which < 0 ? out[0] : in.at(static_cast<size_t>(which));
    const int64_t bytes = static_cast<int64_t>(t.nbytes());
    const int64_t before = m.current(rank);
    t = at::Tensor();
    const int64_t freed = before - m.current(rank);
    EXPECT_TRUE(freed == 0 || freed == bytes) << s.toString() << ": " << freed << " B freed";
    return freed == bytes;
  };
  std::map<std::string, reference::AtenSaved> probed;
  for (const auto& text : shapes) {
    const reference::OpShape s = reference::OpShape::parse(nlohmann::json::parse(text));
    const reference::AtenSaved saved =
        reference::atenSavedTensors(s, at::kFloat, std::vector<bool>(s.operands().size(), true));
    ASSERT_TRUE(saved.known) << s.toString();
    ASSERT_EQ(saved.operands.size(), s.operands().size());
    for (size_t i = 0; i < saved.operands.size(); ++i) {
      EXPECT_EQ(saved.operands[i], !freedWhenDropped(s, static_cast<int>(i)))
          << s.toString() << ": operand " << i;
    }
    EXPECT_EQ(saved.output, !freedWhenDropped(s, -1)) << s.toString() << ": the output";
    probed[s.attrs.at("schema").get<std::string>()] = saved;
  }
  EXPECT_TRUE(probed.at("aten::pow.Tensor_Scalar").operands[0]);
  EXPECT_FALSE(probed.at("aten::pow.Tensor_Scalar").output);
  EXPECT_TRUE(probed.at("aten::rsqrt").output);
  EXPECT_TRUE(probed.at("aten::tanh").output);
  EXPECT_FALSE(probed.at("aten::sum.dim_IntList").operands[0]);
  EXPECT_FALSE(probed.at("aten::sum.dim_IntList").output);
  EXPECT_TRUE(probed.at("aten::mul.Tensor").operands[0] && probed.at("aten::mul.Tensor").operands[1]);
}

}  // namespace
}  // namespace sb::harness
