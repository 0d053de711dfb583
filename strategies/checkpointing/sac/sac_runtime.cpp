// Selective activation checkpointing inside a plan: the hooks, the recomputation and its model
// (sac_runtime.h says how it works).

#include "strategies/checkpointing/sac/sac_runtime.h"

#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <c10/core/GradMode.h>

#include <cstring>
#include <stdexcept>

#include "harness/comm/mesh.h"
#include "strategies/sharding/auto/plan_memory.h"

namespace sb::strategies::sac {
namespace {

using reference::SavedTensorHooks;
using Packed = SavedTensorHooks::Packed;

// Operators whose saving the model knows: what they save of their operands (savesOperand), and
// whether their node saves tensors of its own (statistics, a mask, its output, rope's tables).
bool modelled(const std::string& op) {
  static const std::set<std::string> k = {
      "embedding", "add",     "mul",   "addmm",   "mm",      "bmm",       "matmul",
      "gelu",      "silu",    "relu",  "softmax", "dropout", "layer_norm", "rms_norm",
      "rope",      "view",    "reshape", "permute", "transpose", "split",  "contiguous"};
  return k.count(op) > 0;
}
// 2 m n k of one rank's product: its piece of the output ([..., m, n], a pending sum's whole)
// and its first operand's [..., m, k] (k cut where the sum is split over ranks).
double productFlops(const autoshard::Candidate& c, const std::vector<int64_t>& mesh,
                    const std::vector<int64_t>& coords) {
  const auto& r = c.op;
  const harness::Box out = r.outputs[0].box(r.shape.outputs()[0], mesh, coords);
  const harness::Box in = r.operands[0].box(r.shape.operandShape(r.spec.operands[0]), mesh, coords);
  return 2 * static_cast<double>(out.numel()) * static_cast<double>(in.length.back());
}

// The first pass's matmul flops, counted on the thread that runs it.
thread_local double* tlsFlops = nullptr;

std::unique_ptr<at::ObserverContext> countMatmul(const at::RecordFunction& fn) {
  if (!tlsFlops) return nullptr;
  const char* name = fn.name();
  int a = -1;
  if (std::strcmp(name, "aten::mm") == 0 || std::strcmp(name, "aten::bmm") == 0) a = 0;
  if (std::strcmp(name, "aten::addmm") == 0 || std::strcmp(name, "aten::baddbmm") == 0) a = 1;
  if (a < 0) return nullptr;
  const auto in = fn.inputs();
  if (in.size() < static_cast<size_t>(a + 2) || !in[a].isTensor() || !in[a + 1].isTensor()) {
    return nullptr;
  }
  const auto x = in[a].toTensor().sizes();
  const auto y = in[a + 1].toTensor().sizes();
  double f = 2;
  for (int64_t d : x) f *= static_cast<double>(d);  // [b,] m, k
  *tlsFlops += f * static_cast<double>(y.back());   // n
  return nullptr;
}

struct DroppedValue final : Packed {
  int node = 0, output = 0, region = 0;
  std::vector<int64_t> sizes, strides;
  int64_t offset = 0;  // from the output's own storage offset
  at::TensorOptions options;
};
struct DroppedOwn final : Packed {
  int node = 0, index = 0, region = 0;
};
struct Nothing final : Packed {};

// The forward's hooks of node v, and a recomputation's, which captures what v saves.
class NodeHooks final : public SavedTensorHooks {
 public:
  NodeHooks(std::shared_ptr<SacRuntime> rt, int v) : rt_(std::move(rt)), v_(v) {}
  std::unique_ptr<Packed> pack(const at::Tensor& t) override { return rt_->pack(v_, t); }
  at::Tensor unpack(Packed& p) override { return rt_->unpack(p); }

 private:
  std::shared_ptr<SacRuntime> rt_;
  int v_;
};

class CaptureHooks final : public SavedTensorHooks {
 public:
  explicit CaptureHooks(std::function<void(const at::Tensor&)> keep) : keep_(std::move(keep)) {}
  std::unique_ptr<Packed> pack(const at::Tensor& t) override {
    keep_(t);
    return std::make_unique<Nothing>();
  }
  at::Tensor unpack(Packed&) override {
    throw std::logic_error("a recomputation's own graph is never run backward");
  }

