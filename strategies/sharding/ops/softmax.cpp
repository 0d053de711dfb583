// softmax (attention's, with its scale and causal mask): one strategy per layout of its input
// that keeps the softmax dimension whole, as ColossalAI's generator forces it. The planted
// fault shards that dimension, so that each rank normalises over its piece only.

#include <algorithm>

#include "strategies/sharding/ops/op_rule.h"
#include "strategies/sharding/ops/op_specs_common.h"

namespace sb::strategies {
namespace {

void softmaxLayouts(ResolvedOp& r, const harness::DeviceMesh&) {
  if (r.spec.variant == "fault_softmax") {
    // Shard the softmax dimension over the strategy's first axis instead of its own dim.
    const int sd = static_cast<int>(r.shape.reducedDims()[0]);
    const int axis = usedAxes(r.operands[0])[0];
    auto dims = r.operands[0].dimAxes();
    for (auto& d : dims) d.erase(std::remove(d.begin(), d.end(), axis), d.end());
    dims[sd].push_back(axis);
    r.operands = {harness::Layout(dims, {})};
    r.outputs = {harness::Layout(dims, {})};
  }
}

std::vector<at::Tensor> softmaxForward(const LocalForward& f) {
  const reference::OpShape& s = f.r.shape;
  const at::Tensor& x = f.in[0];
  // The causal mask needs the rows' place in the whole tensor (the softmax dimension, the
  // last, is never split).
  const int64_t rows = x.dim() >= 2 ? f.operandBox(0).offset[x.dim() - 2] : 0;
  return {reference::attentionSoftmax(x, s.reducedDims()[0], s.scale(), s.causal(), rows,
                                      s.queryGroup())};
}

// reference::attentionSoftmax's allocations. x * scale (a double): the scalar wrapped, cast to
// the input's type, the product. The causal mask: the rows' and columns' indices (int64), their
// comparison (bool, saved by masked_fill's backward), the masked copy. The output (saved),
// after which the scaled and masked copies go. Backward: softmax's gradient, masked_fill's (the
// first freed, then the mask), the scaled one's (the scalar again).
void softmaxMemory(MemoryReplay& m) {
  m.dropPreviousResults(false, false);
  const reference::OpShape& s = m.r.shape;
  const at::Tensor& x = m.leaves[0];
  const bool scaled = s.scale() != 1.0, causal = s.causal();
  const int64_t S = m.X;
  const int64_t cast = m.es == 8 ? 0 : m.es;
  const auto scalarProduct = [&](int64_t out) {
    m.alloc(8);
    m.alloc(cast);
    m.alloc(out);
    m.release(cast);
    m.release(8);
  };
  const int64_t rows = x.dim() >= 2 ? x.size(-2) : 1, cols = x.size(-1);
  const int64_t mask = rows * cols;
  if (scaled) scalarProduct(S);
  if (causal) {
    m.alloc(8 * rows);
    if (s.queryGroup() > 1) {  // the rows' positions: their indices divided (the divisor a
      m.alloc(8);              // wrapped scalar), replacing them
      m.alloc(8 * rows);
      m.release(8);
      m.release(8 * rows);
    }
    m.alloc(8 * cols);
    m.alloc(mask);
    m.alloc(S);                // the masked copy
    if (scaled) m.release(S);  // the scaled one, replaced
    m.release(8 * cols + 8 * rows);
  }
  m.alloc(m.O);
  if (scaled || causal) m.release(S);  // the copy softmax read
  m.backwardBegins();
  if (!scaled && !causal) {
    m.alloc(m.sumG);
    return;
  }
  m.alloc(S);  // softmax's gradient
  m.incomingReleased();
  if (causal) {
    m.alloc(S);  // masked
    m.release(S);
    m.release(mask);
  }
  if (scaled) {
    scalarProduct(S);
    m.release(S);
  }
}

OpRule softmaxRule() {
  OpRule r;
  r.canonicalShapes = [] {
    return std::vector<nlohmann::json>{{{"op", "softmax"}, {"input", {8, 16}}, {"dim", -1}}};
  };
  r.specs = [](const reference::OpShape& s) { return followingSpecs(s, true, sameLayout); };
  r.layouts = softmaxLayouts;
  r.faults = [](const OpStrategySpec& sp) {
    std::vector<std::string> own;
    if (usedAxes(sp.operandLayouts[0]).size() > 0) own.push_back("softmax_over_sharded_dim");
    return commonFaults(sp, own);
  };
  r.forward = softmaxForward;
  r.memory = softmaxMemory;
  r.flops = noFlops;
  r.statistics = noStatistics;
  r.reductionLength = noReduction;
  return r;
}

}  // namespace
}  // namespace sb::strategies

SB_REGISTER_OP_RULE("softmax", sb::strategies::softmaxRule());
