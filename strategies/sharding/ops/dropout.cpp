// dropout: one strategy per layout of its input. Every rank draws its piece of the one mask
// the reference draws (by the elements' places in the whole tensor), so the planted fault is a
// seed per rank.

#include "strategies/sharding/ops/op_rule.h"
#include "strategies/sharding/ops/op_specs_common.h"

namespace sb::strategies {
namespace {

std::vector<at::Tensor> dropoutForward(const LocalForward& f) {
  const reference::OpShape& s = f.r.shape;
  const at::Tensor& x = f.in[0];
  const double p = s.attrDouble("p");
  const uint64_t seed = f.fault == "per_rank_dropout_seed"
                            ? f.seed + 1 + static_cast<uint64_t>(f.ctx.rank())
                            : f.seed;
  const harness::Box box = f.operandBox(0);
  at::Tensor keep =
      reference::dropoutKeepMask(s.input, box.offset, box.length, seed, p, x.scalar_type());
  keep.mul_(1.0 / (1.0 - p));
  return {x * keep};
}

void dropoutMemory(MemoryReplay& m) {
  m.dropPreviousResults(false, false);
  // The mask: two int64 tensors of the shard's size and a scalar at most, then the mask.
  m.alloc(16 * m.n + 8);
  m.release(16 * m.n + 8);
  m.alloc(m.n * m.es);  // the scaled mask, saved
  m.alloc(m.O);
  m.backwardBegins();
  m.alloc(m.sumG);
}

OpRule dropoutRule() {
  OpRule r;
  r.canonicalShapes = [] {
    return std::vector<nlohmann::json>{{{"op", "dropout"}, {"input", {8, 16}}, {"p", 0.25}}};
  };
  r.specs = [](const reference::OpShape& s) { return followingSpecs(s, false, sameLayout); };
  r.layouts = keepLayouts;
  r.faults = [](const OpStrategySpec& sp) { return commonFaults(sp, {"per_rank_dropout_seed"}); };
  r.forward = dropoutForward;
  r.memory = dropoutMemory;
  r.flops = noFlops;
  r.statistics = noStatistics;
  r.reductionLength = noReduction;
  return r;
}

}  // namespace
}  // namespace sb::strategies

SB_REGISTER_OP_RULE("dropout", sb::strategies::dropoutRule());