 private:
  std::function<void(const at::Tensor&)> keep_;
};

}  // namespace

bool isMatmulOp(const std::string& op) {
  return op == "addmm" || op == "mm" || op == "bmm" || op == "matmul";
}

bool savesOwnTensors(const std::string& op) {
  return op == "dropout" || op == "layer_norm" || op == "rms_norm" || op == "softmax" ||
         op == "relu" || op == "rope";
}

std::set<std::pair<int, size_t>> copyingEdges(const autoshard::ShardingModel& m,
                                              const std::vector<int>& choice) {
  std::set<std::pair<int, size_t>> out;
  const harness::DeviceMesh mesh(m.mesh());
  for (const auto& e : autoshard::planEdges(m, choice)) {
    for (const auto& st : e.forward.steps) {
      if (mesh.groupSize(st.axes) > 1) {
        out.insert({e.node, e.operand});
        break;
      }
    }
  }
  return out;
}

std::vector<int> blockSaveReaders(const autoshard::ShardingModel& m, const std::vector<int>& choice,
                                  bool throughViews) {
  const auto& g = m.graph();
  const auto copies = copyingEdges(m, choice);
  std::vector<int> readers(g.nodes.size(), 0);
  for (size_t w = 0; w < g.nodes.size(); ++w) {
    const auto& node = g.nodes[w];
    std::vector<bool> grads;
    for (const auto& a : node.args) grads.push_back(g.requiresGrad(a));
    // No operand takes a gradient: no autograd node, nothing saved.
    if (node.layer < 0 || std::find(grads.begin(), grads.end(), true) == grads.end()) continue;
    const auto& op = m.candidates(static_cast<int>(w))[choice[w]].op;
    for (size_t i = 0; i < node.args.size(); ++i) {
      // Read through a redistribution that copies: the node saves its own copy.
      if (!autoshard::savesOperand(op, i, grads) || copies.count({static_cast<int>(w), i})) {
        continue;
      }
      const int o =
          throughViews ? storageOwner(g, node.args[i], &copies) : g.producer(node.args[i]).first;
      if (o >= 0 && g.nodes[static_cast<size_t>(o)].layer == node.layer) {
        ++readers[static_cast<size_t>(o)];
      }
    }
  }
  return readers;
}

RecomputeModel modelRecompute(const autoshard::ShardingModel& m, const std::vector<int>& choice,
                              const Policy& p, int rank) {
  const auto& g = m.graph();
  const size_t n = g.nodes.size();
  const auto coords = harness::DeviceMesh(m.mesh()).coords(rank);
  RecomputeModel r;
  r.recomputed.assign(n, false);
  // A node not kept is recomputed where a node of its block saves its storage, or where it
  // saves tensors of its own (a copy its edge's redistribution made among them).
  const std::vector<int> readers = blockSaveReaders(m, choice);
  const auto copies = copyingEdges(m, choice);
  std::vector<double> flops(n, 0.0);
  for (size_t v = 0; v < n; ++v) {
    const auto& node = g.nodes[v];
    const auto& cand = m.candidates(static_cast<int>(v))[choice[v]];
    if (isMatmulOp(node.shape.op)) flops[v] = productFlops(cand, m.mesh(), coords);
    std::vector<bool> grads;
    for (const auto& a : node.args) grads.push_back(g.requiresGrad(a));
    const bool hasGrad = std::find(grads.begin(), grads.end(), true) != grads.end();
    bool savesCopy = false;
    for (size_t i = 0; i < node.args.size(); ++i) {
      if (isMatmulOp(node.shape.op) && i < 2 && grads[i]) r.backwardFlops += flops[v];
      savesCopy = savesCopy || (hasGrad && copies.count({static_cast<int>(v), i}) &&
                                autoshard::savesOperand(cand.op, i, grads));
    }
    if (!modelled(node.shape.op) && r.unmodelled.empty()) r.unmodelled = node.shape.op;
    r.forwardFlops += flops[v];
    if (p.region[v] < 0 || p.save[v]) continue;
    if (readers[v] > 0 || savesCopy || (hasGrad && savesOwnTensors(node.shape.op))) {
      r.recomputed[v] = true;
    }
    r.savedTwice = r.savedTwice || readers[v] >= 2;
  }
  // What a recomputed node reads that was dropped too is recomputed before it.
  autoshard::recomputeClosure(g, p.save, p.region, r.recomputed);
  for (size_t v = 0; v < n; ++v) {
    if (!r.recomputed[v]) continue;
    const auto& node = g.nodes[v];
    r.recomputeFlops += flops[v];
    if (node.shape.op == "dropout") r.recomputesDropout = true;
    for (const auto& a : node.args) {
      const int q = g.producer(a).first;
      if (q < 0) continue;  // data and parameters: the executor holds them
      if (p.region[static_cast<size_t>(q)] != p.region[v] || p.save[static_cast<size_t>(q)]) {
        r.heldBy[a].insert(p.region[v]);
      }
    }
  }
  return r;
}

struct SacRuntime::Owner {
  Owner(const at::Tensor& t, int n, int out)
      : storage(t.storage().getWeakStorageImpl()),
        node(n),
        output(out),
        offset(t.storage_offset()) {}
  c10::weak_intrusive_ptr<c10::StorageImpl> storage;
  int node = -1, output = 0;
  int64_t offset = 0;
};

SacRuntime::SacRuntime(const reference::Graph& g, Policy policy, RecomputeModel model,
                       SacFault fault)
    : g_(g), policy_(std::move(policy)), model_(std::move(model)), fault_(fault) {
  replay_.save = policy_.save;
  replay_.region = policy_.region;
  replay_.heldBy = model_.heldBy;
}

void SacRuntime::startPass(Rerun rerun, const std::vector<at::Tensor>& held) {
  rerun_ = std::move(rerun);
  owners_.clear();
  packIndex_.clear();
  held_.clear();
  recomputedRegions_.clear();
  readersLeft_.clear();
  recomputedOut_.clear();
  droppedOwn_.clear();
  captured_.clear();
  droppedNodes_.clear();
  for (const auto& t : held) {
    if (!t.defined() || !t.has_storage()) continue;
    owners_[t.storage().unsafeGetStorageImpl()] = std::make_shared<Owner>(t, -1, 0);
  }
  if (firstPass_) {
    counts_ = Counts{};
    tlsFlops = &counts_.matmulFlops;
    observer_ = at::addThreadLocalCallback(
        at::RecordFunctionCallback(countMatmul).needsInputs(true).scopes(
            {at::RecordScope::FUNCTION}));
    observing_ = true;
  }
}

void SacRuntime::hold(const at::Tensor& t) {
  if (!t.defined() || !t.has_storage()) return;
  owners_[t.storage().unsafeGetStorageImpl()] = std::make_shared<Owner>(t, -1, 0);
}

void SacRuntime::endPass() {
  if (observing_) {
    at::removeCallback(observer_);
    tlsFlops = nullptr;
    observing_ = false;
    counts_.counted = true;
    firstPass_ = false;
  }
  held_.clear();
  recomputedOut_.clear();
  captured_.clear();
  owners_.clear();
  rerun_ = nullptr;
}

std::unique_ptr<reference::ScopedSavedTensorHooks> SacRuntime::nodeHooks(int v) {
  if (policy_.region[static_cast<size_t>(v)] < 0) return nullptr;
  return std::make_unique<reference::ScopedSavedTensorHooks>(
      std::make_shared<NodeHooks>(shared_from_this(), v));
}

void SacRuntime::nodeDone(int v, const std::vector<at::Tensor>& outs) {
  const auto names = g_.nodes[static_cast<size_t>(v)].outputs();
  for (size_t j = 0; j < outs.size(); ++j) {
    const at::Tensor& t = outs[j];
    if (!t.defined() || !t.has_storage()) continue;
    const void* key = t.storage().unsafeGetStorageImpl();
    auto it = owners_.find(key);
    if (it == owners_.end() || it->second->storage.expired()) {
      owners_[key] = std::make_shared<Owner>(t, v, static_cast<int>(j));
    }
    if (j < names.size()) {
      if (auto h = model_.heldBy.find(names[j]); h != model_.heldBy.end()) {
        for (int region : h->second) held_[region][names[j]] = t;
      }
    }
  }
}

std::unique_ptr<Packed> SacRuntime::pack(int v, const at::Tensor& t) {
  const int k = packIndex_[v]++;
  const int region = policy_.region[static_cast<size_t>(v)];
  if (t.defined() && t.has_storage()) {
    auto it = owners_.find(t.storage().unsafeGetStorageImpl());
    if (it != owners_.end() && !it->second->storage.expired()) {
      const Owner& o = *it->second;
      if (o.node >= 0 && policy_.region[static_cast<size_t>(o.node)] == region &&
          !policy_.save[static_cast<size_t>(o.node)]) {
        auto d = std::make_unique<DroppedValue>();
        d->node = o.node;
        d->output = o.output;
        d->region = region;
        d->sizes = t.sizes().vec();
        d->strides = t.strides().vec();
        d->offset = t.storage_offset() - o.offset;
        d->options = t.options();
        ++readersLeft_[{o.node, o.output}];
        droppedNodes_[region].insert(o.node);
        if (firstPass_) ++counts_.dropped;
        return d;
      }
    } else if (!policy_.save[static_cast<size_t>(v)]) {
      auto d = std::make_unique<DroppedOwn>();
      d->node = v;
      d->index = k;
      d->region = region;
      droppedOwn_.insert({v, k});
      droppedNodes_[region].insert(v);
      if (firstPass_) ++counts_.dropped;
      return d;
    }
  }
  if (firstPass_) ++counts_.kept;
  return reference::keepSaved(t);
}

at::Tensor SacRuntime::unpack(Packed& p) {
  if (const at::Tensor* t = reference::keptTensor(p)) return *t;
  if (auto* d = dynamic_cast<DroppedValue*>(&p)) {
    if (!recomputedRegions_.count(d->region)) recompute(d->region);
    const std::pair<int, int> key{d->node, d->output};
    auto it = recomputedOut_.find(key);
    if (it == recomputedOut_.end()) {
      if (fault_ != SacFault::kSavedFreedEarly) {
        throw std::logic_error("selective checkpointing: " +
                               g_.nodes[static_cast<size_t>(d->node)].name +
                               "'s output was not recomputed for its reader");
      }
      // The planted fault's second reader: the memory went back to the pool.
      return at::zeros(d->sizes, d->options);
    }
    const at::Tensor base = it->second.detach();
    at::Tensor out = base.as_strided(d->sizes, d->strides, base.storage_offset() + d->offset);
    if (--readersLeft_[key] == 0 || fault_ == SacFault::kSavedFreedEarly) {
      recomputedOut_.erase(it);
    }
    return out;
  }
  auto& d = dynamic_cast<DroppedOwn&>(p);
  if (!recomputedRegions_.count(d.region)) recompute(d.region);
  auto it = captured_.find({d.node, d.index});
  if (it == captured_.end()) {
    throw std::logic_error("selective checkpointing: " +
                           g_.nodes[static_cast<size_t>(d.node)].name + "'s saved tensor " +
                           std::to_string(d.index) + " was not captured by its recomputation");
  }
  at::Tensor out = it->second.detach();
  captured_.erase(it);
  return out;
}

void SacRuntime::recompute(int region) {
  recomputedRegions_.insert(region);
  const size_t n = g_.nodes.size();
  std::vector<bool> needed(n, false);
  for (int v : droppedNodes_[region]) needed[static_cast<size_t>(v)] = true;
  autoshard::recomputeClosure(g_, policy_.save, policy_.region, needed);
  auto& held = held_[region];
  std::map<std::string, at::Tensor> values;  // this recomputation's outputs
  const at::AutoGradMode grad(true);
  for (size_t v = 0; v < n; ++v) {
    if (!needed[v]) continue;
    const auto& node = g_.nodes[v];
    int index = 0;
    const int vi = static_cast<int>(v);
    std::vector<at::Tensor> outs;
    {
      const reference::ScopedSavedTensorHooks capture(
          std::make_shared<CaptureHooks>([&](const at::Tensor& t) {
            // Detached, as torch.utils.checkpoint's recomputation keeps them: the recomputed
            // graph, and the operands it read, go when the recomputation returns.
            if (droppedOwn_.count({vi, index})) captured_[{vi, index}] = t.detach();
            ++index;
          }));
      const uint64_t shift =
          fault_ == SacFault::kRecomputeWithoutRng && node.shape.op == "dropout" ? 1 : 0;
      outs = rerun_(
          vi,
          [&](const std::string& a) -> at::Tensor {
            if (auto it = values.find(a); it != values.end()) return it->second;
            auto it = held.find(a);
            if (it == held.end()) {
              throw std::logic_error("selective checkpointing: recomputing " + node.name +
                                     ": its operand " + a + " was neither held nor recomputed");
            }
            const at::Tensor& t = it->second;
            return t.detach().requires_grad_(t.requires_grad());
          },
          shift);
    }
    const auto names = node.outputs();
    for (size_t j = 0; j < outs.size() && j < names.size(); ++j) {
      values[names[j]] = outs[j];
      if (readersLeft_.count({vi, static_cast<int>(j)})) {
        recomputedOut_[{vi, static_cast<int>(j)}] = outs[j].detach();
      }
    }
    if (firstPass_ && !isViewOp(node.shape.op)) {
      ++counts_.recomputedNodes;
      if (isMatmulOp(node.shape.op)) ++counts_.recomputedMatmulNodes;
      counts_.recomputed.push_back(node.name);
    }
  }
  held_.erase(region);
}

void priceRecompute(autoshard::ShardingModel& m, const Policy& p) {
  auto pricing = std::make_shared<autoshard::RecomputePricing>();
  pricing->policy = p.name;
  pricing->save = p.save;
  pricing->region = p.region;
  pricing->recomputed = modelRecompute(m, m.replicatedChoice(), p).recomputed;
  pricing->replayFor = [&m, p](const std::vector<int>& choice) {
    return autoshard::RecomputePolicy{p.save, p.region, modelRecompute(m, choice, p).heldBy};
  };
  pricing->recomputedFor = [&m, p](const std::vector<int>& choice) {
    return modelRecompute(m, choice, p).recomputed;
  };
  m.priceRecompute(std::move(pricing));
}

int64_t predictedRecomputedNodes(const RecomputeModel& m, const reference::Graph& g) {
  int64_t n = 0;
  for (size_t v = 0; v < g.nodes.size(); ++v) {
    n += m.recomputed[v] && !isViewOp(g.nodes[v].shape.op);
  }
  return n;
}

std::vector<std::pair<std::string, std::string>> runParams(const SacRuntime& rt,
                                                           const RecomputeModel& m,
                                                           const reference::Graph& g) {
  const auto& k = rt.counts();
  return {{"policy", rt.policy().name},
          {"recomputed_nodes", std::to_string(k.recomputedNodes)},
          {"predicted_recomputed_nodes", std::to_string(predictedRecomputedNodes(m, g))},
          {"saved_kept", std::to_string(k.kept)},
          {"saved_dropped", std::to_string(k.dropped)},
          {"recompute_flops", std::to_string(static_cast<int64_t>(m.recomputeFlops))}};
}

void addRunDetails(nlohmann::json& j, const SacRuntime& rt, const RecomputeModel& m,
                   const reference::Graph& g) {
  const auto& k = rt.counts();
  nlohmann::json recomputed = nlohmann::json::array();
  for (size_t v = 0; v < g.nodes.size(); ++v) {
    if (m.recomputed[v]) recomputed.push_back(g.nodes[v].name);
  }
  j["sac"] = {{"policy", rt.policy().name},
              {"predicted_recomputed", recomputed},
              {"recomputed", k.recomputed},
              {"saved_kept", k.kept},
              {"saved_dropped", k.dropped},
              {"flops",
               {{"forward", m.forwardFlops},
                {"backward", m.backwardFlops},
                {"recompute", m.recomputeFlops}}}};
  // The step's matmul flops, judged exactly: a node recomputed that the model does not
  // recompute (or one missing) is a mispredicted row.
  if (k.counted && m.unmodelled.empty()) {
    // Counted on the first forward and backward (a training case's first step).
    auto& p = j["predictions"];
    if (!p.is_array()) p = nlohmann::json::array();
    p.push_back({{"what", "matmul_flops"},
                 {"unit", "flop"},
                 {"measured", k.matmulFlops},
                 {"predicted", m.forwardFlops + m.backwardFlops + m.recomputeFlops},
                 {"tolerance", 0.0}});
    p.push_back({{"what", "recomputed_nodes"},
                 {"unit", "nodes"},
                 {"measured", k.recomputedNodes},
                 {"predicted", predictedRecomputedNodes(m, g)},
                 {"tolerance", 0.0}});
  } else if (!m.unmodelled.empty()) {
    j["sac"]["flops_prediction"] = "none: " + m.unmodelled + "'s saving is not modelled";
  }
}

}  // namespace sb::strategies::sac
