// The operators of imported models that no strategy set knows ("aten", reference/ops.h): one
// strategy, everything replicated. Every rank gathers the operands whole (the graph's edges
// redistribute them, counted like any collective), runs LibTorch's own kernel on them and
// keeps the whole output; each rank's gradients of the operands are whole and equal, so the
// backward communicates nothing. This is what lets every traced model run under every plan,
// and what the coverage table of `stratbench graph --model` counts as "no strategy".

#include "strategies/sharding/ops/op_rule.h"
#include "strategies/sharding/ops/op_specs_common.h"

namespace sb::strategies {
namespace {

using harness::Layout;

std::vector<OpStrategySpec> atenSpecs(const reference::OpShape& s) {
  std::vector<Layout> operands, outputs;
  std::string in, out;
  for (const auto& name : s.operands()) {
    operands.emplace_back(static_cast<int>(s.operandShape(name).size()));
    in += "R";
  }
  for (const auto& o : s.outputs()) {
    outputs.emplace_back(static_cast<int>(o.size()));
    out += "R";
  }
  OpStrategySpec e = spec(s, out + " = " + in, operands, outputs, {1, 2});
  e.colossalName = "FULLY REPLICATED";
  return {e};
}

// Not a prediction anyone is judged by: a single "aten" case is refused (reference/ops.cpp),
// and graphs price memory by their liveness walk. The output, then the operands' gradients.
void atenMemory(MemoryReplay& m) {
  m.dropPreviousResults(false, false);
  m.alloc(m.O);
  m.backwardBegins();
  m.alloc(m.sumG);
}

OpRule atenRule() {
  OpRule r;
  r.canonicalShapes = [] { return std::vector<nlohmann::json>{}; };
  r.specs = atenSpecs;
  r.layouts = keepLayouts;
  r.faults = [](const OpStrategySpec& sp) { return commonFaults(sp, {}); };
  r.forward = referenceForward;
  r.memory = atenMemory;
  r.flops = noFlops;
  r.statistics = noStatistics;
  r.reductionLength = noReduction;
  return r;
}

}  // namespace
}  // namespace sb::strategies

SB_REGISTER_OP_RULE("aten", sb::strategies::atenRule());
