// bmm and matmul: ColossalAI's BatchedMatMulStrategyGenerator (7 strategies on a 2x2 mesh, 1 on
// a 1-D or 1xN mesh) and, beyond it, matmul's dot ([k] x [k]) and matrix-vector ([m, k] x [k])
// forms, and matmul batched over two dimensions ([b, h, m, k] x [b, h, k, n]: attention's
// scores and context with the batch and the heads apart). A split contraction leaves pending
// sums, all-reduced in the forward.
//
// ColossalAI's bmm flattens batch and heads into one dimension, so a plan can split them over
// two mesh axes only as one flattened dimension (batch outer, on the first axis, one batch
// index a rank). The batched matmul keeps them apart: each mesh axis takes one of six
// placements, replicated (R), the batch (Sb), the heads (Sh), the rows (Si: the input's rows
// and the output's), the columns (Sj: the other's and the output's) or the contraction (Sk:
// both operands, the output's partial sums all-reduced over that axis), and a 2-D mesh every
// pair of them (expandToMesh, as a 3-D mesh does): batch on axis 1 and heads on axis 0 is a
// strategy like its mirror, and so is the batch split by both axes.

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

// matmul batched over two dimensions: the six placements on one axis, then (for a 2-D mesh)
// their pairs that use the second axis, named by their layouts ("RS1S0R = RS1S0R x RS1RR").
std::vector<OpStrategySpec> batchedMatmulSpecs(const reference::OpShape& s) {
  const Axes a = {0}, n = {};
  struct Placement {
    harness::Layout input, other, output;
  };
  const Placement placements[] = {
      {L({n, n, n, n}), L({n, n, n, n}), L({n, n, n, n})},      // R
      {L({a, n, n, n}), L({a, n, n, n}), L({a, n, n, n})},      // Sb
      {L({n, a, n, n}), L({n, a, n, n}), L({n, a, n, n})},      // Sh
      {L({n, n, a, n}), L({n, n, n, n}), L({n, n, a, n})},      // Si
      {L({n, n, n, n}), L({n, n, n, a}), L({n, n, n, a})},      // Sj
      {L({n, n, n, a}), L({n, n, a, n}), L({n, n, n, n}, {0})}  // Sk
  };
  std::vector<OpStrategySpec> out;
  for (const auto& p : placements) {
    auto sp = spec(s, p.output.compact() + " = " + p.input.compact() + " x " + p.other.compact(),
                   {p.input, p.other}, {p.output}, {1, 2});
    sp.set = "beyond";
    out.push_back(sp);
  }
  for (auto sp : expandToMesh(out, s, 2)) {
    if (sp.operandLayouts[0].maxAxis() < 1 && sp.operandLayouts[1].maxAxis() < 1 &&
        sp.outputLayouts[0].maxAxis() < 1) {
      continue;  // axis 1 replicated: one of the six above
    }
    sp.set = "beyond";
    out.push_back(sp);
  }
  return out;
}

// matmul's dot ([k] x [k]) and matrix-vector ([m, k] x [k]) forms, and the batched one.
std::vector<OpStrategySpec> matmulSpecs(const reference::OpShape& s) {
  if (s.input.size() == 4) return batchedMatmulSpecs(s);
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
  // The batch (bmm's, the batched matmul's) or the heads (the batched matmul's) split on the
  // input alone; matmul's dot and matrix-vector forms have neither.
  r.faults = [](const OpStrategySpec& sp) {
    std::vector<std::string> own;
    const harness::Layout& other = sp.operandLayouts[1];
    if (other.ndim() >= 3 && !other.axesOf(0).empty()) own.push_back("batch_split_one_operand");
    if (other.ndim() == 4 && !other.axesOf(1).empty()) own.push_back("heads_split_one_operand");
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
    return std::vector<nlohmann::json>{
        {{"op", "matmul"}, {"input", {16}}, {"other", {16}}},
        {{"op", "matmul"}, {"input", {8, 16}}, {"other", {16}}},
        {{"op", "matmul"}, {"input", {2, 4, 8, 16}}, {"other", {2, 4, 16, 8}}}};
  };
  r.specs = matmulSpecs;
  r.forward = [](const LocalForward& f) {
    return std::vector<at::Tensor>{f.reduce(at::matmul(f.in[0], f.in[1]))};
  };
  r.flops = [](const ResolvedOp& op, const std::vector<int64_t>& mesh, int rank) {
    return productFlops(op, mesh, rank, op.shape.other.size() == 1);
  };
  return r;
}

}  // namespace
}  // namespace sb::strategies

SB_REGISTER_OP_RULE("bmm", sb::strategies::bmmRule());
SB_REGISTER_OP_RULE("matmul", sb::strategies::matmulRule());
