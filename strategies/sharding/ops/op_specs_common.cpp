// The strategy generators' shared parts (op_specs_common.h): apart from the family files, which
// each hold one family's generator, since several families enumerate splits the same way.

#include "strategies/sharding/ops/op_specs_common.h"

#include <algorithm>
#include <numeric>
#include <set>

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

namespace {

bool has(const Axes& a, int x) { return std::find(a.begin(), a.end(), x) != a.end(); }

// `l` as mesh axis `a` alone shards it, on axis 0.
Layout alone(const Layout& l, int a) {
  std::vector<Axes> dims(static_cast<size_t>(l.ndim()));
  for (int d = 0; d < l.ndim(); ++d) {
    if (has(l.axesOf(d), a)) dims[static_cast<size_t>(d)] = {0};
  }
  return Layout(std::move(dims), has(l.partialAxes(), a) ? Axes{0} : Axes{});
}

// One axis's placement: the layouts a strategy gives every tensor, seen on that axis alone.
struct AxisPlacement {
  std::vector<Layout> operands, outputs, buffers;
  std::string variant;
  bool outputFromShape = false;

  // What tells two placements apart (a view's outputs follow from its input).
  std::vector<Layout> key() const {
    std::vector<Layout> k = operands;
    if (!outputFromShape) k.insert(k.end(), outputs.begin(), outputs.end());
    k.insert(k.end(), buffers.begin(), buffers.end());
    return k;
  }
  bool replicated() const {
    for (const auto& l : key()) {
      if (l != Layout(l.ndim())) return false;
    }
    return true;
  }
};

AxisPlacement axisPlacement(const OpStrategySpec& sp, int a) {
  AxisPlacement p;
  for (const auto& l : sp.operandLayouts) p.operands.push_back(alone(l, a));
  for (const auto& l : sp.outputLayouts) p.outputs.push_back(alone(l, a));
  for (const auto& b : sp.buffers) p.buffers.push_back(alone(b.second, a));
  p.variant = sp.variant;
  p.outputFromShape = sp.outputFromShape;
  return p;
}

// Layout of one tensor composed from each axis's layout of it (`perAxis[a]`, on axis 0).
Layout compose(const std::vector<const Layout*>& perAxis) {
  std::vector<Axes> dims(static_cast<size_t>(perAxis[0]->ndim()));
  Axes partial;
  for (size_t a = 0; a < perAxis.size(); ++a) {
    const Layout& l = *perAxis[a];
    for (int d = 0; d < l.ndim(); ++d) {
      if (!l.axesOf(d).empty()) dims[static_cast<size_t>(d)].push_back(static_cast<int>(a));
    }
    if (!l.partialAxes().empty()) partial.push_back(static_cast<int>(a));
  }
  return Layout(std::move(dims), std::move(partial));
}

std::string joined(const std::vector<Layout>& ls, const char* sep) {
  std::string s;
  for (const auto& l : ls) s += (s.empty() ? "" : sep) + l.compact();
  return s;
}

}  // namespace

std::vector<OpStrategySpec> expandToMesh(const std::vector<OpStrategySpec>& specs,
                                         const reference::OpShape& s, int meshNdim) {
  std::vector<OpStrategySpec> out;
  if (specs.empty() || meshNdim < 1) return out;
  const auto usable = [](const OpStrategySpec& sp) {
    return !sp.gatherInput && sp.variant.rfind("fault", 0) != 0;
  };
  std::vector<AxisPlacement> placements;
  std::set<std::vector<Layout>> seen;
  const auto add = [&](AxisPlacement p) {
    if (seen.insert(p.key()).second) placements.push_back(std::move(p));
  };
  // The 1-D strategies first: what a lone axis's split means (its variant) is theirs.
  for (const auto& sp : specs) {
    const bool oneD = has(sp.meshDims, 1) && sp.degenerateAxis <= 0 && !sp.meshMustBeFull;
    if (usable(sp) && oneD) add(axisPlacement(sp, 0));
  }
  for (const auto& sp : specs) {
    if (!usable(sp) || !has(sp.meshDims, 2)) continue;
    for (int a : {0, 1}) {
      AxisPlacement p = axisPlacement(sp, a);
      if (!p.replicated()) add(std::move(p));
    }
  }
  {  // replication, where the generator has no such strategy (bmm)
    AxisPlacement r = axisPlacement(specs.front(), -1);
    r.variant.clear();
    add(std::move(r));
  }
  const OpStrategySpec& first = specs.front();
  std::set<std::string> names;
  std::vector<size_t> pick(static_cast<size_t>(meshNdim), 0);
  const size_t P = placements.size();
  for (;;) {
    std::string variant;
    bool clash = false, fromShape = false;
    for (size_t k : pick) {
      const auto& p = placements[k];
      fromShape |= p.outputFromShape;
      if (p.variant.empty()) continue;
      clash |= !variant.empty() && variant != p.variant;
      variant = p.variant;
    }
    if (!clash) {
      const auto composed = [&](auto member, size_t i) {
        std::vector<const Layout*> perAxis;
        for (size_t k : pick) perAxis.push_back(&(placements[k].*member)[i]);
        return compose(perAxis);
      };
      std::vector<Layout> operands, outputs;
      for (size_t i = 0; i < first.operandLayouts.size(); ++i) {
        operands.push_back(composed(&AxisPlacement::operands, i));
      }
      for (size_t i = 0; i < first.outputLayouts.size(); ++i) {
        outputs.push_back(composed(&AxisPlacement::outputs, i));
      }
      std::string name = fromShape ? s.op + "(" + joined(operands, " x ") + ")"
                                   : joined(outputs, ", ") + " = " + joined(operands, " x ");
      if (names.insert(name).second) {
        OpStrategySpec sp = spec(s, name, operands, outputs, {meshNdim});
        sp.set = "expanded";
        sp.variant = variant;
        sp.outputFromShape = fromShape;
        for (size_t i = 0; i < first.buffers.size(); ++i) {
          sp.buffers.emplace_back(first.buffers[i].first, composed(&AxisPlacement::buffers, i));
        }
        out.push_back(std::move(sp));
      }
    }
    // The next choice of one placement per axis, the last axis fastest.
    size_t a = pick.size();
    while (a > 0 && ++pick[a - 1] == P) pick[--a] = 0;
    if (a == 0) break;
  }
  return out;
}

}  // namespace sb::strategies
