// The plan of an FSDP / ZeRO strategy (see fsdp_plan.h).

#include "strategies/sharding/fsdp/fsdp_plan.h"

#include <algorithm>
#include <set>

#include "harness/box.h"
#include "reference/torchscript/import.h"

namespace sb::strategies::fsdp {

using harness::CaseSpec;
using harness::Collective;
using harness::CommStats;
using reference::Graph;

namespace {
int64_t elemSize(at::ScalarType t) { return static_cast<int64_t>(c10::elementSize(t)); }

}  // namespace

int64_t rowElems(const std::vector<int64_t>& dims) {
  int64_t n = 1;
  for (size_t i = 1; i < dims.size(); ++i) n *= dims[i];
  return n;
}

int64_t numel(const std::vector<int64_t>& dims) {
  return dims.empty() ? 1 : dims[0] * rowElems(dims);
}

const char* kindName(Kind k) {
  switch (k) {
    case Kind::kDdp:
      return "ddp";
    case Kind::kZero1:
      return "zero1";
    case Kind::kZero2:
      return "zero2";
    case Kind::kZero3:
      return "zero3";
    case Kind::kHsdp:
      return "hsdp";
  }
  return "?";
}

const char* faultName(Fault f) {
  switch (f) {
    case Fault::kNone:
      return "none";
    case Fault::kGradDividedTwice:
      return "grad_divided_twice";
    case Fault::kStaleShard:
      return "stale_shard";
    case Fault::kHsdpWrongAxis:
      return "hsdp_wrong_axis";
    case Fault::kReplicaUnsummed:
      return "replica_unsummed";
    case Fault::kReplicaOwnOrder:
      return "replica_own_order";
    case Fault::kUnitNotResharded:
      return "unit_not_resharded";
    case Fault::kRankSkipsUpdate:
      return "rank_skips_update";
  }
  return "?";
}

bool takesFault(Kind k, Fault f) {
  switch (f) {
    case Fault::kHsdpWrongAxis:
      return k == Kind::kHsdp;
    case Fault::kReplicaUnsummed:
      return k == Kind::kDdp || k == Kind::kZero1 || k == Kind::kHsdp;
    case Fault::kReplicaOwnOrder:
      return k == Kind::kDdp;
    case Fault::kUnitNotResharded:
      return shardsParams(k);
    default:
      return true;
  }
}

bool reshardAfterForward(const CaseSpec& c) {
  const auto it = c.params.find("reshard_after_forward");
  return it == c.params.end() || !it->is_boolean() || it->get<bool>();
}

std::optional<at::ScalarType> paramDtype(const CaseSpec& c) {
  const auto it = c.params.find("param_dtype");
  if (it == c.params.end()) return c.dtype;
  if (*it == "bfloat16") return at::kBFloat16;
  if (*it == "float32") return at::kFloat;
  return std::nullopt;
}

int prefetchDepth(const CaseSpec& c) {
  const auto it = c.params.find("prefetch");
  if (it == c.params.end()) return 0;
  if (!it->is_number_integer() || it->get<int64_t>() < 0 || it->get<int64_t>() > 8) return -1;
  return static_cast<int>(it->get<int64_t>());
}

nlohmann::json rankShape(const CaseSpec& c, int ranks) {
  if (c.workload == "torchscript") {
    return reference::torchscript::ImportSpec::fromJson(c.shape).rowsOver(ranks).toJson();
  }
  nlohmann::json s = c.shape;
  s["batch"] = reference::GraphShape::parse(c.workload, c.shape).batch / ranks;
  return s;
}

std::string importedUnsupported(const CaseSpec& c) {
  namespace ts = reference::torchscript;
  const ts::ImportSpec spec = ts::ImportSpec::fromJson(c.shape);
  if (spec.microbatches > 1) {
    return "the reference accumulates micro-batches (shape key microbatches), the pipeline's; "
           "a data-parallel step runs each rank's rows of the whole batch at once";
  }
  const int ranks = static_cast<int>(c.meshSize());
  const auto whole = ts::importModel(spec);
  for (const auto& n : whole->graph.nodes) {
    const bool batchNorm =
        n.shape.op == "batch_norm" ||
        (n.shape.op == "aten" &&
         n.shape.attrs.value("schema", std::string()).find("batch_norm") != std::string::npos);
    if (batchNorm) {
      return "batch norm (" + n.name +
             "): each rank would normalise its rows by their own statistics, not the whole "
             "batch's as the reference does (SyncBatchNorm's all-reduce is not run here)";
    }
  }
  std::shared_ptr<const ts::ImportedModel> local;
  try {
    local = ts::importModel(spec.rowsOver(ranks));
  } catch (const ts::ImportError& e) {
    return std::string("a rank's rows of the batch: ") + e.what();
  }
  const Graph& g = whole->graph;
  const Graph& l = local->graph;
  const auto out = g.valueShape(g.output), localOut = l.valueShape(l.output);
  if (out.empty() || localOut.empty() || out[0] != localOut[0] * ranks) {
    return "the output's first dimension is not the batch: " + reference::dimsString(out) +
           " on the whole batch, " + reference::dimsString(localOut) + " on one of " +
           std::to_string(ranks) + " ranks' rows (the loss must be a sum over rows split over "
           "the ranks)";
  }
  bool same = g.nodes.size() == l.nodes.size() && g.parameters == l.parameters;
  for (size_t j = 0; same && j < g.nodes.size(); ++j) {
    same = g.nodes[j].name == l.nodes[j].name && g.nodes[j].args == l.nodes[j].args;
  }
  if (!same) {
    return "the model imports at one rank's rows into another graph than at the whole batch's "
           "(the trace folds the batch size into its operators)";
  }
  return "";
}

std::vector<int> forwardOrder(const Units& u, const Graph& g) {
  std::vector<std::pair<int, int>> first;  // {first node, unit}
  for (int unit = 1; unit < static_cast<int>(u.names.size()); ++unit) {
    int at = static_cast<int>(g.nodes.size());
    for (int j = 0; j < static_cast<int>(g.nodes.size()) && at == static_cast<int>(g.nodes.size());
         ++j) {
      for (const auto& a : g.nodes[j].args) {
        if (g.isParameter(a) && u.unitOfParam.at(a) == unit) at = j;
      }
    }
    first.emplace_back(at, unit);
  }
  std::sort(first.begin(), first.end());
  std::vector<int> out;
  for (const auto& f : first) out.push_back(f.second);
  return out;
}

Layout Layout::of(Kind k, const CaseSpec& c, int rank) {
  Layout l;
  l.world = static_cast<int>(c.meshSize());
  if (k == Kind::kDdp) return l;
  if (k == Kind::kHsdp) {
    l.replicaParts = static_cast<int>(c.mesh.at(0));
    l.shardParts = static_cast<int>(c.mesh.at(1));
    l.shardIndex = rank % l.shardParts;
    return l;
  }
  l.shardParts = l.world;
  l.shardIndex = rank;
  return l;
}

Units Units::of(const Graph& g) {
  std::map<std::string, std::set<int>> layers;
  for (const auto& n : g.nodes) {
    for (const auto& a : n.args) {
      if (g.isParameter(a)) layers[a].insert(n.layer);
    }
  }
  Units u;
  u.names.push_back("root");
  u.layer.push_back(-1);
  u.params.emplace_back();
  std::map<int, int> unitOfLayer;
  for (const auto& [name, dims] : g.parameters) {
    const auto& ls = layers[name];
    int unit = 0;
    if (ls.size() == 1 && *ls.begin() >= 0) {
      const int layer = *ls.begin();
      if (!unitOfLayer.count(layer)) {
        unitOfLayer[layer] = static_cast<int>(u.names.size());
        u.names.push_back("layer" + std::to_string(layer));
        u.layer.push_back(layer);
        u.params.emplace_back();
      }
      unit = unitOfLayer[layer];
    }
    u.params[unit].push_back(name);
    u.unitOfParam[name] = unit;
  }
  // Where each unit's forward ends: its last node reading one of its parameters, or a value
  // computed from parameters alone that holds them (an imported linear's weight transpose, a
  // view of the gathered storage, read by the addmm after it: where a linear has no bias, the
  // transpose is the last node that reads the weight itself). And what it hands on.
  const int nodes = static_cast<int>(g.nodes.size());
  u.lastNode.assign(u.names.size(), -1);
  std::map<std::string, std::set<int>> heldUnits;  // a value of parameters alone: whose
  for (int j = 0; j < nodes; ++j) {
    std::set<int> reads;
    bool parametersAlone = true;
    for (const auto& a : g.nodes[j].args) {
      if (g.isParameter(a)) {
        reads.insert(u.unitOfParam.at(a));
      } else if (const auto it = heldUnits.find(a); it != heldUnits.end()) {
        reads.insert(it->second.begin(), it->second.end());
      } else {
        parametersAlone = false;
      }
    }
    for (int unit : reads) u.lastNode[unit] = j;
    if (parametersAlone && !reads.empty()) {
      for (const auto& o : g.nodes[j].outputs()) heldUnits[o] = reads;
    }
  }
  u.handedOn.assign(u.names.size(), {});
  for (int unit = 1; unit < static_cast<int>(u.names.size()); ++unit) {
    const int last = u.lastNode[unit];
    std::set<std::string> produced;
    for (int m = 0; m <= last; ++m) {
      if (g.nodes[m].layer != u.layer[unit]) continue;
      for (const auto& o : g.nodes[m].outputs()) produced.insert(o);
    }
    for (const auto& v : produced) {
      bool read = v == g.output;
      for (int m = last + 1; m < nodes && !read; ++m) {
        for (const auto& a : g.nodes[m].args) read |= a == v;
      }
      if (read) u.handedOn[unit].push_back(v);
    }
  }
  return u;
}

std::vector<harness::NodeComm> predictCommByNode(Kind kind, Fault fault, const CaseSpec& c,
                                                 int rank) {
  const Graph g = reference::buildGraph(c.workload, c.shape);
  const Units units = Units::of(g);
  const Layout l = Layout::of(kind, c, rank);
  const int64_t es = elemSize(c.dtype);
  std::vector<harness::NodeComm> nodes;
  const auto at = [&](const std::string& unit, const char* phase) -> CommStats& {
    return harness::commAt(nodes, unit, phase);
  };
  const auto count = [&](CommStats& into, Collective k, int groupSize, int64_t bytes) {
    into.add(k, groupSize > 1 ? bytes : 0);
  };
  // Sharded parameters: each unit's all-gathers in its forward, in forward order (the root's
  // first), then its backward's gathers and reductions, last unit first.
  if (shardsParams(kind)) {
    at(units.names[0], "forward");
    for (int u : forwardOrder(units, g)) at(units.names[u], "forward");
    at(units.names[0], "backward");
    const auto order = forwardOrder(units, g);
    for (auto it = order.rbegin(); it != order.rend(); ++it) at(units.names[*it], "backward");
  }
  for (const auto& [name, dims] : g.parameters) {
    const std::string& unit = units.names[units.unitOfParam.at(name)];
    const int64_t bytes = numel(dims) * es;
    const bool last = name == g.parameters.rbegin()->first;
    switch (kind) {
      // Replicated parameters: reduced after the backward, before the update (and ZeRO's
      // updated shards gathered after it), each at its parameter's unit.
      case Kind::kDdp:
        if (fault == Fault::kReplicaUnsummed && last) break;
        count(at(unit, "update"),
              fault == Fault::kReplicaOwnOrder ? Collective::kAllGather : Collective::kAllReduce,
              l.world, fault == Fault::kReplicaOwnOrder ? bytes * l.world : bytes);
        break;
      case Kind::kZero1:
        if (fault != Fault::kReplicaUnsummed || !last) {
          count(at(unit, "update"), Collective::kAllReduce, l.world, bytes);
        }
        count(at(unit, "update"), Collective::kAllGather, l.world, bytes);
        break;
      case Kind::kZero2:
        count(at(unit, "update"), Collective::kReduceScatter, l.world, bytes);
        count(at(unit, "update"), Collective::kAllGather, l.world, bytes);
        break;
      case Kind::kZero3:
      case Kind::kHsdp: {
        const bool again = units.unitOfParam.at(name) != 0 && reshardAfterForward(c);
        // Gathered in the parameter dtype (mixed precision: bfloat16), reduced in the case's.
        const int64_t gathered = numel(dims) * elemSize(paramDtype(c).value_or(c.dtype));
        count(at(unit, "forward"), Collective::kAllGather, l.shardParts, gathered);
        CommStats& backward = at(unit, "backward");
        if (again) count(backward, Collective::kAllGather, l.shardParts, gathered);
        count(backward, Collective::kReduceScatter, l.shardParts, bytes);
        if (kind == Kind::kHsdp && (fault != Fault::kReplicaUnsummed || !last)) {
          const int64_t rows = harness::chunkSizes(dims[0], l.shardParts)[l.shardIndex];
          count(backward, Collective::kAllReduce, l.replicaParts, rows * rowElems(dims) * es);
        }
        break;
      }
    }
  }
  // Outside the units: the loss, and where the optimizer steps shards, the norm's squares.
  CommStats& update = at("", "update");
  count(update, Collective::kAllReduce, l.world, es);
  if (shardsState(kind)) count(update, Collective::kAllReduce, l.shardParts, 8);
  for (auto& n : nodes) n.comm.scale(c.training.steps);
  return nodes;
}

CommStats predictComm(Kind kind, Fault fault, const CaseSpec& c, int rank) {
  return harness::totalOf(predictCommByNode(kind, fault, c, rank));
}

}  // namespace sb::strategies::fsdp
