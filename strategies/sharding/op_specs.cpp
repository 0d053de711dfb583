// The strategy sets of single operators (op_strategies.h), generated as ColossalAI's strategy
// generators generate them, in their order. Counts on a 2x2 mesh, checked by the tests:
//   addmm [M, K] x [K, N]        14 (LinearProjectionStrategyGenerator, 2-D input)
//   bmm                           7 (BatchedMatMulStrategyGenerator); 1 on a 1-D or 1xN mesh
//   embedding, ids (4, 16, 16)   19 (EmbeddingStrategyGenerator: 4 that keep the ids whole, 5
//                                   that split them, each on any of the 3 id dimensions)
//   layer_norm (4, 16)            4 (LayerNormGenerator: batch dimensions only)
//   batch_norm                    4 plain (BatchNormStrategyGenerator) + 5 SYNC_BN
//   conv2d                       16 (ConvStrategyGenerator)
//   max/avg_pool2d                9 (NormalPoolStrategyGenerator: N and C)
//   add/mul, 2-D output           9 (BinaryElementwiseStrategyGenerator)
// and, in the set "beyond": layer norm over a split hidden dimension, vocabulary-split
// embeddings, matmul's dot and matrix-vector forms; the following operators (unary, dropout,
// softmax, view, permute/transpose, split, sum) have one strategy per layout of their input.

#include <algorithm>
#include <map>
#include <numeric>

#include "strategies/sharding/op_strategies.h"

namespace sb::strategies {
namespace {

using harness::Layout;
using Axes = std::vector<int>;

std::string seq(const Axes& a) {
  if (a.empty()) return "R";
  std::string s = "S";
  for (int x : a) s += std::to_string(x);
  return s;
}

// A layout from per-dimension axes and pending-sum axes.
Layout L(std::vector<Axes> dims, Axes partial = {}) {
  return Layout(std::move(dims), std::move(partial));
}

// The axis pairs of a 2-D mesh in ColossalAI's order: (0, 1) then (1, 0).
const std::vector<std::pair<int, int>> kPairs = {{0, 1}, {1, 0}};

OpStrategySpec spec(const reference::OpShape& s, std::string name, std::vector<Layout> operands,
                    std::vector<Layout> outputs, std::vector<int> meshDims) {
  OpStrategySpec sp;
  sp.op = s.op;
  sp.name = std::move(name);
  sp.operands = s.operands();
  sp.operandLayouts = std::move(operands);
  sp.outputLayouts = std::move(outputs);
  for (const auto& n : sp.operands) {
    sp.operandRanks.push_back(static_cast<int64_t>(s.operandShape(n).size()));
  }
  sp.meshDims = std::move(meshDims);
  return sp;
}

// A [M, K] x [K, N] contraction with M, K, N split over the given axes: the logical strategy
// of a Linear, addmm or convolution, named "out = input x other" in logical [M, K] x [K, N]
// form.
struct MatmulSplit {
  std::string name;
  Axes m, k, n;
  std::vector<int> meshDims;
};

std::vector<MatmulSplit> linearSplits(bool withSingleAxisBatch) {
  const std::vector<int> twoD = {2}, both = {1, 2};
  std::vector<MatmulSplit> out;
  if (withSingleAxisBatch) {  // ConvStrategyGenerator's split_input_batch comes first
    for (int a : {0, 1}) {
      out.push_back({seq({a}) + "R = " + seq({a}) + "R x RR", {a}, {}, {}, a == 0 ? both : twoD});
    }
  }
  for (auto [a, b] : kPairs) {
    out.push_back(
        {seq({a}) + seq({b}) + " = " + seq({a}) + "R x R" + seq({b}), {a}, {}, {b}, twoD});
  }
  for (auto [a, b] : kPairs) {
    out.push_back(
        {seq({a}) + "R = " + seq({a}) + seq({b}) + " x " + seq({b}) + "R", {a}, {b}, {}, twoD});
  }
  for (auto [a, b] : kPairs) {
    out.push_back(
        {"R" + seq({b}) + " = R" + seq({a}) + " x " + seq({a}) + seq({b}), {}, {a}, {b}, twoD});
  }
  for (int a : {0, 1}) {
    out.push_back(
        {"RR = R" + seq({a}) + " x " + seq({a}) + "R", {}, {a}, {}, a == 0 ? both : twoD});
  }
  for (int a : {0, 1}) {
    out.push_back({"R" + seq({a}) + " = RR x R" + seq({a}), {}, {}, {a}, a == 0 ? both : twoD});
  }
  out.push_back({"S01R = S01R x RR", {0, 1}, {}, {}, twoD});
  out.push_back({"RR = RS01 x S01R", {}, {0, 1}, {}, twoD});
  out.push_back({"RS01 = RR x RS01", {}, {}, {0, 1}, twoD});
  out.push_back({"RR = RR x RR", {}, {}, {}, both});
  if (!withSingleAxisBatch) out.push_back({"S0R = S0R x RR", {0}, {}, {}, {1}});
  return out;
}

std::vector<OpStrategySpec> addmmSpecs(const reference::OpShape& s) {
  std::vector<OpStrategySpec> out;
  for (const auto& m : linearSplits(false)) {
    out.push_back(spec(s, m.name, {L({m.m, m.k}), L({m.k, m.n}), L({m.n})}, {L({m.m, m.n}, m.k)},
                       m.meshDims));
  }
  return out;
}

std::vector<OpStrategySpec> convSpecs(const reference::OpShape& s) {
  std::vector<OpStrategySpec> out;
  for (const auto& m : linearSplits(true)) {
    out.push_back(spec(s, m.name, {L({m.m, m.k, {}, {}}), L({m.n, m.k, {}, {}}), L({m.n})},
                       {L({m.m, m.n, {}, {}}, m.k)}, m.meshDims));
  }
  return out;
}

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
      sp.set = "beyond";
      out.push_back(sp);
    }
  }
  return out;
}

