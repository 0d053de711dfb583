// bmm and matmul: ColossalAI's BatchedMatMulStrategyGenerator (7 strategies on a 2x2 mesh, 1 on
// a 1-D or 1xN mesh) and, beyond it, matmul's dot ([k] x [k]) and matrix-vector ([m, k] x [k])
// forms. A split contraction leaves pending sums, all-reduced in the forward.

#include <algorithm>

#include "strategies/sharding/ops/contraction.h"
#include "strategies/sharding/ops/op_rule.h"
#include "strategies/sharding/ops/op_specs_common.h"

namespace sb::strategies {
namespace {

using Axes = std::vector<int>;

std::vector<OpStrategySpec> bmmSpecs(const reference::OpShape& s) {
  std::vector<OpStrategySpec> out;
  // A 1-D mesh, or a 2-D mesh with an axis of extent 1: only the batch is split.
  {
    auto sp = spec(s, "Sb0 = Sb0 x Sb0", {L({{0}, {}, {}}), L({{0}, {}, {}})}, {L({{0}, {}, {}})},
                   {1, 2});
    sp.degenerateAxis = 0;
    out.push_back(sp);
    auto sp1 =
        spec(s, "Sb1 = Sb1 x Sb1", {L({{1}, {}, {}}), L({{1}, {}, {}})}, {L({{1}, {}, {}})}, {2});
    sp1.degenerateAxis = 1;
    out.push_back(sp1);
  }
  std::vector<OpStrategySpec> full;
  for (auto [a, b] : kPairs) {  // SbSi = SbSi x Sb
    const std::string A = std::to_string(a), B = std::to_string(b);
    full.push_back(spec(s, "Sb" + A + "Si" + B + " = Sb" + A + "Si" + B + " x Sb" + A,
                        {L({{a}, {b}, {}}), L({{a}, {}, {}})}, {L({{a}, {b}, {}})}, {2}));
  }
  for (auto [a, b] : kPairs) {  // SbSj = Sb x SbSj
    const std::string A = std::to_string(a), B = std::to_string(b);
    full.push_back(spec(s, "Sb" + A + "Sj" + B + " = Sb" + A + "R x Sb" + A + "Sj" + B,
                        {L({{a}, {}, {}}), L({{a}, {}, {b}})}, {L({{a}, {}, {b}})}, {2}));
  }
  for (auto [a, b] : kPairs) {  // Sb = SbSk x SbSk, all-reduce over k's axis
    const std::string A = std::to_string(a), B = std::to_string(b);
    full.push_back(spec(s, "Sb" + A + "R = Sb" + A + "Sk" + B + " x Sb" + A + "Sk" + B,
                        {L({{a}, {}, {b}}), L({{a}, {b}, {}})}, {L({{a}, {}, {}}, {b})}, {2}));
  }
  full.push_back(spec(s, "Sb01 = Sb01 x Sb01", {L({{0, 1}, {}, {}}), L({{0, 1}, {}, {}})},
                      {L({{0, 1}, {}, {}})}, {2}));
  for (auto& f : full) {
    f.meshMustBeFull = true;
    out.push_back(f);
  }
  return out;
}

// matmul's dot ([k] x [k]) and matrix-vector ([m, k] x [k]) forms.
std::vector<OpStrategySpec> matmulSpecs(const reference::OpShape& s) {
  std::vector<OpStrategySpec> out;
  const std::vector<Axes> kSplits = {{}, {0}, {1}, {0, 1}};
  // On a 1-D mesh too where only axis 0 is used.
  const auto dims = [](const Axes& a) {
    return a.empty() || (a.size() == 1 && a[0] == 0) ? std::vector<int>{1, 2} : std::vector<int>{2};
  };
  if (s.input.size() == 1) {
    for (const auto& k : kSplits) {
      auto sp = spec(s, "R = " + seq(k) + " x " + seq(k), {L({k}), L({k})}, {L({}, k)}, dims(k));
      // ColossalAI's DotProductStrategyGenerator: "R = S0 dot S0" (S01 is ours).
      sp.colossalName = "R = " + seq(k) + " dot " + seq(k);
      sp.set = "beyond";
      out.push_back(sp);
    }
    return out;
  }
  for (const auto& m : kSplits) {
    for (const auto& k : kSplits) {
      bool clash = false;
      for (int a : m) clash |= std::count(k.begin(), k.end(), a) > 0;
      if (clash) continue;
      Axes used = m;
      used.insert(used.end(), k.begin(), k.end());
      auto sp = spec(s, seq(m) + " = " + seq(m) + seq(k) + " x " + seq(k), {L({m, k}), L({k})},
                     {L({m}, k)}, dims(used));
      // ColossalAI's MatVecStrategyGenerator has two of these, spelled "R = R x R" and
      // "S0R = S0R x R"; the rest, ours, keep our spelling.
      if (m.empty() && k.empty()) sp.colossalName = "R = R x R";
      if (m.size() == 1 && k.empty()) sp.colossalName = seq(m) + "R = " + seq(m) + "R x R";
      sp.set = "beyond";
      out.push_back(sp);
    }
  }
  return out;
}

// input [.., M, K] x other [.., K, N] (matmul: [M, K] x [K] or [K] x [K]): 6 x the local
// contraction.
double productFlops(const ResolvedOp& r, const std::vector<int64_t>& mesh, int rank,
                    bool vectorOther) {
  const auto coords = harness::DeviceMesh(mesh).coords(rank);
  const auto box = [&](size_t i) {
    return r.operands[i].box(r.shape.operandShape(r.spec.operands[i]), mesh, coords);
  };
  const harness::Box a = box(0), b = box(1);
  const double n = vectorOther ? 1.0 : static_cast<double>(b.length.back());
  return 6.0 * static_cast<double>(a.numel()) * n;
}

OpRule bmmRule() {
  OpRule r;
  r.canonicalShapes = [] {
    return std::vector<nlohmann::json>{
        {{"op", "bmm"}, {"input", {4, 8, 16}}, {"other", {4, 16, 8}}}};
  };
  r.specs = bmmSpecs;
  r.layouts = keepLayouts;
  r.faults = [](const OpStrategySpec& sp) {
    std::vector<std::string> own;
    if (!sp.operandLayouts[1].axesOf(0).empty()) own.push_back("batch_split_one_operand");
    return commonFaults(sp, own);
  };
  r.forward = [](const LocalForward& f) {
    return std::vector<at::Tensor>{f.reduce(at::bmm(f.in[0], f.in[1]))};
  };
  r.memory = productMemory;
  r.flops = [](const ResolvedOp& op, const std::vector<int64_t>& mesh, int rank) {
    return productFlops(op, mesh, rank, false);
  };
  r.statistics = noStatistics;
  r.reductionLength = productReductionLength;
  return r;
}

OpRule matmulRule() {
  OpRule r = bmmRule();
  r.canonicalShapes = [] {
    return std::vector<nlohmann::json>{{{"op", "matmul"}, {"input", {16}}, {"other", {16}}},
                                       {{"op", "matmul"}, {"input", {8, 16}}, {"other", {16}}}};
  };
  r.specs = matmulSpecs;
  r.faults = [](const OpStrategySpec& sp) { return commonFaults(sp, {}); };
  r.forward = [](const LocalForward& f) {
    return std::vector<at::Tensor>{f.reduce(at::matmul(f.in[0], f.in[1]))};
  };
  r.flops = [](const ResolvedOp& op, const std::vector<int64_t>& mesh, int rank) {
    return productFlops(op, mesh, rank, true);
  };
  return r;
}

}  // namespace
}  // namespace sb::strategies

SB_REGISTER_OP_RULE("bmm", sb::strategies::bmmRule());
SB_REGISTER_OP_RULE("matmul", sb::strategies::matmulRule());
