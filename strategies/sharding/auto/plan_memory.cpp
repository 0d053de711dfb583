// The replay of one rank's step through a sharding plan (plan_memory.h): the forward as the
// plan executor walks it, the backward as LibTorch's autograd engine orders it.

#include "strategies/sharding/auto/plan_memory.h"

#include <ATen/TensorUtils.h>
#include <c10/util/irange.h>

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <queue>
#include <set>

#include "harness/comm/mesh.h"
#include "harness/measure/memory.h"
#include "reference/torchscript/aten_op.h"
#include "strategies/sharding/layout/redistribute_exec.h"
#include "strategies/sharding/ops/op_rule.h"

namespace sb::strategies::autoshard {
namespace {

using harness::Box;
using harness::Layout;
using reference::Graph;
using reference::GraphNode;
using Dims = std::vector<int64_t>;

class Replay;

// A storage: released when the last tensor on it goes (nothing released for `sim == nullptr`:
// what the executor holds across the step).
struct Storage {
  Replay* sim = nullptr;
  int64_t bytes = 0;
  std::string what;
  // The node output that made it (-1: held by the executor, or not yet a node's).
  int node = -1, output = 0;
  ~Storage();
};

// A tensor: its storage and geometry. A std::shared_ptr<Tensor> is a reference to it, so that
// use_count() is LibTorch's Tensor::use_count() and the storage's is Storage::use_count().
struct Tensor {
  std::shared_ptr<Storage> storage;
  Dims sizes, strides;

  int64_t numel() const {
    return std::accumulate(sizes.begin(), sizes.end(), int64_t{1}, std::multiplies<>());
  }
  bool contiguous() const {
    int64_t expected = 1;
    for (int64_t d = static_cast<int64_t>(sizes.size()) - 1; d >= 0; --d) {
      if (sizes[d] == 1) continue;
      if (strides[d] != expected) return false;
      expected *= sizes[d];
    }
    return true;
  }
  // Non-overlapping and dense: a permutation of a contiguous tensor.
  bool dense() const {
    std::vector<size_t> order(sizes.size());
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return strides[a] < strides[b] || (strides[a] == strides[b] && sizes[a] < sizes[b]);
    });
    int64_t expected = 1;
    for (size_t d : order) {
      if (sizes[d] == 1) continue;
      if (strides[d] != expected) return false;
      expected *= sizes[d];
    }
    return true;
  }
};
using Ref = std::shared_ptr<Tensor>;

int64_t numelOf(const Dims& sizes) {
  return std::accumulate(sizes.begin(), sizes.end(), int64_t{1}, std::multiplies<>());
}

// The allocator's account of `run` on the calling thread's bucket: the most bytes held above
// the start while it runs, and the bytes held at its end less those at its start (an imported
// operator's probe, aten_op.h).
std::pair<int64_t, int64_t> measureAllocations(const std::function<void()>& run) {
  auto& tracker = harness::MemoryTracker::instance();
  tracker.install();
  const int bucket = harness::MemoryTracker::threadBucket();
  const int64_t before = tracker.current(bucket);
  const int64_t held = tracker.heldDuring(bucket, run);
  return {held, tracker.current(bucket) - before};
}

Dims contiguousStrides(const Dims& sizes) {
  Dims s(sizes.size(), 1);
  for (int64_t d = static_cast<int64_t>(sizes.size()) - 2; d >= 0; --d) {
    s[d] = s[d + 1] * std::max<int64_t>(1, sizes[d + 1]);
  }
  return s;
}

// One node of the backward graph as the engine sees it: an operator's backward, an edge's
// redistribution of the gradient, a partial gradient's all-reduce, or a parameter's
// accumulator. Created in the forward's order (seq); an accumulator runs first of all.
struct Unit {
  enum Kind { kOp, kEdge, kAllReduce, kLeaf } kind = kOp;
  uint64_t seq = 0;
  int node = -1;
  size_t operand = 0;
  std::vector<Ref> slots;  // the gradients of its outputs as they arrive
  int deps = 0;
  bool reachable = false;
  // Per gradient it makes: where it goes (nullptr: nowhere, no gradient).
  std::vector<std::pair<Unit*, size_t>> targets;
  std::vector<Ref> saved;
  // Selective checkpointing: what a recomputation handed back for the node's backward to unpack
  // (a local of the node's apply, gone when it returns).
  std::vector<Ref> unpacked;
  // kOp: the rule's backward events and each operand's gradient; the native operators'.
  std::vector<int64_t> backwardEvents;
  std::vector<Dims> gradSizes;    // per operand (kEdge: the gradient's, redistributed back)
  std::vector<Dims> gradStrides;  // kOp: per operand, where not contiguous
  std::vector<bool> hasGrad;
  bool native = false;      // kOp add: the incoming gradient passed on
  int64_t extrasAfter = 0;  // kOp: what the forward saved, released with the saved tensors
  size_t incomingReleasedAt = SIZE_MAX;  // kOp: the backward event before which they go
  std::string op;
  bool recomputes = false;  // kOp: reads a tensor the forward dropped (selective checkpointing)
  Dims inSizes;             // kOp views: the operand's local sizes
  std::vector<int64_t> inversePerm;               // kOp permute
  std::unique_ptr<harness::RedistRunner> runner;  // kEdge: the gradient's way back
  std::vector<int> axes;                          // kAllReduce
  Dims paramSizes;                                // kLeaf
  std::string name;
};

class Replay {
 public:
  Replay(const ShardingModel& m, const std::vector<int>& choice, const std::vector<PlanEdge>& edges,
         harness::RankContext& ctx, at::ScalarType dtype, std::vector<PlanMemoryEvent>* log)
      : m_(m), g_(m.graph()), choice_(choice), ctx_(ctx), dtype_(dtype), log_(log) {
    es_ = static_cast<int64_t>(c10::elementSize(dtype));
    coords_ = ctx.mesh().coords(ctx.rank());
    for (const auto& e : edges) edges_[{e.node, e.operand}] = &e;
  }

