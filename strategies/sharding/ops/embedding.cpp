// embedding: ColossalAI's EmbeddingStrategyGenerator (for ids (4, 16, 16): 4 strategies that
// keep the ids whole, 5 that split them, each on any of the 3 id dimensions) and, beyond it,
// the vocabulary split (Megatron's VocabParallelEmbedding), whose mask is this operator's
// planted fault.

#include "strategies/sharding/ops/op_rule.h"
#include "strategies/sharding/ops/op_specs_common.h"

namespace sb::strategies {
namespace {

using Axes = std::vector<int>;

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

std::vector<at::Tensor> embeddingForward(const LocalForward& f) {
  const at::Tensor& x = f.in[0];
  const auto& in = f.in;
  if (f.r.spec.variant != "vocab") return {at::embedding(in[1], x)};
  // This rank holds rows [v0, v0 + n) of the table: ids outside them look up row 0 and are
  // zeroed, and the all-reduce adds the one rank's row that holds each id.
  const harness::Box table = f.operandBox(1);
  const int64_t v0 = table.offset[0], n = table.length[0];
  if (f.fault == "skip_vocab_mask") {
    return {f.reduce(at::embedding(in[1], (x - v0).clamp(0, n - 1)))};
  }
  const at::Tensor foreign = at::logical_or(x < v0, x >= v0 + n);
  const at::Tensor local = (x - v0).masked_fill_(foreign, 0);
  return {f.reduce(at::embedding(in[1], local).masked_fill_(foreign.unsqueeze(-1), 0))};
}

void embeddingMemory(MemoryReplay& m) {
  m.dropPreviousResults(false, false);
  const int64_t O = m.O;
  const auto& g = m.g;
  if (m.r.spec.variant == "vocab") {
    const int64_t ids1 = m.n, ids8 = m.n * 8;
    if (m.fault == "skip_vocab_mask") {
      m.alloc(2 * ids8);  // (ids - v0), clamped
      m.release(ids8);
      m.alloc(O);
      m.reduceCopy();
      m.backwardBegins();
      m.alloc(g[1]);
      m.release(ids8);
    } else {
      m.alloc(3 * ids1);  // the two comparisons and their union
      m.release(2 * ids1);
      m.alloc(ids8);  // the local ids
      m.alloc(O);     // the lookup, masked in place
      if (m.reduces) {
        m.alloc(O);
        m.alloc(m.scratch(m.outPartial, O));
        m.release(m.scratch(m.outPartial, O));
        m.release(O);
      }
      m.backwardBegins();
      // Backward: the masked gradient, the mask released, the weight's gradient, the masked
      // gradient and the local ids released.
      m.alloc(O);
      m.release(ids1);
      m.alloc(g[1]);
      m.release(O);
      m.release(ids8);
    }
    m.gradAllReduces();
  } else {
    m.alloc(O);
    m.backwardBegins();
    m.alloc(g[1]);  // a zeroed table, rows added
    m.gradAllReduces();
  }
}

OpRule embeddingRule() {
  OpRule r;
  r.canonicalShapes = [] {
    return std::vector<nlohmann::json>{{{"op", "embedding"},
                                        {"input", {4, 16, 16}},
                                        {"num_embeddings", 64},
                                        {"embedding_dim", 32}}};
  };
  r.specs = embeddingSpecs;
  r.layouts = keepLayouts;
  r.faults = [](const OpStrategySpec& sp) {
    std::vector<std::string> own;
    if (sp.variant == "vocab") own.push_back("skip_vocab_mask");
    return commonFaults(sp, own, /*noGradient=*/0);  // the ids have no gradient
  };
  r.forward = embeddingForward;
  r.memory = embeddingMemory;
  r.flops = noFlops;
  r.statistics = noStatistics;
  r.reductionLength = noReduction;
  return r;
}

}  // namespace
}  // namespace sb::strategies

SB_REGISTER_OP_RULE("embedding", sb::strategies::embeddingRule());
