#include "strategies/sharding/compose/parallel_graph.h"

#include <algorithm>
#include <set>
#include <stdexcept>

namespace sb::strategies::compose {
namespace {

double numel(const std::vector<int64_t>& shape) {
  double n = 1;
  for (int64_t d : shape) n *= static_cast<double>(d);
  return n;
}

bool isMatmul(const std::string& op) {
  return op == "mm" || op == "addmm" || op == "matmul" || op == "bmm";
}

// Operators whose output is a view of an operand (no kernel, nothing new saved).
bool isView(const reference::OpShape& s) {
  static const std::set<std::string> views = {"view", "reshape", "permute", "transpose",
                                              "getitem", "split"};
  if (views.count(s.op)) return true;
  if (s.op != "aten" || !s.attrs.contains("schema")) return false;
  const std::string schema = s.attrs.at("schema").get<std::string>();
  for (const char* v : {"aten::select", "aten::slice", "aten::expand", "aten::unsqueeze",
                        "aten::squeeze", "aten::flatten", "aten::t(", "aten::t.", "aten::narrow",
                        "aten::unflatten", "aten::detach", "aten::alias", "aten::view",
                        "aten::reshape", "aten::permute", "aten::transpose", "aten::split",
                        "aten::chunk", "aten::unbind", "aten::as_strided"}) {
    if (schema.rfind(v, 0) == 0) return true;
  }
  return false;
}

int64_t positive(const nlohmann::json& attrs, const char* key) {
  return attrs.contains(key) && attrs.at(key).is_number_integer() ? attrs.at(key).get<int64_t>()
                                                                  : 0;
}

}  // namespace

ModelCosts modelCosts(const reference::Graph& g, int64_t elementBytes) {
  if (g.workload == "mlp") {
    throw std::invalid_argument("mlp has no attention: composed parallelism is planned for "
                                "transformers (llama, gpt2, bert, a traced LLaMA)");
  }
  ModelCosts m;
  m.workload = g.workload;
  m.elementBytes = elementBytes;
  int first = -1, last = -1, layers = 0;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const int l = g.nodes[i].layer;
    if (l < 0) continue;
    if (first < 0) first = static_cast<int>(i);
    last = static_cast<int>(i);
    layers = std::max(layers, l + 1);
  }
  if (layers == 0) {
    throw std::invalid_argument(
        "the graph has no repeated blocks (a pipeline cuts at blocks; torch/compose wraps them)");
  }
  for (int i = first; i <= last; ++i) {
    if (g.nodes[static_cast<size_t>(i)].layer < 0) {
      throw std::invalid_argument("node " + g.nodes[static_cast<size_t>(i)].name +
                                  " lies between the blocks: the units must be contiguous");
    }
  }

  // The sizes the degrees must divide.
  const reference::GraphShape& gs = g.shape;
  if (g.workload != "torchscript") {
    m.batch = gs.batch;
    m.seq = gs.seq;
    m.dModel = gs.dModel;
    m.heads = gs.heads;
    m.kvHeads = g.workload == "llama" ? gs.kvHeads : gs.heads;
    m.ffn = g.workload == "llama" ? gs.ffn : 4 * gs.dModel;
    m.vocab = gs.vocab;
  } else {
    // A traced model: batch and sequence from its token ids, width and vocabulary from its
    // embedding, heads from block 0's views [batch, seq, heads, d_head] of its projections.
    if (g.inputs.empty() || g.inputs[0].second.size() != 2) {
      throw std::invalid_argument("a traced model's first input must be token ids [batch, seq]");
    }
    m.batch = g.inputs[0].second[0];
    m.seq = g.inputs[0].second[1];
    for (const auto& n : g.nodes) {
      if (n.shape.op == "embedding") {
        m.dModel = positive(n.shape.attrs, "embedding_dim");
        m.vocab = positive(n.shape.attrs, "num_embeddings");
        break;
      }
    }
    if (m.dModel <= 0) throw std::invalid_argument("a traced model needs a token embedding");
    int64_t dHead = 0;
    for (const auto& n : g.nodes) {
      if (n.layer != 0 || n.shape.op != "view" || !n.shape.attrs.contains("size")) continue;
      const auto size = n.shape.attrs.at("size").get<std::vector<int64_t>>();
      if (size.size() != 4 || size[0] != m.batch || size[1] != m.seq) continue;
      if (!m.heads && size[2] * size[3] == m.dModel) {
        m.heads = size[2];
        dHead = size[3];
      } else if (m.heads && size[3] == dHead && size[2] < m.heads && !m.kvHeads) {
        m.kvHeads = size[2];
      }
    }
    if (!m.heads) {
      throw std::invalid_argument(
          "a traced model's heads are read from block 0's views [batch, seq, heads, d_head] "
          "of its projections: none found");
    }
    if (!m.kvHeads) m.kvHeads = m.heads;
    for (const auto& [name, shape] : g.parameters) {
      if (name.find(".0.") == std::string::npos || shape.size() != 2) continue;
      for (int64_t d : shape) {
        if (d != m.dModel && d > m.ffn) m.ffn = d;
      }
    }
    if (!m.ffn) m.ffn = m.dModel;
  }