  int64_t run();
  const RecomputePolicy* recompute = nullptr;  // selective checkpointing (plan_memory.h)
  // What the executor holds across the step: parameters' pieces, data slices, the seed.
  int64_t heldBytes() const { return held_; }
  bool freeEarly = false;  // the planted fault: values freed at their last reader's forward
  std::vector<int64_t>* liveAfterForward = nullptr;  // per node, held + live once it ran
  void stopLogging() { log_ = nullptr; }

  void alloc(int64_t b, const std::string& what) {
    if (b == 0) return;
    current_ += b;
    peak_ = std::max(peak_, current_);
    if (log_) log_->push_back({b, what});
  }
  void release(int64_t b, const std::string& what) {
    if (b == 0) return;
    current_ -= b;
    if (log_) log_->push_back({-b, what});
  }

 private:
  // A tensor whose bytes a rule's events allocated already (and the storage releases).
  Ref adopt(const Dims& sizes, const std::string& what) {
    auto s = std::make_shared<Storage>();
    s->sim = this;
    s->bytes = std::accumulate(sizes.begin(), sizes.end(), es_, std::multiplies<>());
    s->what = what;
    return std::make_shared<Tensor>(Tensor{s, sizes, contiguousStrides(sizes)});
  }
  // A new contiguous tensor, allocated here.
  Ref fresh(const Dims& sizes, const std::string& what) {
    Ref t = adopt(sizes, what);
    alloc(t->storage->bytes, what);
    return t;
  }
  Ref held(const Dims& sizes, int64_t elementSize = 0) {
    held_ += std::accumulate(sizes.begin(), sizes.end(), elementSize ? elementSize : es_,
                             std::multiplies<>());
    return std::make_shared<Tensor>(
        Tensor{std::make_shared<Storage>(), sizes, contiguousStrides(sizes)});
  }
  static Ref alias(const Ref& t, Dims sizes, Dims strides) {
    return std::make_shared<Tensor>(Tensor{t->storage, std::move(sizes), std::move(strides)});
  }
  static Ref alias(const Ref& t) { return alias(t, t->sizes, t->strides); }
  // A reshape: a view where the strides allow one, a contiguous copy otherwise.
  Ref reshape(const Ref& t, const Dims& sizes, const std::string& what) {
    if (auto st = at::detail::computeStride(t->sizes, t->strides, sizes)) {
      return alias(t, sizes, *st);
    }
    Ref c = copy(t, what);
    c->sizes = sizes;
    c->strides = contiguousStrides(sizes);
    return c;
  }
  // A contiguous copy of t. ATen copies a transposed 2-D tensor of at least 60 x 60 elements
  // through a 60 x 60 block buffer of its type (copy_transpose_valid), alive during the copy.
  Ref copy(const Ref& t, const std::string& what) {
    Ref out = fresh(t->sizes, what);
    const bool transposed = t->sizes.size() == 2 && t->strides[0] == 1 &&
                            t->strides[1] == t->sizes[0] && t->sizes[0] > 1 && t->sizes[1] > 1;
    if (transposed && t->numel() >= 60 * 60) {
      alloc(60 * 60 * es_, what + " (transpose block)");
      release(60 * 60 * es_, what + " (transpose block)");
    }
    return out;
  }
  Ref contiguous(const Ref& t, const std::string& what) {
    return t->contiguous() ? t : copy(t, what);
  }
  void applyEvents(const std::vector<int64_t>& events, const std::string& what) {
    for (int64_t b : events) {
      if (b > 0) {
        alloc(b, what);
      } else {
        release(-b, what);
      }
    }
  }

  Dims localSizes(const std::vector<int64_t>& shape, const Layout& l) const {
    return l.box(shape, m_.mesh(), coords_).length;
  }
  Unit* newUnit(Unit::Kind k, int node, const std::string& name) {
    units_.push_back(std::make_unique<Unit>());
    Unit* u = units_.back().get();
    u->kind = k;
    u->seq = k == Unit::kLeaf ? UINT64_MAX : nextSeq_++;
    u->node = node;
    u->name = name;
    return u;
  }

  // A recomputation's context: its operands by value name, and the node's own unit for what the
  // recomputed node hands its backward.
  struct Rerun {
    std::map<std::string, Ref>* values;
    int region;
  };
  // `rerun`: the node's forward again in the backward (no unit of its own, nothing counted as
  // read; what it saves goes at once but for what the forward dropped).
  std::vector<Ref> forwardNode(int v, const Rerun* rerun = nullptr);
  void recomputeRegion(int region);
  // Selective checkpointing's forward state: per (node, output) the dropped readers' units and
  // geometries; per node the unit whose own saved tensors went; per block the nodes dropped and
  // the values held for its recomputation; the blocks recomputed.
  struct DroppedRead {
    Unit* unit;
    Dims sizes, strides;
  };
  std::map<std::pair<int, int>, std::vector<DroppedRead>> droppedReads_;
  std::map<int, Unit*> droppedOwn_;
  std::map<int, std::set<int>> droppedNodes_;
  std::map<int, std::map<std::string, Ref>> heldForRerun_;
  std::set<int> rerunRegions_;
  std::map<int, std::vector<bool>> atenOutputGrads_;  // per imported node, as the forward asked
  bool keeps(int v) const {
    return !recompute || recompute->region[static_cast<size_t>(v)] < 0 ||
           recompute->save[static_cast<size_t>(v)];
  }
  void backward();
  void runUnit(Unit& u);
  void deliver(Unit& from, std::vector<Ref>& grads);

