// Element-wise operators: add and mul (ColossalAI's BinaryElementwiseStrategyGenerator, 9
// strategies for a 2-D output, a broadcast operand replicated along its broadcast dimensions)
// and gelu, relu and silu (one strategy per layout of their input). Each rank computes on its
// pieces as on the whole tensor (the reference's forward).

#include <numeric>

#include "strategies/sharding/ops/op_rule.h"
#include "strategies/sharding/ops/op_specs_common.h"

namespace sb::strategies {
namespace {

using harness::Layout;
using Axes = std::vector<int>;

// The layout of an operand of `shape` broadcast to an output laid out as `out`: its
// broadcast dimensions (missing or of extent 1) are replicated.
Layout broadcastLayout(const std::vector<Axes>& out, const std::vector<int64_t>& outShape,
                       const std::vector<int64_t>& shape) {
  const size_t off = outShape.size() - shape.size();
  std::vector<Axes> d(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == outShape[off + i]) d[i] = out[off + i];
  }
  return L(d);
}

std::vector<OpStrategySpec> binarySpecs(const reference::OpShape& s) {
  const auto outShape = s.outputs()[0];
  std::vector<int> dims(outShape.size());
  std::iota(dims.begin(), dims.end(), 0);
  std::vector<OpStrategySpec> out;
  for (const auto& sp : enumerateSplits(dims)) {
    const auto d = dimsOf(sp, static_cast<int>(dims.size()));
    const Layout a = broadcastLayout(d, outShape, s.input),
                 b = broadcastLayout(d, outShape, s.other);
    OpStrategySpec e =
        spec(s, seqOf(d) + " = " + a.compact() + " x " + b.compact(), {a, b}, {L(d)}, sp.meshDims);
    // ColossalAI spells every operand with the output's (logical, broadcast) sequence.
    const std::string o = colossalSeq(L(d));
    e.colossalName = o + " = " + o + " <binary-elementwise-op> " + o;
    out.push_back(e);
  }
  return out;
}

// The output, then each operand's gradient: mul's broadcast operand's through the full
// product (`productGradient`).
void binaryMemory(MemoryReplay& m, bool productGradient) {
  m.dropPreviousResults(false, false);
  m.alloc(m.O);
  m.backwardBegins();
  for (size_t i = 0; i < m.leaves.size(); ++i) {
    const bool broadcast = m.leaves[i].numel() != m.outputBoxes[0].numel();
    if (productGradient && broadcast) {
      m.alloc(m.O);  // the full product, then summed to the operand's shape
      m.alloc(m.g[i]);
      m.release(m.O);
    } else {
      m.alloc(m.g[i]);
    }
  }
  m.gradAllReduces();
}

// gelu, relu, silu: the output, then the input's gradient.
void unaryMemory(MemoryReplay& m) {
  m.dropPreviousResults(false, false);
  m.alloc(m.O);
  m.backwardBegins();
  m.alloc(m.sumG);
}

OpRule elementwiseRule(nlohmann::json canonical,
                       std::function<std::vector<OpStrategySpec>(const reference::OpShape&)> specs,
                       std::function<void(MemoryReplay&)> memory) {
  OpRule r;
  r.canonicalShapes = [canonical] { return std::vector<nlohmann::json>{canonical}; };
  r.specs = std::move(specs);
  r.layouts = keepLayouts;
  r.faults = [](const OpStrategySpec& sp) { return commonFaults(sp, {}); };
  r.forward = referenceForward;
  r.memory = std::move(memory);
  r.flops = noFlops;
  r.statistics = noStatistics;
  r.reductionLength = noReduction;
  return r;
}

std::vector<OpStrategySpec> unarySpecs(const reference::OpShape& s) {
  return followingSpecs(s, false, sameLayout);
}

}  // namespace
}  // namespace sb::strategies

SB_REGISTER_OP_RULE("add", sb::strategies::elementwiseRule(
                               {{"op", "add"}, {"input", {8, 16}}, {"other", {16}}},
                               sb::strategies::binarySpecs, [](sb::strategies::MemoryReplay& m) {
                                 sb::strategies::binaryMemory(m, false);
                               }));
SB_REGISTER_OP_RULE("mul", sb::strategies::elementwiseRule(
                               {{"op", "mul"}, {"input", {8, 16}}, {"other", {8, 16}}},
                               sb::strategies::binarySpecs, [](sb::strategies::MemoryReplay& m) {
                                 sb::strategies::binaryMemory(m, true);
                               }));
SB_REGISTER_OP_RULE("gelu", sb::strategies::elementwiseRule({{"op", "gelu"}, {"input", {8, 16}}},
                                                            sb::strategies::unarySpecs,
                                                            sb::strategies::unaryMemory));
SB_REGISTER_OP_RULE("relu", sb::strategies::elementwiseRule({{"op", "relu"}, {"input", {8, 16}}},
                                                            sb::strategies::unarySpecs,
                                                            sb::strategies::unaryMemory));
SB_REGISTER_OP_RULE("silu", sb::strategies::elementwiseRule({{"op", "silu"}, {"input", {8, 16}}},
                                                            sb::strategies::unarySpecs,
                                                            sb::strategies::unaryMemory));