  // The units: the nodes before the first block, each block, the nodes after the last.
  std::vector<std::pair<int, int>> spans;  // [begin, end) node indices
  if (first > 0) spans.push_back({0, first});
  for (int l = 0; l < layers; ++l) {
    int b = -1, e = -1;
    for (int i = first; i <= last; ++i) {
      if (g.nodes[static_cast<size_t>(i)].layer != l) continue;
      if (b < 0) b = i;
      e = i + 1;
    }
    if (b < 0) {
      throw std::invalid_argument("block " + std::to_string(l) + " of " +
                                  std::to_string(layers) + " has no nodes");
    }
    if (!spans.empty() && b < spans.back().second) {
      throw std::invalid_argument("block " + std::to_string(l) +
                                  " interleaves with the block before it: the units must be "
                                  "contiguous runs of nodes");
    }
    spans.push_back({b, e});
  }
  if (last + 1 < static_cast<int>(g.nodes.size()))
    spans.push_back({last + 1, static_cast<int>(g.nodes.size())});

  std::set<std::string> paramDerived;  // parameters, and their views and transposes
  for (const auto& [name, shape] : g.parameters) paramDerived.insert(name);
  std::set<std::string> counted;       // parameters already given to a unit (tied weights)
  std::map<std::string, bool> inRegion;  // value -> inside a tp region
  for (const auto& [b, e] : spans) {
    UnitCosts u;
    const auto& n0 = g.nodes[static_cast<size_t>(b)];
    u.block = n0.layer >= 0;
    u.name = u.block ? "block " + std::to_string(n0.layer) : b == 0 ? "embedding" : "head";
    for (int i = b; i < e; ++i) {
      const reference::GraphNode& n = g.nodes[static_cast<size_t>(i)];
      const reference::OpShape& s = n.shape;
      const auto outs = n.outputs();
      const auto outShapes = s.outputs();
      bool readsParam = false, anyRegion = false, allParam = !n.args.empty();
      for (const auto& a : n.args) {
        if (paramDerived.count(a)) {
          readsParam = true;
          if (g.isParameter(a) && !counted.count(a)) {
            counted.insert(a);
            const auto shape = g.valueShape(a);
            const double elems = numel(shape);
            (shape.size() >= 2 ? u.tpParams : u.replicatedParams) += elems;
            u.largestParam = std::max(u.largestParam, elems);
          }
        } else {
          allParam = false;
          if (inRegion[a]) anyRegion = true;
        }
      }
      if (allParam && isView(s)) {  // a parameter's transpose or view
        for (const auto& o : outs) paramDerived.insert(o);
        continue;
      }
      bool region = anyRegion;
      double out = 0;
      for (const auto& sh : outShapes) out += numel(sh);
      if (isMatmul(s.op)) {
        u.flops += 2.0 * numel(s.input) * static_cast<double>(s.other.back());
        if (readsParam) {
          // Column-parallel from the stream, row-parallel back to it (a collective each way).
          region = !anyRegion;
          if (anyRegion) ++u.tpCollectives;
        } else {
          u.attentionKv += numel(s.other);  // scores: q k^T, context: p v
        }
        (region ? u.shardedMatmulActs : u.streamMatmulActs) += out;
      }
      if (s.op == "embedding") {
        region = false;
        ++u.tpCollectives;  // row-parallel embedding: its output reduced
      }
      for (const auto& o : outs) inRegion[o] = region;
      if (isView(s)) continue;
      ++u.kernels;
      (region ? u.shardedActs : u.streamActs) += out;
      if (!isMatmul(s.op)) (region ? u.shardedTraffic : u.streamTraffic) += out;
      u.boundaryElems = out;
    }
    if (!u.block && b > 0 && u.flops > 0) ++u.tpCollectives;  // the head's gather under SP
    m.units.push_back(u);
  }
  return m;
}

}  // namespace sb::strategies::compose