  const ShardingModel& m_;
  const Graph& g_;
  const std::vector<int>& choice_;
  harness::RankContext& ctx_;
  at::ScalarType dtype_;
  std::vector<PlanMemoryEvent>* log_;
  int64_t es_ = 0, current_ = 0, peak_ = 0, held_ = 0;
  std::vector<int64_t> coords_;
  std::map<std::pair<int, size_t>, const PlanEdge*> edges_;
  std::vector<std::unique_ptr<harness::RedistRunner>> forwardRunners_;

  std::vector<std::unique_ptr<Unit>> units_;
  uint64_t nextSeq_ = 1;
  std::map<std::string, Ref> values_;                       // activations, until their last reader
  std::map<std::string, int> reads_;                        // reads left
  std::map<std::string, std::pair<Unit*, size_t>> gradOf_;  // value -> where its gradient goes
  std::map<std::string, Ref> params_, leafGrads_;  // parameters' pieces and their gradients
  std::map<std::pair<int, size_t>, Ref> data_;     // the data slices, per reader
  Ref output_, seed_;
  struct Later {
    bool operator()(const Unit* a, const Unit* b) const { return a->seq < b->seq; }
  };
  std::priority_queue<Unit*, std::vector<Unit*>, Later> ready_;
};

Storage::~Storage() {
  if (sim) sim->release(bytes, "free " + what);
}

bool savesOutput(const std::string& op) { return op == "softmax" || op == "relu"; }
bool isView(const std::string& op) {
  return op == "view" || op == "reshape" || op == "permute" || op == "transpose";
}

