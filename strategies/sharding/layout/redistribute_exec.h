#pragma once

// Running a redistribution plan on one rank's local tensor, with autograd, and the model of
// the memory it takes.
//
// Every step writes a fresh contiguous output and frees what it staged before returning, so
// its memory is a short, exact list of allocations:
//   slice, pad, partition   the output (O);
//   all_gather, reduce_scatter along dimension 0
//                           what the collective returns (O), plus the backend's scratch;
//   ... along another dimension, and all_to_all
//                           a send buffer in the collective's row order (I), what the collective
//                           returns (O) and its scratch, then, with the send buffer freed, the
//                           output (O) assembled from what arrived: peak max(I + O + s, 2 O);
//   all_reduce              a copy of the input to reduce in place (O), plus scratch;
//   a group of one          nothing: the step relabels the same tensor.
// The memory model replays that list per rank (RedistRunner::memory), with each backend's own
// scratch (Communicator::scratchBytes), so that the prediction is the tracker's measurement.

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

#include "harness/comm/rank_context.h"
#include "strategies/sharding/layout/redistribute.h"

namespace sb::harness {

// Deliberate bugs, for planted-fault tests: a reduce-scatter that sums over the group of the
// other mesh axes, and an all-to-all whose first split size is one element short (the next one
// element long), consistently on every rank so the collective completes with misplaced data.
enum class RedistFault { kNone, kReduceScatterWrongGroup, kAllToAllSplitOffByOne };

// The row-major position of mesh coordinates.
int64_t meshPosition(const std::vector<int64_t>& mesh, const std::vector<int64_t>& coords);

// Sends member j of `comm`'s group the part of `local` (which holds `mine` of the full tensor)
// that lies in `dest[j]`, and assembles this rank's new piece `outBox` from the parts of the
// members' pieces `src[i]` that lie in it: one all-to-all of flat blocks in member order. Any
// change of boxes between two layouts that tile the tensor is one such exchange (ShardedTensor's
// reshard and reshuffle, the planner's all_to_all step).
at::Tensor exchangeBoxes(const at::Tensor& local, const Box& mine, const std::vector<Box>& dest,
                         const std::vector<Box>& src, const Box& outBox, Communicator& comm,
                         RedistFault fault = RedistFault::kNone);

// One rank's runner of one plan. Holds references to the plan and context: both must outlive it
// and every backward through what it returned.
class RedistRunner {
 public:
  RedistRunner(const RedistGeometry& g, const RedistPlan& plan, RankContext& ctx,
               at::ScalarType dtype, RedistFault fault = RedistFault::kNone);

  // Autograd-aware: the forward runs the plan's steps; the backward runs their transposes in
  // reverse order on the gradient (laid out in the dual of the output's layout) and returns a
  // gradient laid out in the dual of the input's.
  at::Tensor operator()(const at::Tensor& local) const;
  // The plan's steps (forward) or transposed steps (backward) without autograd.
  at::Tensor run(const at::Tensor& local, bool backward) const;

  struct Memory {
    int64_t peak = 0;      // the largest live total during the steps
    int64_t live = 0;      // live total after the steps (the output included)
    int64_t outBytes = 0;  // the output's bytes; 0 when it is the input itself
  };
  // Replays the allocations of run(): `live` bytes are held when it starts, the input among
  // them (the caller keeps it).
  Memory memory(int64_t live, bool backward) const;

  const RedistPlan& plan() const { return plan_; }

 private:
  at::Tensor step(const at::Tensor& in, const Layout& before, const RedistStep& st) const;

  const RedistGeometry& g_;
  const RedistPlan& plan_;
  RankContext& ctx_;
  RedistFault fault_;
  std::vector<int64_t> coords_;
  int position_ = 0;
  at::ScalarType dtype_;
};

}  // namespace sb::harness
