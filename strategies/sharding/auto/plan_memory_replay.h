// The replay behind replayPlanStep (plan_memory.h), shared by its two files: plan_memory.cpp
// (the forward as the plan executor walks it, and the step) and plan_memory_backward.cpp (the
// backward as LibTorch's autograd engine orders it: its units, their order, what each
// allocates and releases). Internal to strategies/sharding/auto/.
#pragma once

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

namespace sb::strategies::autoshard::replay {

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

inline int64_t numelOf(const Dims& sizes) {
  return std::accumulate(sizes.begin(), sizes.end(), int64_t{1}, std::multiplies<>());
}

inline Dims contiguousStrides(const Dims& sizes) {
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

}  // namespace sb::strategies::autoshard::replay