std::vector<Ref> Replay::forwardNode(int v, const Rerun* rerun) {
  const GraphNode& n = g_.nodes[v];
  const int region = recompute ? recompute->region[static_cast<size_t>(v)] : -1;
  const Candidate& cand = m_.candidates(v)[choice_[v]];
  const ResolvedOp& r = cand.op;
  const std::string& op = n.shape.op;
  std::vector<Ref> local;
  std::vector<bool> grads;
  std::vector<std::pair<Unit*, size_t>> targets;
  for (size_t i = 0; i < n.args.size(); ++i) {
    const std::string& a = n.args[i];
    Ref t;
    std::pair<Unit*, size_t> target{nullptr, 0};
    if (g_.isInput(a)) {
      t = data_.at({v, i});
    } else if (g_.isParameter(a)) {
      t = params_.at(a);
      target = gradOf_.at(a);
    } else {
      if (!rerun) {
        t = values_.at(a);
      } else if (auto it = rerun->values->find(a); it != rerun->values->end()) {
        t = it->second;
      } else {
        auto& held = heldForRerun_[rerun->region];
        auto h = held.find(a);
        if (h == held.end()) {
          throw PlanMemoryUnknown(n.name + ": recomputed without its operand " + a);
        }
        t = alias(h->second);  // detached: the same storage
      }
      // A value no gradient flows through (made from the data alone) has none.
      if (auto it = gradOf_.find(a); it != gradOf_.end()) target = it->second;
    }
    const bool grad = target.first != nullptr;
    if (auto it = edges_.find({v, i}); it != edges_.end()) {
      const PlanEdge& e = *it->second;
      const Dims sourceSizes = t->sizes;
      forwardRunners_.push_back(
          std::make_unique<harness::RedistRunner>(e.geometry, e.forward, ctx_, dtype_));
      const auto mem = forwardRunners_.back()->memory(current_, false);
      if (log_ && mem.peak > current_) {
        log_->push_back({mem.peak - current_,
                         n.name + " operand " + std::to_string(i) + " redistributed (its peak)"});
        log_->push_back({-(mem.peak - current_), n.name + " redistribution's steps"});
      }
      peak_ = std::max(peak_, mem.peak);
      const Dims sizes = localSizes(e.geometry.shape, r.operands[i]);
      if (mem.outBytes > 0) {
        current_ = mem.live - mem.outBytes;
        t = fresh(sizes, n.name + " operand " + std::to_string(i) + " redistributed");
        // Selective checkpointing: the redistributed copy is the node's own (made in its
        // forward, not an output): kept or dropped with the node, its recomputation
        // redistributing again.
        if (recompute) {
          t->storage->node = v;
          t->storage->output = -1 - static_cast<int>(i);
        }
      } else {
        current_ = mem.live;
        t = alias(t);
      }
      // A recomputation's edge: its backward is never run (the recomputed graph goes).
      if (grad && !rerun) {
        Unit* u = newUnit(Unit::kEdge, v, n.name + " edge " + std::to_string(i));
        u->operand = i;
        u->runner = std::make_unique<harness::RedistRunner>(e.geometry, e.backward, ctx_, dtype_);
        u->gradSizes = {sourceSizes};
        u->targets = {target};
        u->slots.resize(1);
        target = {u, 0};
      }
    }
    local.push_back(t);
    grads.push_back(grad);
    targets.push_back(target);
    if (!rerun && !g_.isInput(a) && !g_.isParameter(a) && --reads_[a] == 0 && a != g_.output) {
      Ref& value = values_.at(a);
      if (freeEarly && value->storage->sim) {
        // The planted fault: the storage counted free at its last reader's forward, whatever
        // still holds it (what that reader saves for its backward).
        release(value->storage->bytes, "free " + value->storage->what + " (planted: early)");
        value->storage->sim = nullptr;
      }
      values_.erase(a);
    }
  }
  // runOp wraps the operands whose gradients are partial, after every edge's redistribution
  // (their autograd nodes come later, so the engine runs them first).
  for (size_t i = 0; i < local.size(); ++i) {
    if (!grads[i] || r.gradPartial[i].empty()) continue;
    if (rerun) {
      local[i] = alias(local[i]);  // view_as; the recomputed graph's backward is never run
      continue;
    }
    Unit* u = newUnit(Unit::kAllReduce, v, n.name + " grad all-reduce " + std::to_string(i));
    u->operand = i;
    u->axes = r.gradPartial[i];
    u->targets = {targets[i]};
    u->slots.resize(1);
    targets[i] = {u, 0};
    local[i] = alias(local[i]);  // view_as
  }
  if (r.spec.gatherInput && ctx_.mesh().groupSize(usedAxes(r.operands[0])) > 1 && isView(op)) {
    throw PlanMemoryUnknown(n.name + ": a view that gathers its input is not replayed");
  }
  if (rerun) {
    // The operands this node redistributed into copies of its own and dropped (its edges
    // recomputed with it): handed to its backward, as the outputs a reader dropped are.
    for (size_t i = 0; i < local.size(); ++i) {
      auto it = droppedReads_.find({v, -1 - static_cast<int>(i)});
      if (it == droppedReads_.end()) continue;
      for (const DroppedRead& d : it->second) {
        d.unit->unpacked.push_back(alias(local[i], d.sizes, d.strides));
      }
    }
  }
  const auto outShapes = n.shape.outputs();
  const auto outNames = n.outputs();
  std::vector<Ref> outs;
  const bool anyGrad = std::find(grads.begin(), grads.end(), true) != grads.end();
  // A recomputation's node: its autograd node is thrown away with the recomputation.
  std::unique_ptr<Unit> scratch;
  if (rerun && anyGrad) {
    scratch = std::make_unique<Unit>();
    scratch->name = n.name + " (recomputed)";
  }
  Unit* u = !anyGrad ? nullptr : rerun ? scratch.get() : newUnit(Unit::kOp, v, n.name);
  if (u) {
    u->op = op;
    u->targets = targets;
    u->slots.resize(outShapes.size());
    u->inSizes = local[0]->sizes;
  }
  // An imported operator: what its node saves, what it allocates inside itself and in its
  // backward, and which outputs view an operand, learned from the operator (aten_op.h).
  reference::AtenSaved aten;
  if (op == "aten") {
    std::vector<Dims> strides;
    for (const Ref& t : local) strides.push_back(t->strides);
    // Which outputs a gradient reaches: read later (a recomputation asks as the forward did).
    std::vector<bool>& outputGrads = atenOutputGrads_[v];
    if (!rerun) {
      outputGrads.clear();
      for (const std::string& o : outNames) {
        outputGrads.push_back(reads_[o] > 0 || o == g_.output);
      }
    }
    aten = reference::atenSavedTensors(r.shape, dtype_, grads, strides, outputGrads,
                                       measureAllocations);
  }
  if (op == "aten" && aten.measured && aten.passThrough) {
    // aten::to of the dtype it has, type_as: the operand itself, no node; its gradient is the
    // output's.
    const size_t k = static_cast<size_t>(aten.aliasOf[0]);
    outs.push_back(alias(local[k]));
    if (u) {
      u->native = true;
      u->targets = {targets[k]};
    }
  } else if (op == "aten" && aten.measured) {
    // As measured: the forward's transient and what its node keeps beyond its outputs (an
    // LSTM's gates of every step), outputs viewing an operand allocating nothing; the
    // backward's most above what it started from, then the operands' gradients.
    int64_t O = 0;
    for (size_t j = 0; j < outShapes.size(); ++j) {
      if (aten.aliasOf[j] < 0) O += numelOf(localSizes(outShapes[j], r.outputs[j])) * es_;
    }
    const int64_t kept = O + aten.internal;
    const int64_t forwardPeak = std::max(aten.forwardPeak, kept);
    alloc(forwardPeak, n.name + " forward");
    release(forwardPeak - kept, n.name + " forward's transients");
    if (!u) release(aten.internal, n.name + " forward (nothing saved)");
    // Selective checkpointing: what the node keeps of its own (as a rule's extras, below).
    if (u && aten.internal > 0 && !keeps(v)) {
      if (!rerun) {
        droppedOwn_[v] = u;
        droppedNodes_[region].insert(v);
        u->recomputes = true;
        release(aten.internal, n.name + " forward (its own saved tensors dropped)");
      } else if (!droppedOwn_.count(v)) {
        release(aten.internal, n.name + " recomputed (nothing of its own kept)");
      }
    }
    for (size_t j = 0; j < outShapes.size(); ++j) {
      const int k = aten.aliasOf[j];
      const Dims sizes = localSizes(outShapes[j], r.outputs[j]);
      outs.push_back(k >= 0 ? alias(local[static_cast<size_t>(k)], sizes, aten.outStrides[j])
                            : adopt(sizes, n.name));
      // Laid out as the operator lays it out (2.x's CPU flash attention returns [B, H, T, D]
      // as a permutation of a [B, T, H, D] buffer: the heads' merge that follows is a view).
      if (k < 0 && aten.outStrides[j].size() == sizes.size() && sizes == outShapes[j]) {
        const Dims before = outs.back()->strides;
        outs.back()->strides = aten.outStrides[j];
        if (!outs.back()->dense()) outs.back()->strides = before;
      }
    }
    if (u) {
      int64_t sumG = 0;
      for (size_t i = 0; i < local.size(); ++i) {
        u->gradSizes.push_back(local[i]->sizes);
        u->hasGrad.push_back(grads[i]);
        if (grads[i]) sumG += local[i]->numel() * es_;
      }
      const int64_t backwardPeak = std::max(aten.backwardPeak, sumG);
      u->backwardEvents = {backwardPeak, -(backwardPeak - sumG)};
      u->extrasAfter = aten.internal;
    }
  } else if (op == "view" || op == "reshape") {
    outs.push_back(reshape(local[0], localSizes(outShapes[0], r.outputs[0]), n.name));
  } else if (op == "permute" || op == "transpose") {
    const auto perm = n.shape.permutation();
    Dims sizes, strides;
    for (int64_t d : perm) {
      sizes.push_back(local[0]->sizes[d]);
      strides.push_back(local[0]->strides[d]);
    }
    outs.push_back(alias(local[0], sizes, strides));
    if (u) {
      u->inversePerm.assign(perm.size(), 0);
      for (size_t d = 0; d < perm.size(); ++d) u->inversePerm[perm[d]] = static_cast<int64_t>(d);
    }
  } else if (op == "contiguous") {
    // Tensor::contiguous: the input itself where it is contiguous (no autograd node then, the
    // gradient passing straight on), a copy otherwise (CloneBackward0 passes it on too).
    outs.push_back(contiguous(local[0], n.name));
    if (u) u->native = true;
  } else if (op == "split") {
    // Views of the input along the split dimension.
    for (size_t j = 0; j < outShapes.size(); ++j) {
      outs.push_back(alias(local[0], localSizes(outShapes[j], r.outputs[j]), local[0]->strides));
    }
    if (u) u->native = true;
  } else if (op == "add" && local[0]->sizes == local[1]->sizes) {
    outs.push_back(fresh(localSizes(outShapes[0], r.outputs[0]), n.name));
    if (u) u->native = true;
  } else {
    // The operator's rule, split at its backward.
    std::vector<at::Tensor> leaves;
    for (size_t i = 0; i < local.size(); ++i) {
      leaves.push_back(
          at::empty(local[i]->sizes, at::TensorOptions().dtype(dtype_).device(at::kMeta))
              .set_requires_grad(grads[i]));
    }
    std::vector<Box> outBoxes;
    for (size_t j = 0; j < outShapes.size(); ++j) {
      outBoxes.push_back(r.outputs[j].box(outShapes[j], m_.mesh(), coords_));
    }
    const std::string noFault;
    MemoryReplay mr(r, ctx_, noFault, dtype_, leaves, outBoxes, r.outputs[0].partialAxes());
    mr.split = true;
    mr.es = es_;
    mr.statEs = dtype_ == at::kDouble ? 8 : 4;
    mr.X = local[0]->numel() * es_;
    mr.n = local[0]->numel();
    for (const Box& b : outBoxes) mr.O += b.numel() * es_;
    mr.g.assign(local.size(), 0);
    for (size_t i = 0; i < local.size(); ++i) {
      if (grads[i]) mr.sumG += mr.g[i] = local[i]->numel() * es_;
    }
    mr.reduces = !mr.outPartial.empty();
    opRule(op).memory(mr);
    if (mr.backwardMarks != 1) {
      throw PlanMemoryUnknown(n.name + ": " + op + "'s replay does not mark its backward once");
    }
    // The forward keeps its outputs and what it saves; the backward makes the operands'
    // gradients and releases what the forward saved.
    const int64_t extras = mr.forwardNet - mr.O;
    const int64_t backwardNet = mr.current - mr.forwardNet;
    // A rule may leave what its forward saved to the end (a single operator's step ends there):
    // then it goes with the node's saved tensors.
    const bool extrasAfter = backwardNet == mr.sumG && extras > 0;
    if (extras < 0 || (backwardNet != mr.sumG - extras && !extrasAfter)) {
      throw PlanMemoryUnknown(n.name + ": " + op + "'s replay keeps " +
                              std::to_string(mr.forwardNet) + " B after its forward and " +
                              std::to_string(backwardNet) + " B after its backward, not its " +
                              "outputs and its operands' gradients");
    }
    applyEvents({mr.events.begin(), mr.events.begin() + mr.backwardFrom}, n.name + " forward");
    // Autograd records nothing where no operand needs a gradient: what the forward would have
    // saved goes when it returns.
    if (!u) release(extras, n.name + " forward (nothing saved)");
    // Selective checkpointing: a node not kept drops what it saves of its own (its
    // recomputation makes it again); a recomputation keeps it only for the forward's node
    // that dropped it.
    if (u && extras > 0 && !keeps(v)) {
      if (!rerun) {
        droppedOwn_[v] = u;
        droppedNodes_[region].insert(v);
        u->recomputes = true;
        release(extras, n.name + " forward (its own saved tensors dropped)");
      } else if (!droppedOwn_.count(v)) {
        release(extras, n.name + " recomputed (nothing of its own kept)");
      }
    }
    for (size_t j = 0; j < outShapes.size(); ++j) outs.push_back(adopt(outBoxes[j].length, n.name));
    if (u) {
      u->backwardEvents.assign(mr.events.begin() + mr.backwardFrom, mr.events.end());
      if (mr.incomingReleasedAt != SIZE_MAX) {
        u->incomingReleasedAt = mr.incomingReleasedAt - mr.backwardFrom;
      }
      if (extrasAfter) u->extrasAfter = extras;
      for (size_t i = 0; i < local.size(); ++i) {
        u->gradSizes.push_back(local[i]->sizes);
        u->hasGrad.push_back(grads[i]);
        // mm_mat1_backward and mm_mat2_backward return a column-major operand's gradient
        // column-major (grad.t().mm(...).t()): a transposed weight's then reaches its
        // AccumulateGrad contiguous, and is kept, not copied.
        const Dims& sz = local[i]->sizes;
        const Dims& st = local[i]->strides;
        const bool columnMajor = (op == "addmm" || op == "mm") && i < 2 && sz.size() == 2 &&
                                 sz[0] > 1 && sz[1] > 1 && st[0] == 1 && st[1] == sz[0];
        u->gradStrides.push_back(columnMajor ? st : Dims{});
      }
    }
  }
  // A saved operand: kept, or (selective checkpointing) dropped where its storage was made in
  // this block by a node not kept, the recomputation handing it to this node again.
  const auto saveOperand = [&](size_t i) {
    const Storage& st = *local[i]->storage;
    if (region >= 0 && st.node >= 0 && recompute->region[static_cast<size_t>(st.node)] == region &&
        !recompute->save[static_cast<size_t>(st.node)]) {
      droppedReads_[{st.node, st.output}].push_back({u, local[i]->sizes, local[i]->strides});
      droppedNodes_[region].insert(st.node);
      u->recomputes = true;
    } else {
      u->saved.push_back(local[i]);
    }
  };
  // The node's own saved output: kept, dropped, or (recomputed) handed to the forward's node.
  const auto saveOwnOutput = [&]() {
    if (rerun) {
      if (auto it = droppedOwn_.find(v); it != droppedOwn_.end()) {
        it->second->unpacked.push_back(outs[0]);
      }
    } else if (keeps(v)) {
      u->saved.push_back(outs[0]);
    } else {
      droppedOwn_[v] = u;
      droppedNodes_[region].insert(v);
      u->recomputes = true;
    }
  };
  if (u && op == "aten") {
    // An imported operator's node saves what this LibTorch's saves (1.13's mean its input,
    // 2.x's not): learned from the operator itself.
    if (!aten.passThrough) {
      for (size_t i = 0; i < local.size() && i < aten.operands.size(); ++i) {
        if (aten.operands[i] && !rerun) saveOperand(i);
      }
      if (aten.output && !outs.empty()) saveOwnOutput();
    }
  } else if (u && !rerun) {
    for (size_t i = 0; i < local.size(); ++i) {
      if (savesOperand(r, i, grads)) saveOperand(i);
    }
    if (savesOutput(op)) saveOwnOutput();
  } else if (u && savesOutput(op)) {
    saveOwnOutput();  // a recomputed node's own output, for the forward's node that dropped it
  }
  local.clear();
  if (rerun) return outs;
  for (size_t j = 0; j < outNames.size(); ++j) {
    Storage& st = *outs[j]->storage;
    if (st.sim && st.node < 0) {
      st.node = v;
      st.output = static_cast<int>(j);
    }
    if (u) gradOf_[outNames[j]] = {u, j};
    if (reads_[outNames[j]] > 0 || outNames[j] == g_.output) values_[outNames[j]] = outs[j];
    if (recompute) {
      if (auto h = recompute->heldBy.find(outNames[j]); h != recompute->heldBy.end()) {
        for (int b : h->second) heldForRerun_[b][outNames[j]] = outs[j];
      }
    }
  }
  return outs;
}

