// The FSDP executor's memory model (fsdp_executor.h): what a step's peak per rank is, to the
// byte, from the profile pass's marks and FSDP's own allocations.

#include <ATen/ATen.h>

#include <algorithm>

#include "harness/measure/update_profile.h"
#include "strategies/sharding/fsdp/fsdp_executor.h"

namespace sb::strategies::fsdp {

using harness::Collective;
using harness::RankContext;

// The memory model. A step's peak is predicted from two parts:
//  - what the forward and backward of this rank's batch allocate besides the parameters
//    (activations, what autograd saves, kernel temporaries, activation gradients): LibTorch's
//    to allocate, so measured, once in prepare, by a profile pass on whole parameters with no
//    communication and nothing freed that FSDP frees, at each point where FSDP acts (a unit
//    gathered, resharded, gathered again, a gradient ready to reduce, the backward's end);
//  - what FSDP holds, modelled from the shapes: the parameters, shards and optimizer state; a
//    unit's whole parameters from its gather to its reshard after the forward and from the
//    gather before its backward to its last gradient's reduce-scatter; each gradient's
//    contiguous copy and its shard; and every collective's scratch as the Communicator
//    allocates it (Communicator::scratchBytes); the update's temporaries and state as
//    harness::profileUpdate measures them on the shards' shapes.
// The two are added at every mark, and a unit left gathered, a gradient kept whole, a shard
// copied breaks the sum.
void FsdpExecutor::modelMemory(RankContext& ctx) {
  const int n = static_cast<int>(names_.size());
  const int64_t es = static_cast<int64_t>(c10::elementSize(case_.dtype));
  // In the case's dtype (the shards, their gradients and state), and in the parameter dtype
  // (what is gathered: the same where there is no mixed precision).
  const int64_t pes = static_cast<int64_t>(c10::elementSize(paramDtype_));
  std::vector<int64_t> fullB(n), shardB(n), maxShardB(n), pFullB(n), pShardB(n), pMaxShardB(n);
  for (int i = 0; i < n; ++i) {
    const int64_t rowB = rowElems(sizes_[i]) * es;
    fullB[i] = numel(sizes_[i]) * es;
    shardB[i] = shardRows_[i].second * rowB;
    maxShardB[i] = rows_[i].front() * rowB;  // torch.chunk's first part is the largest
    pFullB[i] = fullB[i] / es * pes;
    pShardB[i] = shardB[i] / es * pes;
    pMaxShardB[i] = maxShardB[i] / es * pes;
  }
  auto& world = ctx.world();
  auto& sc = shardComm();
  int64_t peak = 0;
  const auto at = [&peak](int64_t v) { peak = std::max(peak, v); };

  // The pass: the profile's live bytes plus FSDP's parameter memory (`overlay`) at each mark.
  int64_t overlay = 0, live = 0;
  std::vector<bool> gathered(units_.names.size(), false);
  std::vector<int> pending(units_.names.size(), 0);
  for (int i = 0; i < n; ++i) ++pending[unitOf_[i]];
  const auto unitBytes = [&](int u) {
    int64_t b = 0;
    for (int i : unitParams_[u]) b += pFullB[i];
    return b;
  };
  std::vector<bool> everGathered(units_.names.size(), false);
  // Forward: each all-gather's output is the parameter. Before the backward: the storage comes
  // back, the all-gather's output is copied into it and let go. Mixed precision: the shard's
  // cast is held through its all-gather.
  const auto gatherAt = [&](int u, bool again) {
    for (int i : unitParams_[u]) {
      const int64_t cast = mixed() ? pShardB[i] : 0;
      at(live + pFullB[i] + (again ? pFullB[i] : 0) + cast +
         sc.scratchBytes(Collective::kAllGather, pShardB[i], pMaxShardB[i], paramDtype_,
                         pFullB[i]));
      live += pFullB[i];
      overlay += pFullB[i];
    }
    gathered[u] = everGathered[u] = true;
  };
  const int units = static_cast<int>(order_.size());
  for (const Mark& m : marks_) {
    at(m.peak + overlay);
    live = m.live + overlay;
    const int u = m.index;
    switch (m.kind) {
      case MarkKind::kGather:  // unit u's forward is next; prefetch: the next units' too
        if (!everGathered[u]) gatherAt(u, false);
        if (u == 0) break;
        for (int d = 1; d <= prefetch_ && orderPos_[u] + d < units; ++d) {
          const int next = order_[orderPos_[u] + d];
          if (!everGathered[next]) gatherAt(next, false);
        }
        break;
      case MarkKind::kRegather:  // unit u's backward is next; prefetch: the previous units'
        if (!gathered[u]) gatherAt(u, true);
        for (int d = 1; d <= prefetch_ && orderPos_[u] - d >= 0; ++d) {
          const int prev = order_[orderPos_[u] - d];
          if (!gathered[prev] && pending[prev] > 0) gatherAt(prev, true);
        }
        break;
      case MarkKind::kUnitEnd:
        overlay -= unitBytes(u);
        gathered[u] = false;
        break;
      case MarkKind::kGradReady: {
        const int i = m.index;
        const int64_t copy = mixed() || !m.contiguous ? fullB[i] : 0;
        at(live + copy + shardB[i] +
           sc.scratchBytes(Collective::kReduceScatter, shardB[i], maxShardB[i], case_.dtype));
        if (kind_ == Kind::kHsdp) {
          at(live + shardB[i] +
             ctx.group({0}).scratchBytes(Collective::kAllReduce, shardB[i], shardB[i],
                                         case_.dtype));
        }
        overlay += shardB[i];  // the shard's gradient, kept; the whole one let go as profiled
        const int owner = unitOf_[i];
        if (--pending[owner] == 0 && gathered[owner]) {
          overlay -= unitBytes(owner);
          gathered[owner] = false;
        }
        break;
      }
      case MarkKind::kBackwardEnd:  // the loss summed over the ranks
        at(live + es + world.scratchBytes(Collective::kAllReduce, es, es, case_.dtype));
        break;
      case MarkKind::kStart:
      case MarkKind::kDone:
        break;
    }
  }
  const int64_t passPeak = peak;
  const int64_t passEnd = live;  // after the pass: the gradients, whole or sharded

  // The update, measured on copies of what the optimizer steps.
  std::vector<std::pair<std::string, at::Tensor>> stepped;
  for (int i = 0; i < n; ++i) {
    at::Tensor p = initial_[i];
    if (shardsState(kind_) && !shardsParams(kind_)) {
      p = p.narrow(0, shardRows_[i].first, shardRows_[i].second);
    }
    stepped.emplace_back(names_[i], p);
  }
  const auto u =
      harness::profileUpdate(ctx.rank(), case_.training, stepped,
                             shardsState(kind_) ? std::vector<bool>(n, true) : std::vector<bool>{});

  // Every step: the pass, the gradients' reductions (ddp, zero1, zero2), the update, the
  // shards gathered back (zero1, zero2). The first step has no optimizer state; the others
  // have all of it.
  for (int k = 0; k < std::min(case_.training.steps, 2); ++k) {
    const int64_t state = k == 0 ? 0 : u.stateBytes;
    at(state + passPeak);
    live = state + passEnd;
    if (!shardsParams(kind_)) {
      for (int i = 0; i < n; ++i) {
        if (kind_ == Kind::kZero2) {
          at(live + shardB[i] +
             world.scratchBytes(Collective::kReduceScatter, shardB[i], maxShardB[i], case_.dtype));
          live += shardB[i] - fullB[i];
        } else if (fault_ == Fault::kReplicaOwnOrder) {
          // The fault's sum (memory and bytes as it runs, so that only the replica check can
          // fail it): every rank's gradient all-gathered, then added up in a copy.
          const int64_t parts = fullB[i] * layout_.world;
          at(live + parts +
             world.scratchBytes(Collective::kAllGather, fullB[i], fullB[i], case_.dtype));
          at(live + parts + fullB[i]);
        } else {
          at(live + world.scratchBytes(Collective::kAllReduce, fullB[i], fullB[i], case_.dtype));
          if (kind_ == Kind::kZero1) live += shardB[i];
        }
      }
    }
    at(live - state + u.peak);
    live += u.stateBytes - state;
    if (kind_ == Kind::kZero1 || kind_ == Kind::kZero2) {
      for (int i = 0; i < n; ++i) {
        at(live + fullB[i] +
           world.scratchBytes(Collective::kAllGather, shardB[i], maxShardB[i], case_.dtype,
                              fullB[i]));
      }
    }
  }
  stepPeak_ = peak;
  paramBytes_ = 0;
  for (int i = 0; i < n; ++i) {
    if (!shardsParams(kind_)) paramBytes_ += fullB[i];
    if (shardsState(kind_)) paramBytes_ += shardB[i];
  }
  memoryDetails_ = {{"memory_model",
                     {{"param_bytes", paramBytes_},
                      {"pass_peak_bytes", passPeak},
                      {"pass_end_bytes", passEnd},
                      {"optimizer_state_bytes", u.stateBytes},
                      {"update_peak_bytes", u.peak},
                      {"step_peak_bytes", stepPeak_},
                      {"marks", static_cast<int64_t>(marks_.size())}}}};
}

nlohmann::json FsdpExecutor::details() const {
  nlohmann::json d = memoryDetails_;
  d["memory_model"]["step_start_live_bytes"] = startLive_;
  d["memory_model"]["step_entry_live_bytes"] = entryLive_;
  if (sac_) sac::addRunDetails(d, *sac_, sacModel_, local_);
  return d;
}

std::optional<int64_t> FsdpExecutor::predictedPeakBytes() const {
  // Above what was live before the step made its parameters (measured there: the batch, the
  // initial parameters or shards); at least what the last step's training left when this one
  // began (the peak window opens before it is let go).
  return std::max(entryLive_, startLive_ + paramBytes_ + stepPeak_);
}

}  // namespace sb::strategies::fsdp