// Embedding: ids of rank r (the logical input is the flattened ids; a split of it lands on
// one physical id dimension, ColossalAI's "_d" suffix), weight [V, E].
std::vector<OpStrategySpec> embeddingSpecs(const reference::OpShape& s) {
  const int r = static_cast<int>(s.input.size());
  const std::vector<int> twoD = {2}, both = {1, 2};
  std::vector<OpStrategySpec> out;
  // (name, ids axes, embedding-dim axes, mesh dims), in the generator's order.
  struct Logical {
    std::string name;
    Axes ids, emb;
    std::vector<int> meshDims;
  };
  std::vector<Logical> logical;
  logical.push_back({"RR = R x RR", {}, {}, both});
  for (int a : {0, 1}) {
    logical.push_back({seq({a}) + "R = " + seq({a}) + " x RR", {a}, {}, a == 0 ? both : twoD});
  }
  for (auto [a, b] : kPairs) {
    logical.push_back({seq({a}) + seq({b}) + " = " + seq({a}) + " x R" + seq({b}), {a}, {b}, twoD});
  }
  logical.push_back({"S01R = S01 x RR", {0, 1}, {}, twoD});
  for (int a : {0, 1}) {
    logical.push_back({"R" + seq({a}) + " = R x R" + seq({a}), {}, {a}, a == 0 ? both : twoD});
  }
  logical.push_back({"RS01 = R x RS01", {}, {0, 1}, twoD});
  for (const auto& l : logical) {
    const auto make = [&](int d, const std::string& name) {
      std::vector<Axes> ids(r), outDims(r + 1);
      if (d >= 0) ids[d] = outDims[d] = l.ids;
      outDims[r] = l.emb;
      out.push_back(spec(s, name, {L(ids), L({{}, l.emb})}, {L(outDims)}, l.meshDims));
    };
    if (l.ids.empty()) {
      make(-1, l.name);
    } else {
      for (int d = 0; d < r; ++d) make(d, l.name + "_" + std::to_string(d));
    }
  }
  // Beyond ColossalAI: the vocabulary split (Megatron's VocabParallelEmbedding): each rank holds
  // a range of rows, masks the ids outside it and the partial outputs are all-reduced.
  for (const Axes& v : std::vector<Axes>{{0}, {1}, {0, 1}}) {
    auto sp = spec(s, "RR = R x " + seq(v) + "R", {L(std::vector<Axes>(r)), L({v, {}})},
                   {L(std::vector<Axes>(r + 1), v)}, v == Axes{0} ? both : twoD);
    sp.set = "beyond";
    sp.variant = "vocab";
    out.push_back(sp);
  }
  return out;
}

