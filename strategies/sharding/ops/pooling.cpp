// max_pool2d and avg_pool2d: ColossalAI's NormalPoolStrategyGenerator, 9 strategies (N and C
// split). Each rank pools its pieces as the whole tensor (the reference's forward).

#include "strategies/sharding/ops/op_rule.h"
#include "strategies/sharding/ops/op_specs_common.h"

namespace sb::strategies {
namespace {

std::vector<OpStrategySpec> poolSpecs(const reference::OpShape& s) {
  std::vector<OpStrategySpec> out;
  for (const auto& sp : enumerateSplits({0, 1})) {
    const auto d = dimsOf(sp, 4);
    OpStrategySpec p = spec(s, seqOf(d) + " = " + seqOf(d), {L(d)}, {L(d)}, sp.meshDims);
    p.colossalName = colossalSeq(L(d)) + " = " + colossalSeq(L(d));  // output = input
    out.push_back(p);
  }
  return out;
}

void maxPoolMemory(MemoryReplay& m) {
  m.dropPreviousResults(false, false);
  const int64_t indices = m.outputBoxes[0].numel() * 8;
  m.alloc(m.O + indices);
  m.backwardBegins();
  m.alloc(m.sumG);
  m.release(indices);
}

// The output, then the input's gradient.
void avgPoolMemory(MemoryReplay& m) {
  m.dropPreviousResults(false, false);
  m.alloc(m.O);
  m.backwardBegins();
  m.alloc(m.sumG);
}

OpRule poolRule(const char* op, void (*memory)(MemoryReplay&)) {
  OpRule r;
  r.canonicalShapes = [op] {
    return std::vector<nlohmann::json>{{{"op", op}, {"input", {4, 4, 8, 8}}, {"kernel", 2}}};
  };
  r.specs = poolSpecs;
  r.layouts = keepLayouts;
  r.faults = [](const OpStrategySpec& sp) { return commonFaults(sp, {}); };
  r.forward = referenceForward;
  r.memory = memory;
  r.flops = noFlops;
  r.statistics = noStatistics;
  r.reductionLength = noReduction;
  return r;
}

}  // namespace
}  // namespace sb::strategies

SB_REGISTER_OP_RULE("max_pool2d",
                    sb::strategies::poolRule("max_pool2d", sb::strategies::maxPoolMemory));
SB_REGISTER_OP_RULE("avg_pool2d",
                    sb::strategies::poolRule("avg_pool2d", sb::strategies::avgPoolMemory));
