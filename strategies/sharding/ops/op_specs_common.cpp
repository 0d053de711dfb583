// The strategy generators' shared parts (op_specs_common.h): apart from the family files, which
// each hold one family's generator, since several families enumerate splits the same way.

#include "strategies/sharding/ops/op_specs_common.h"

#include <algorithm>
#include <numeric>

namespace sb::strategies {

using harness::Layout;
using Axes = std::vector<int>;

std::string seq(const Axes& a) {
  if (a.empty()) return "R";
  std::string s = "S";
  for (int x : a) s += std::to_string(x);
  return s;
}

std::string colossalSeq(const Layout& l) { return Layout(l.dimAxes(), {}).sequence(); }

Layout L(std::vector<Axes> dims, Axes partial) {
  return Layout(std::move(dims), std::move(partial));
}

OpStrategySpec spec(const reference::OpShape& s, std::string name, std::vector<Layout> operands,
                    std::vector<Layout> outputs, std::vector<int> meshDims) {
  OpStrategySpec sp;
  sp.op = s.op;
  sp.name = std::move(name);
  sp.colossalName = sp.name;  // the generators whose names ColossalAI writes as ours
  sp.operands = s.operands();
  sp.operandLayouts = std::move(operands);
  sp.outputLayouts = std::move(outputs);
  for (const auto& n : sp.operands) {
    sp.operandRanks.push_back(static_cast<int64_t>(s.operandShape(n).size()));
  }
  sp.meshDims = std::move(meshDims);
  return sp;
}

std::vector<DimSplit> enumerateSplits(const std::vector<int>& dims) {
  std::vector<DimSplit> out;
  for (int a : {0, 1}) {
    for (int d : dims) {
      out.push_back({{{d, {a}}}, a == 0 ? std::vector<int>{1, 2} : std::vector<int>{2}});
    }
  }
  for (int d : dims) out.push_back({{{d, {0, 1}}}, {2}});
  for (int i : dims) {
    for (int j : dims) {
      if (i != j) out.push_back({{{i, {0}}, {j, {1}}}, {2}});
    }
  }
  out.push_back({{}, {1, 2}});
  return out;
}

std::vector<Axes> dimsOf(const DimSplit& sp, int ndim) {
  std::vector<Axes> d(ndim);
  for (const auto& [dim, axes] : sp.axes) d[dim] = axes;
  return d;
}

std::string seqOf(const std::vector<Axes>& dims) {
  std::string s;
  for (const auto& a : dims) s += seq(a);
  return s;
}

std::vector<OpStrategySpec> batchSplitNormSpecs(const reference::OpShape& s, int params) {
  const int r = static_cast<int>(s.input.size());
  std::vector<int> batch(r - 1);
  std::iota(batch.begin(), batch.end(), 0);
  std::vector<OpStrategySpec> out;
  for (const auto& sp : enumerateSplits(batch)) {
    const auto d = dimsOf(sp, r);
    std::string name = seqOf(d) + " = " + seqOf(d);
    std::vector<Layout> operands = {L(d)};
    for (int p = 0; p < params; ++p) {
      name += " x R";
      operands.push_back(L({{}}));
    }
    OpStrategySpec n = spec(s, name, operands, {L(d)}, sp.meshDims);
    n.colossalName = colossalSeq(L(d)) + " = " + colossalSeq(L(d)) + " x [R]";
    out.push_back(n);
  }
  return out;
}

std::vector<OpStrategySpec> followingSpecs(
    const reference::OpShape& s, bool keepReducedWhole,
    const std::function<FollowingOutputs(const Layout& in)>& outputs) {
  const int r = static_cast<int>(s.input.size());
  const auto reduced = s.reducedDims();
  std::vector<OpStrategySpec> out;
  int index = -1;  // the input layout's place among the predecessor's (the file comment)
  for (int meshNdim : {1, 2}) {
    for (const Layout& in : harness::enumerateLayouts(r, meshNdim, 0)) {
      if (meshNdim == 2 && in.maxAxis() < 1) continue;  // the 1-D strategy, listed once
      ++index;
      // Softmax and split keep their dimension whole, as ColossalAI's generators force it.
      if (keepReducedWhole && !in.axesOf(static_cast<int>(reduced[0])).empty()) {
        continue;
      }
      std::vector<int> meshDims = {meshNdim};
      if (meshNdim == 1) meshDims = {1, 2};
      FollowingOutputs outs = outputs(in);
      OpStrategySpec sp = spec(s, outs.name, {in}, outs.layouts, meshDims);
      sp.colossalName =
          (outs.colossal.empty() ? colossalSeq(in) + " -> " + colossalSeq(outs.layouts[0])
                                 : outs.colossal) +
          "_" + std::to_string(index);
      out.push_back(sp);
    }
  }
  return out;
}

FollowingOutputs sameLayout(const Layout& in) {
  return {{in}, in.compact() + " = " + in.compact()};
}

}  // namespace sb::strategies
