// The replay of one rank's step through a sharding plan (plan_memory.h): the forward as the
// plan executor walks it, the backward as LibTorch's autograd engine orders it.
//
// Cut along the replay's two halves: the types and the Replay class in plan_memory_replay.h,
// the forward and the step here, the backward in plan_memory_backward.cpp.

#include "strategies/sharding/auto/plan_memory_replay.h"

namespace sb::strategies::autoshard {
namespace replay {

Storage::~Storage() {
  if (sim) sim->release(bytes, "free " + what);
}

namespace {

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

bool savesOutput(const std::string& op) { return op == "softmax" || op == "relu"; }
bool isView(const std::string& op) {
  return op == "view" || op == "reshape" || op == "permute" || op == "transpose";
}

}  // namespace

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

}  // namespace replay

using replay::Replay;

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
