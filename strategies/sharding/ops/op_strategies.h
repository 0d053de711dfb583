#pragma once

// Sharding strategies for single operators (workload "op", reference/ops.h), as ColossalAI's
// auto-parallel node handlers generate them, plus the splits it refuses and production systems
// run (a layer norm over a split hidden dimension, a vocabulary-split embedding, synchronised
// batch norm).
//
// A strategy is a layout per operand and per output (harness/placement.h). Every rank takes its
// box of each operand, runs the operator on its pieces, and communicates where the layouts
// require it; the rules are the operator's, the communication follows from them generically:
//   - an output with pending sums (a split contraction: addmm's K, a summed dimension that is
//     sharded, a vocabulary split) is all-reduced over those axes in the forward, identity in
//     the backward (ColossalAI's ALLREDUCE_FWD_IDENTITY_BWD), before any bias is added;
//   - an operand replicated over a mesh axis that shards something else of the operator (an
//     operand or the output) gets a gradient of partial sums there, all-reduced in the backward
//     (IDENTITY_FWD_ALLREDUCE_BWD; ColossalAI's gradient hook on parameters);
//   - statistics over a split dimension (layer norm over a split hidden dimension, batch norm
//     over a split batch) are all-reduced in the forward and their gradients in the backward.
// Results are compared on every rank's box against the reference: outputs, every input
// gradient and every parameter gradient.

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "harness/strategy.h"
#include "reference/ops.h"
#include "strategies/sharding/layout/placement.h"

namespace sb::strategies {

// One strategy of one operator, for operands of given ranks.
struct OpStrategySpec {
  std::string op;  // "bmm"
  // The strategy's key: its id is "sharding/op/<op>/" + compactName(name), stored plans and
  // suites name it by this, and a case's generator is searched for it (resolveOp). Written
  // before ColossalAI's names were, and kept so that ids stay stable: "S0RRR = S0RRR".
  std::string name;
  // ColossalAI's name, as its generator writes it ("[S0, R, R, R] = [S0, R, R, R]",
  // "Sb0Si1 = Sb0Si1 x Sb0", "[S0, R] -> [S0, R]_1"): what `stratbench list` shows. The suffix
  // of a following operator's name is the index of its input's layout among the layouts the
  // predecessor offers (op_specs_common.h, followingSpecs). Empty: the key is shown.
  std::string colossalName;
  // "colossalai", "beyond" for splits ColossalAI refuses, "expanded" for a mesh of 3 axes or more
  // (expandToMesh)
  std::string set = "colossalai";
  std::vector<std::string> operands;            // names, in the reference's order
  std::vector<harness::Layout> operandLayouts;  // never partial
  std::vector<harness::Layout> outputLayouts;   // pending sums are all-reduced in forward
  std::vector<int64_t> operandRanks;            // the shapes' ranks the layouts are for
  std::vector<int> meshDims;                    // mesh ranks the generator emits it for
  // bmm on a 2-D mesh with a trivial axis counts as 1-D, as ColossalAI's generator does: 0 for
  // other operators, otherwise the one axis that must have extent > 1 (the other being 1).
  int degenerateAxis = -1;
  bool meshMustBeFull = false;  // bmm's 2-D strategies: no axis of extent 1
  std::string variant;          // "", "hidden" (layer norm), "sync" (batch norm), "vocab"
  // For operators whose output layout depends on the shape (view): computed when applied.
  bool outputFromShape = false;
  // ColossalAI's "FULLY REPLICATED" strategies (view's where its shards cannot be kept,
  // reshape's always): the input, laid out as operandLayouts[0], is gathered whole before the
  // operator, which every rank then runs on the whole input (its output replicated). The
  // backward communicates nothing: every rank has the same gradient of the whole input and
  // keeps its box of it (ColossalAI's GATHER_FWD_SPLIT_BWD).
  bool gatherInput = false;
  // Tensors the operator updates but does not differentiate, with the layouts the generator
  // declares for them (batch norm's running_mean and running_var): listed with the operands'
  // sharding sequences.
  std::vector<std::pair<std::string, harness::Layout>> buffers;
};

// Every strategy of `op` for operands of the ranks of `shape`: its generator's, for 1-D and 2-D
// meshes, where `meshNdim` <= 2; on a mesh of more axes, their expansion to it (expandToMesh,
// op_specs_common.h: each axis takes one of the operator's single-axis placements).
// None on a mesh of more than kMaxExpandedAxes axes (an operator's P placements would make P^n).
inline constexpr int kMaxExpandedAxes = 3;
std::vector<OpStrategySpec> opStrategySpecs(const reference::OpShape& shape, int meshNdim = 2);

// A strategy resolved for one shape on one mesh: the generator's layouts for that shape and the
// communication they imply (the rules of the file comment).
struct ResolvedOp {
  OpStrategySpec spec;
  reference::OpShape shape;
  std::vector<harness::Layout> operands;      // never partial
  std::vector<harness::Layout> outputs;       // pending sums are all-reduced in the forward
  std::vector<std::vector<int>> gradPartial;  // per operand: axes its gradient is partial over
  std::vector<int> statAxes;  // layer norm (hidden), batch norm (sync): the statistics' group
  std::string problem;        // non-empty: it cannot run, naming the dimension

  // The outputs' layouts once the forward's all-reduces are done (pending sums replicated).
  std::vector<harness::Layout> reducedOutputs() const;
};
ResolvedOp resolveOp(const OpStrategySpec& spec, const reference::OpShape& shape,
                     const std::vector<int64_t>& mesh);
// Why `spec` is not one of the generator's strategies for `shape` on `mesh`, or cannot run
// there ("" when it can).
std::string opNotApplicable(const OpStrategySpec& spec, const reference::OpShape& shape,
                            const std::vector<int64_t>& mesh);
// One rank's forward of `r` on its local operands, with autograd: the operands' gradient
// all-reduces, the operator on the pieces and the forward's all-reduces. `seed` seeds dropout.
std::vector<at::Tensor> runOp(const ResolvedOp& r, harness::RankContext& ctx,
                              const std::vector<at::Tensor>& local, uint64_t seed,
                              const std::string& fault = "");
// What one rank of `r` communicates in a step, per group of mesh axes; its matmul flops
// (forward and backward); its other kernels' memory traffic.
std::vector<std::pair<std::vector<int>, harness::CommStats>> opCommByGroup(
    const ResolvedOp& r, const std::vector<int64_t>& mesh, int rank, at::ScalarType dtype);
// The same, each part with its phase (the forward's all-reduces of partial outputs and
// statistics and its gather; the backward's of partial gradients and statistics).
struct OpCommPart {
  std::vector<int> axes;
  bool backward = false;
  harness::CommStats comm;
};
std::vector<OpCommPart> opCommParts(const ResolvedOp& r, const std::vector<int64_t>& mesh, int rank,
                                    at::ScalarType dtype);
double opFlops(const ResolvedOp& r, const std::vector<int64_t>& mesh, int rank);
harness::LocalWork opLocalWork(const ResolvedOp& r, const std::vector<int64_t>& mesh, int rank,
                               at::ScalarType dtype);

std::unique_ptr<harness::Strategy> makeOpStrategy(const OpStrategySpec& spec,
                                                  const std::string& fault = "");

}  // namespace sb::strategies
