// addmm (a Linear's [M, K] x [K, N] + bias [N], or a full bias [M, N]): ColossalAI's
// LinearProjectionStrategyGenerator on a 2-D input, 14 strategies on a 2x2 mesh. A split K
// leaves pending sums, all-reduced before the bias is added once.

#include "strategies/sharding/ops/contraction.h"
#include "strategies/sharding/ops/op_specs_common.h"

namespace sb::strategies {
namespace {

// A bias [N] is laid out as the output's columns (replicated over its rows' axes, whose ranks
// then hold partial sums of its gradient); a bias [M, N] as the whole output, as ColossalAI's
// addmm handler lays out a bias that is not broadcast (its logical sharding, the output's,
// kept whole). ColossalAI names both by the product alone; the key of the second says its bias
// ("S0S1 = S0R x RS1 + bias S0S1"), so that its ids differ from the first's.
std::vector<OpStrategySpec> addmmSpecs(const reference::OpShape& s) {
  const bool fullBias = s.bias.size() == 2;
  std::vector<OpStrategySpec> out;
  for (const auto& m : linearSplits(false)) {
    const harness::Layout bias = fullBias ? L({m.m, m.n}) : L({m.n});
    OpStrategySpec sp =
        spec(s, fullBias ? m.name + " + bias " + bias.compact() : m.name,
             {L({m.m, m.k}), L({m.k, m.n}), bias}, {L({m.m, m.n}, m.k)}, m.meshDims);
    sp.colossalName = m.name;
    out.push_back(sp);
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

// mm ([M, K] x [K, N], a Linear without a bias: LLaMA's projections): addmm's splits.
std::vector<OpStrategySpec> mmSpecs(const reference::OpShape& s) {
  std::vector<OpStrategySpec> out;
  for (const auto& m : linearSplits(false)) {
    OpStrategySpec sp =
        spec(s, m.name, {L({m.m, m.k}), L({m.k, m.n})}, {L({m.m, m.n}, m.k)}, m.meshDims);
    sp.colossalName = m.name;
    sp.set = "beyond";
    out.push_back(sp);
  }
  return out;
}

OpRule mmRule() {
  OpRule r;
  r.canonicalShapes = [] {
    return std::vector<nlohmann::json>{{{"op", "mm"}, {"input", {16, 32}}, {"other", {32, 16}}}};
  };
  r.specs = mmSpecs;
  r.layouts = keepLayouts;
  r.faults = [](const OpStrategySpec& sp) { return commonFaults(sp, {}); };
  r.forward = [](const LocalForward& f) {
    return std::vector<at::Tensor>{f.reduce(at::mm(f.in[0], f.in[1]))};
  };
  r.memory = productMemory;
  r.flops = addmmFlops;
  r.statistics = noStatistics;
  r.reductionLength = productReductionLength;
  return r;
}

OpRule addmmRule() {
  OpRule r;
  r.canonicalShapes = [] {
    return std::vector<nlohmann::json>{
        {{"op", "addmm"}, {"input", {16, 32}}, {"other", {32, 16}}},
        {{"op", "addmm"}, {"input", {16, 32}}, {"other", {32, 16}}, {"bias", {16, 16}}}};
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
SB_REGISTER_OP_RULE("mm", sb::strategies::mmRule());