void Replay::recomputeRegion(int region) {
  if (!rerunRegions_.insert(region).second) return;
  // The nodes whose tensors were dropped, and before them the dropped nodes they read.
  const size_t n = g_.nodes.size();
  std::vector<bool> needed(n, false);
  for (int v : droppedNodes_[region]) needed[static_cast<size_t>(v)] = true;
  recomputeClosure(g_, recompute->save, recompute->region, needed);
  std::map<std::string, Ref> values;
  const Rerun rerun{&values, region};
  for (size_t v = 0; v < n; ++v) {
    if (!needed[v]) continue;
    const int vi = static_cast<int>(v);
    const auto outs = forwardNode(vi, &rerun);
    const auto names = g_.nodes[v].outputs();
    for (size_t j = 0; j < outs.size() && j < names.size(); ++j) {
      values[names[j]] = outs[j];
      if (auto it = droppedReads_.find({vi, static_cast<int>(j)}); it != droppedReads_.end()) {
        for (const DroppedRead& d : it->second) {
          d.unit->unpacked.push_back(alias(outs[j], d.sizes, d.strides));
        }
      }
    }
  }
  values.clear();
  heldForRerun_.erase(region);
}

void Replay::deliver(Unit& from, std::vector<Ref>& grads) {
  for (size_t i = 0; i < from.targets.size(); ++i) {
    auto [to, slot] = from.targets[i];
    if (!to || !grads[i]) continue;
    Ref g = std::move(grads[i]);
    Ref& old = to->slots[slot];
    if (!old) {
      old = std::move(g);
    } else if (old.use_count() == 1 && old->storage.use_count() == 1 && old->dense()) {
      g.reset();  // old.add_(g)
    } else {
      Ref sum = fresh(old->sizes, to->name + " gradients summed");
      if (old->dense()) sum->strides = old->strides;  // TensorIterator keeps the layout
      old = std::move(sum);
      g.reset();
    }
    if (--to->deps == 0) ready_.push(to);
  }
}