// Every way to shard `dims` (a list of tensor dimensions) over a 2-D mesh as ColossalAI's
// enumerate_all_possible_{1,2}d_sharding does, and on a 1-D mesh, with the empty split last.
struct DimSplit {
  std::map<int, Axes> axes;
  std::vector<int> meshDims;
};
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

std::vector<OpStrategySpec> layerNormSpecs(const reference::OpShape& s) {
  const int r = static_cast<int>(s.input.size());
  std::vector<int> batch(r - 1);
  std::iota(batch.begin(), batch.end(), 0);
  std::vector<OpStrategySpec> out;
  for (const auto& sp : enumerateSplits(batch)) {
    const auto d = dimsOf(sp, r);
    out.push_back(spec(s, seqOf(d) + " = " + seqOf(d) + " x R x R", {L(d), L({{}}), L({{}})},
                       {L(d)}, sp.meshDims));
  }
  // Beyond ColossalAI: the hidden dimension split, statistics all-reduced; alone and with a
  // batch split on the other axis.
  std::vector<std::pair<Axes, Axes>> hidden = {{{}, {0}}, {{}, {1}}, {{}, {0, 1}}};
  if (r >= 2) {
    hidden.push_back({{0}, {1}});
    hidden.push_back({{1}, {0}});
  }
  for (const auto& [b, h] : hidden) {
    std::vector<Axes> d(r);
    if (!b.empty()) d[0] = b;
    d[r - 1] = h;
    const bool oneD = b.empty() && h == Axes{0};
    auto sp =
        spec(s, seqOf(d) + " = " + seqOf(d) + " x " + seq(h) + " x " + seq(h),
             {L(d), L({h}), L({h})}, {L(d)}, oneD ? std::vector<int>{1, 2} : std::vector<int>{2});
    sp.set = "beyond";
    sp.variant = "hidden";
    out.push_back(sp);
  }
  return out;
}

std::vector<OpStrategySpec> batchNormSpecs(const reference::OpShape& s) {
  const int r = static_cast<int>(s.input.size());
  std::vector<OpStrategySpec> out;
  const auto make = [&](const Axes& n, const Axes& c, std::vector<int> meshDims, bool sync) {
    std::vector<Axes> d(r);
    d[0] = n;
    d[1] = c;
    auto sp = spec(
        s, seqOf({n, c}) + " = " + seqOf({n, c}) + " x " + seq(c) + (sync ? " WITH SYNC_BN" : ""),
        {L(d), L({c}), L({c})}, {L(d)}, std::move(meshDims));
    if (sync) sp.variant = "sync";
    out.push_back(sp);
  };
  make({}, {0}, {1, 2}, false);
  make({}, {1}, {2}, false);
  make({}, {0, 1}, {2}, false);
  make({}, {}, {1, 2}, false);
  make({0}, {}, {1, 2}, true);
  make({1}, {}, {2}, true);
  make({0, 1}, {}, {2}, true);
  make({0}, {1}, {2}, true);
  make({1}, {0}, {2}, true);
  return out;
}

std::vector<OpStrategySpec> poolSpecs(const reference::OpShape& s) {
  std::vector<OpStrategySpec> out;
  for (const auto& sp : enumerateSplits({0, 1})) {
    const auto d = dimsOf(sp, 4);
    out.push_back(spec(s, seqOf(d) + " = " + seqOf(d), {L(d)}, {L(d)}, sp.meshDims));
  }
  return out;
}

// The layout of an operand of `shape` broadcast to an output laid out as `out`: its
// broadcast dimensions (missing or of extent 1) are replicated.
Layout broadcastLayout(const std::vector<Axes>& out, const std::vector<int64_t>& outShape,
                       const std::vector<int64_t>& shape) {
  const size_t off = outShape.size() - shape.size();
  std::vector<Axes> d(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == outShape[off + i]) d[i] = out[off + i];
  }
  return L(d);
}

