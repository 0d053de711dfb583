// addmm (a Linear's [M, K] x [K, N] + bias): ColossalAI's LinearProjectionStrategyGenerator on
// a 2-D input, 14 strategies on a 2x2 mesh. A split K leaves pending sums, all-reduced before
// the bias is added once.

#include "strategies/sharding/ops/contraction.h"
#include "strategies/sharding/ops/op_specs_common.h"

namespace sb::strategies {
namespace {

std::vector<OpStrategySpec> addmmSpecs(const reference::OpShape& s) {
  std::vector<OpStrategySpec> out;
  for (const auto& m : linearSplits(false)) {
    out.push_back(spec(s, m.name, {L({m.m, m.k}), L({m.k, m.n}), L({m.n})}, {L({m.m, m.n}, m.k)},
                       m.meshDims));
  }
  return out;
}

std::vector<at::Tensor> addmmForward(const LocalForward& f) {
  const at::Tensor& x = f.in[0];
  const auto& in = f.in;
  if (f.r.outputs[0].partialAxes().empty()) return {at::addmm(in[2], x, in[1])};
  return {f.reduce(at::mm(x, in[1])) + in[2]};  // the bias once, after the sum
}

void addmmMemory(MemoryReplay& m) {
  m.dropPreviousResults(false, false);
  contractionReplay(m, 0);
}

// input [M, K] x other [K, N]: 6 x the local contraction.
double addmmFlops(const ResolvedOp& r, const std::vector<int64_t>& mesh, int rank) {
  const auto coords = harness::DeviceMesh(mesh).coords(rank);
  const auto box = [&](size_t i) {
    return r.operands[i].box(r.shape.operandShape(r.spec.operands[i]), mesh, coords);
  };
  const harness::Box a = box(0), b = box(1);
  return 6.0 * static_cast<double>(a.numel()) * static_cast<double>(b.length.back());
}

OpRule addmmRule() {
  OpRule r;
  r.canonicalShapes = [] {
    return std::vector<nlohmann::json>{{{"op", "addmm"}, {"input", {16, 32}}, {"other", {32, 16}}}};
  };
  r.specs = addmmSpecs;
  r.layouts = keepLayouts;
  r.faults = [](const OpStrategySpec& sp) { return commonFaults(sp, {}); };
  r.forward = addmmForward;
  r.memory = addmmMemory;
  r.flops = addmmFlops;
  r.statistics = noStatistics;
  r.reductionLength = productReductionLength;
  return r;
}

}  // namespace
}  // namespace sb::strategies

SB_REGISTER_OP_RULE("addmm", sb::strategies::addmmRule());