void Replay::runUnit(Unit& u) {
  std::vector<Ref> grads;
  const std::string& what = u.name;
  switch (u.kind) {
    case Unit::kLeaf: {
      // AccumulateGrad: the gradient kept when nothing else references it and its strides are
      // the parameter's; a contiguous copy otherwise.
      Ref& g = u.slots[0];
      bool steal = g.use_count() == 1;
      const Dims want = contiguousStrides(u.paramSizes);
      for (size_t d = 0; d < g->sizes.size() && steal; ++d) {
        if (g->sizes[d] != 1 && g->strides[d] != want[d]) steal = false;
      }
      leafGrads_[u.name] = steal ? alias(g) : copy(g, "grad " + u.name);
      u.slots.clear();
      return;
    }
    case Unit::kEdge: {
      // EdgeRedistribute::backward: the backward plan on the gradient made contiguous.
      Ref in = contiguous(u.slots[0], what + " gradient made contiguous");
      const auto mem = u.runner->memory(current_, false);
      if (log_ && mem.peak > current_) {
        log_->push_back({mem.peak - current_, what + " backward (its peak)"});
        log_->push_back({-(mem.peak - current_), what + " backward's steps"});
      }
      peak_ = std::max(peak_, mem.peak);
      if (mem.outBytes > 0) {
        current_ = mem.live - mem.outBytes;
        grads.push_back(fresh(u.gradSizes[0], what + " gradient redistributed"));
      } else {
        current_ = mem.live;
        grads.push_back(alias(in));
      }
      in.reset();
      break;
    }
    case Unit::kAllReduce: {
      // IdentityFwdAllReduceBwd: grads[0].contiguous().clone(), all-reduced in place.
      Ref c;
      {
        const Ref in = contiguous(u.slots[0], what + " gradient made contiguous");
        c = fresh(in->sizes, what + " copy");
      }
      const int64_t bytes = c->numel() * es_;
      const int64_t sc =
          ctx_.group(u.axes).scratchBytes(harness::Collective::kAllReduce, bytes, bytes, dtype_);
      alloc(sc, what + " scratch");
      release(sc, what + " scratch");
      grads.push_back(std::move(c));
      break;
    }
    case Unit::kOp: {
      const std::string& op = u.op;
      // Selective checkpointing: the first node of a block to read a dropped tensor recomputes
      // the block (its backward's first unpack).
      // An addmm over a pending sum adds its bias in a node of its own (the product summed
      // first): that node's backward, which sums a broadcast bias's gradient, runs before the
      // product's unpacks anything, and so before the recomputation.
      int64_t early = 0;
      if (u.recomputes && op == "addmm" && u.hasGrad.size() > 2 && u.hasGrad[2] &&
          u.gradSizes[2].size() == 1 && !u.backwardEvents.empty() &&
          !m_.candidates(u.node)[static_cast<size_t>(choice_[static_cast<size_t>(u.node)])]
               .op.outputs[0]
               .partialAxes()
               .empty()) {
        early = numelOf(u.gradSizes[2]) * es_;
        if (u.backwardEvents[0] < early) early = 0;
        u.backwardEvents[0] -= early;
        alloc(early, what + " bias gradient summed (its own node)");
      }
      if (u.recomputes) recomputeRegion(recompute->region[static_cast<size_t>(u.node)]);
      if (op == "view" || op == "reshape") {
        grads.push_back(reshape(u.slots[0], u.inSizes, what + " gradient"));
      } else if (op == "permute" || op == "transpose") {
        const Ref& g = u.slots[0];
        Dims sizes, strides;
        for (int64_t d : u.inversePerm) {
          sizes.push_back(g->sizes[d]);
          strides.push_back(g->strides[d]);
        }
        grads.push_back(alias(g, sizes, strides));
      } else if (u.native && op == "split") {
        // split_backward: zeros for the pieces no gradient reached, then their concatenation.
        std::vector<Ref> zeros;
        for (const Ref& s : u.slots) {
          if (!s) zeros.push_back(fresh(u.inSizes, what + " zeros"));  // (an upper bound)
        }
        if (!zeros.empty()) throw PlanMemoryUnknown(what + ": a split output no gradient reaches");
        grads.push_back(fresh(u.inSizes, what + " gradients concatenated"));
      } else if (u.native) {
        // AddBackward0 returns the incoming gradient itself for both operands, contiguous's
        // CloneBackward0 to its one.
        for (size_t i = 0; i < u.targets.size(); ++i) grads.push_back(u.slots[0]);
      } else {
        // Rope's backward makes its gradient contiguous first (the keys' comes back permuted).
        Ref contiguousGrad;
        if (op == "rope" && !u.slots[0]->contiguous()) {
          contiguousGrad = copy(u.slots[0], what + " gradient made contiguous");
        }
        // What a recomputation handed back dies as the node's apply returns; a broadcast bias's
        // gradient is summed after that, by the engine (validate_outputs), so with such tensors
        // it is allocated after them.
        int64_t late = 0;
        if (early == 0 && !u.unpacked.empty() && op == "addmm" && u.hasGrad.size() > 2 &&
            u.hasGrad[2] && u.gradSizes[2].size() == 1 && u.incomingReleasedAt == SIZE_MAX &&
            !u.backwardEvents.empty()) {
          late = numelOf(u.gradSizes[2]) * es_;
          if (u.backwardEvents[0] < late) late = 0;
          u.backwardEvents[0] -= late;
        }
        const size_t at = std::min(u.incomingReleasedAt, u.backwardEvents.size());
        applyEvents({u.backwardEvents.begin(), u.backwardEvents.begin() + at}, what + " backward");
        if (at < u.backwardEvents.size()) {
          u.slots.clear();
          u.saved.clear();
        }
        applyEvents({u.backwardEvents.begin() + at, u.backwardEvents.end()}, what + " backward");
        u.unpacked.clear();
        alloc(late, what + " bias gradient summed");
        contiguousGrad.reset();
        for (size_t i = 0; i < u.gradSizes.size(); ++i) {
          grads.push_back(u.hasGrad[i] ? adopt(u.gradSizes[i], what + " gradient") : nullptr);
          if (grads.back() && i < u.gradStrides.size() && !u.gradStrides[i].empty()) {
            grads.back()->strides = u.gradStrides[i];
          }
        }
      }
      break;
    }
  }
  u.unpacked.clear();
  u.slots.clear();  // the incoming gradients, after the node
  u.saved.clear();  // then what it saved (release_variables)
  release(u.extrasAfter, what + " saved tensors");
  deliver(u, grads);
}