std::vector<OpStrategySpec> binarySpecs(const reference::OpShape& s) {
  const auto outShape = s.outputs()[0];
  std::vector<int> dims(outShape.size());
  std::iota(dims.begin(), dims.end(), 0);
  std::vector<OpStrategySpec> out;
  for (const auto& sp : enumerateSplits(dims)) {
    const auto d = dimsOf(sp, static_cast<int>(dims.size()));
    const Layout a = broadcastLayout(d, outShape, s.input),
                 b = broadcastLayout(d, outShape, s.other);
    out.push_back(
        spec(s, seqOf(d) + " = " + a.compact() + " x " + b.compact(), {a, b}, {L(d)}, sp.meshDims));
  }
  return out;
}

// Following operators: one strategy per layout of the input (shards nested in mesh order, no
// pending sums), the output's layout following it.
std::vector<OpStrategySpec> followingSpecs(const reference::OpShape& s) {
  const int r = static_cast<int>(s.input.size());
  const auto reduced = s.reducedDims();
  std::vector<OpStrategySpec> out;
  for (int meshNdim : {1, 2}) {
    for (const Layout& in : harness::enumerateLayouts(r, meshNdim, 0)) {
      // Softmax and split keep their dimension whole, as ColossalAI's generators force it.
      if ((s.op == "softmax" || s.op == "split") &&
          !in.axesOf(static_cast<int>(reduced[0])).empty()) {
        continue;
      }
      std::vector<int> meshDims = {meshNdim};
      if (meshNdim == 2 && in.maxAxis() < 1) continue;  // the 1-D strategy, listed once
      if (meshNdim == 1) meshDims = {1, 2};
      std::vector<Layout> outs;
      std::string outName = in.compact();
      if (s.op == "permute" || s.op == "transpose") {
        const auto perm = s.op == "transpose"
                              ? [&] {
                                  std::vector<int64_t> p(r);
                                  std::iota(p.begin(), p.end(), 0);
                                  std::swap(p[(s.attrInt("dim0") + r) % r], p[(s.attrInt("dim1") + r) % r]);
                                  return p;
                                }()
                              : [&] {
                                  std::vector<int64_t> p;
                                  for (int64_t d : s.attrDims("dims")) p.push_back((d + r) % r);
                                  return p;
                                }();
        std::vector<Axes> d;
        for (int64_t p : perm) d.push_back(in.axesOf(static_cast<int>(p)));
        outs.push_back(L(d));
      } else if (s.op == "sum") {
        std::vector<Axes> d;
        Axes partial;
        for (int i = 0; i < r; ++i) {
          if (std::count(reduced.begin(), reduced.end(), i)) {
            for (int a : in.axesOf(i)) partial.push_back(a);
          } else {
            d.push_back(in.axesOf(i));
          }
        }
        outs.push_back(L(d, partial));
        outName = outs.back().compact();
      } else if (s.op == "split") {
        for (size_t i = 0; i < s.outputs().size(); ++i) outs.push_back(in);
      } else if (s.op == "view") {
        outs.push_back(in);  // replaced by the shape's mapping when applied
        outName = "?";
      } else {
        outs.push_back(in);
      }
      auto sp =
          spec(s, s.op == "view" ? "view(" + in.compact() + ")" : outName + " = " + in.compact(),
               {in}, outs, meshDims);
      sp.outputFromShape = s.op == "view";
      out.push_back(sp);
    }
  }
  return out;
}

}  // namespace

std::vector<OpStrategySpec> opStrategySpecs(const reference::OpShape& s) {
  const std::string& op = s.op;
  if (op == "addmm") return addmmSpecs(s);
  if (op == "bmm") return bmmSpecs(s);
  if (op == "matmul") return matmulSpecs(s);
  if (op == "embedding") return embeddingSpecs(s);
  if (op == "layer_norm") return layerNormSpecs(s);
  if (op == "batch_norm") return batchNormSpecs(s);
  if (op == "conv2d") return convSpecs(s);
  if (op == "max_pool2d" || op == "avg_pool2d") return poolSpecs(s);
  if (op == "add" || op == "mul") return binarySpecs(s);
  return followingSpecs(s);
}

}  // namespace sb::strategies
