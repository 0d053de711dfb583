// The backward of the replay (plan_memory_replay.h): the units LibTorch's autograd engine runs,
// in its order (a node once every gradient of its outputs has arrived, the latest-created
// first), what each allocates and releases, a block's recomputation under selective
// checkpointing.

#include "strategies/sharding/auto/plan_memory_replay.h"

namespace sb::strategies::autoshard::replay {

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

}  // namespace sb::strategies::autoshard::replay