void Replay::backward() {
  // Only what the output's gradient reaches runs; dependencies count those units' edges.
  const auto [root, slot] = gradOf_.at(g_.output);
  std::vector<Unit*> stack = {root};
  root->reachable = true;
  while (!stack.empty()) {
    Unit* u = stack.back();
    stack.pop_back();
    for (const auto& [to, k] : u->targets) {
      if (!to) continue;
      ++to->deps;
      if (!to->reachable) {
        to->reachable = true;
        stack.push_back(to);
      }
    }
  }
  root->slots[slot] = seed_;
  if (root->deps == 0) ready_.push(root);
  while (!ready_.empty()) {
    Unit* u = ready_.top();
    ready_.pop();
    runUnit(*u);
  }
  for (const auto& u : units_) {
    if (u->reachable && u->deps > 0) {
      throw PlanMemoryUnknown(u->name + ": the backward replay never ran it (a gradient it " +
                              "waits for does not come)");
    }
  }
}

int64_t Replay::run() {
  // What the executor holds: the parameters' pieces, the data slices, the gradient seed.
  for (size_t v = 0; v < g_.nodes.size(); ++v) {
    const GraphNode& n = g_.nodes[v];
    const Candidate& cand = m_.candidates(static_cast<int>(v))[choice_[v]];
    for (size_t i = 0; i < n.args.size(); ++i) {
      const std::string& a = n.args[i];
      const Dims sizes = localSizes(g_.valueShape(a), cand.storedLayout(i));
      if (g_.isInput(a)) {
        // Token ids are int64 (an embedding's input); other data the case's type.
        const bool ids = n.shape.op == "embedding" && i == 0;
        data_[{static_cast<int>(v), i}] = held(sizes, ids ? 8 : 0);
      } else if (g_.isParameter(a) && !params_.count(a)) {
        params_[a] = held(sizes);
        Unit* leaf = newUnit(Unit::kLeaf, static_cast<int>(v), a);
        leaf->paramSizes = sizes;
        leaf->slots.resize(1);
        gradOf_[a] = {leaf, 0};
      }
      ++reads_[a];
    }
  }
  if (g_.isInput(g_.output) || g_.isParameter(g_.output) || !m_.valueLayout(g_.output, choice_)) {
    throw PlanMemoryUnknown("the graph's output " + g_.output +
                            " is not an operator's result a gradient flows through");
  }
  const Layout outLayout = *m_.valueLayout(g_.output, choice_);
  seed_ = held(localSizes(g_.valueShape(g_.output), outLayout));
  for (size_t v = 0; v < g_.nodes.size(); ++v) {
    forwardNode(static_cast<int>(v));
    if (liveAfterForward) liveAfterForward->push_back(held_ + current_);
    if (log_) log_->push_back({0, "after " + g_.nodes[v].name + " @" + std::to_string(current_)});
  }
  if (!gradOf_.count(g_.output)) {
    throw PlanMemoryUnknown("no gradient flows through the graph's output " + g_.output);
  }
  output_ = values_.at(g_.output);
  values_.clear();
  forwardRunners_.clear();
  backward();
  if (log_) {
    // The step begins by dropping the previous step's results (the output, the parameters'
    // gradients): the trace's first lines, which the replay's peak does not depend on.
    std::set<const Storage*> results = {output_->storage.get()};
    for (const auto& [name, gr] : leafGrads_) results.insert(gr->storage.get());
    int64_t bytes = 0;
    for (const Storage* st : results) bytes += st->bytes;
    log_->insert(log_->begin(), {-bytes, "the previous step's results"});
  }
  return peak_;
}

}  // namespace

void recomputeClosure(const reference::Graph& g, const std::vector<bool>& save,
                      const std::vector<int>& region, std::vector<bool>& needed) {
  for (size_t v = needed.size(); v-- > 0;) {
    if (!needed[v]) continue;
    for (const auto& a : g.nodes[v].args) {
      const int q = g.producer(a).first;
      if (q >= 0 && region[static_cast<size_t>(q)] == region[v] && !save[static_cast<size_t>(q)]) {
        needed[static_cast<size_t>(q)] = true;
      }
    }
  }
}

bool savesOperand(const ResolvedOp& r, size_t i, const std::vector<bool>& grads) {
  const std::string& op = r.shape.op;
  const auto other = [&](size_t j) { return j < grads.size() && grads[j]; };
  if (op == "addmm" || op == "mm") return i == 0 ? other(1) : i == 1 && other(0);
  // What LibTorch 1.13's nodes save of a parameter operand counts only where it is a gathered
  // copy (ZeRO-3 storage), not the parameter itself: EmbeddingBackward0 saves the weight (2.x's
  // only its size: a gathered table goes after the lookup), RmsNorm its weight,
  // NativeLayerNormBackward0 its weight and bias.
#if SB_TORCH_VERSION_NUM >= 200
  if (op == "embedding") return false;
#else
  if (op == "embedding") return i == 1 && other(1);
#endif
  if (op == "rms_norm") return i <= 1;
  if (op == "bmm" || op == "matmul" || op == "mul") return other(1 - i);
  if (op == "gelu" || op == "silu") return i == 0;
  if (op == "layer_norm") {
    if (i >= 1) return true;  // weight and bias (SplitNorm: its weight)
    return r.statAxes.empty() && r.spec.variant != "hidden";
  }
  if (op == "conv2d") return i < 2;
  // NativeBatchNormBackward0 its input and weight; SplitNorm (a batch split's synchronised
  // statistics) its weight, and its own normalised copy of the input (the rule's).
  if (op == "batch_norm") return i == 1 || (i == 0 && r.spec.variant != "sync");
  if (op == "max_pool2d" || op == "avg_pool2d") return i == 0;
  return false;
}

int64_t replayPlanStep(const ShardingModel& model, const std::vector<int>& choice,
                       const std::vector<PlanEdge>& edges, harness::RankContext& ctx,
                       at::ScalarType dtype, std::vector<PlanMemoryEvent>* log, bool freeEarly,
                       int64_t* heldBytes, const RecomputePolicy* recompute,
                       std::vector<int64_t>* liveAfterForward) {
  Replay r(model, choice, edges, ctx, dtype, log);
  r.freeEarly = freeEarly;
  r.liveAfterForward = liveAfterForward;
  r.recompute = recompute;
  const int64_t peak = r.run();
  if (heldBytes) *heldBytes = r.heldBytes();
  r.stopLogging();  // what the replay still holds (the results) the executor keeps
  return peak;
}

}  // namespace sb::strategies::autoshard
