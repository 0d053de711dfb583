#pragma once

// What the operators' strategy generators share (op_specs_common.cpp): ColossalAI's spelling
// of layouts, its enumeration of dimension splits and the following operators' generator.
// Only the family files under strategies/sharding/ops/ include it.

#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "strategies/sharding/ops/op_strategies.h"

namespace sb::strategies {

// "S01" for the mesh axes {0, 1}, "R" for none.
std::string seq(const std::vector<int>& a);

// ColossalAI's sharding sequence of a layout, "[S0, R]": its dimensions only (a pending sum is
// not part of a ColossalAI sequence; its all-reduce is a communication action).
std::string colossalSeq(const harness::Layout& l);

// A layout from per-dimension axes and pending-sum axes.
harness::Layout L(std::vector<std::vector<int>> dims, std::vector<int> partial = {});

// The axis pairs of a 2-D mesh in ColossalAI's order: (0, 1) then (1, 0). A constant, not a
// vector: generators run while the registrars do (op_rule.h).
inline constexpr std::pair<int, int> kPairs[] = {{0, 1}, {1, 0}};

OpStrategySpec spec(const reference::OpShape& s, std::string name,
                    std::vector<harness::Layout> operands, std::vector<harness::Layout> outputs,
                    std::vector<int> meshDims);

// Every way to shard `dims` (a list of tensor dimensions) over a 2-D mesh as ColossalAI's
// enumerate_all_possible_{1,2}d_sharding does, and on a 1-D mesh, with the empty split last.
struct DimSplit {
  std::map<int, std::vector<int>> axes;
  std::vector<int> meshDims;
};
std::vector<DimSplit> enumerateSplits(const std::vector<int>& dims);

std::vector<std::vector<int>> dimsOf(const DimSplit& sp, int ndim);

std::string seqOf(const std::vector<std::vector<int>>& dims);

// A normalisation over the last dimension with `params` parameters of its size (layer_norm's
// weight and bias, rms_norm's weight): one strategy per split of the batch dimensions, the
// parameters replicated, named "S0R = S0R x R[ x R]" and, for ColossalAI's LayerNormGenerator,
// "[out] = [input] x [R]".
std::vector<OpStrategySpec> batchSplitNormSpecs(const reference::OpShape& s, int params);

// A following operator's outputs for an input laid out as `in`, and the strategy's names: the
// key (OpStrategySpec::name) and ColossalAI's name less its "_<index>" suffix; empty for
// ColossalAI's usual "[input] -> [output]".
struct FollowingOutputs {
  std::vector<harness::Layout> layouts;
  std::string name;
  std::string colossal = "";
};
// Following operators: one strategy per layout of the input (shards nested in mesh order, no
// pending sums), the output's layout following it as `outputs` says. `keepReducedWhole`: the
// operator's reduced dimension is never split (softmax, split).
//
// ColossalAI names a following operator's strategy after the predecessor's strategy it follows
// ("[S0, R] -> [S0, R]_1": the predecessor's strategy 1). A single operator's predecessor is
// taken to offer every layout of the input, in the order enumerated here (1-D mesh first, then
// those only a 2-D mesh has, each once); the suffix is the input layout's place in that list,
// counting the layouts that an operator keeping its reduced dimension whole skips, so that a
// strategy's name does not change with which others exist.
std::vector<OpStrategySpec> followingSpecs(
    const reference::OpShape& s, bool keepReducedWhole,
    const std::function<FollowingOutputs(const harness::Layout& in)>& outputs);
// The output laid out as the input, named "out = in" (ColossalAI: "[in] -> [out]_<index>").
FollowingOutputs sameLayout(const harness::Layout& in);

// The strategies of an operator on a mesh of `meshNdim` >= 3 axes, from its generator's
// strategies for 1-D and 2-D meshes (`specs`), as PyTorch DTensor's
// expand_to_full_mesh_op_strategy makes them: each mesh axis independently takes one of the
// operator's placements on a single axis, and a tensor dimension is sharded by the axes that
// shard it, in mesh order (the outer first); an output's pending sums are over the axes whose
// placement leaves them. An axis's placements: the generator's 1-D strategies, each axis of its
// 2-D strategies seen alone where that is not one of them (bmm's head and contraction splits),
// and replication; each once. A placement's variant (a hidden split's statistics, a vocabulary
// split, synchronised batch norm) is the composed strategy's; placements whose variants differ
// are not composed. Strategies that gather their input whole (view's, reshape's) are not
// expanded. Each strategy is named by its layouts, "S0RS2 = S0R x RS2 x S2" (outputs, then the
// operands), a view's by its input, "view(S01RS2)"; set "expanded".
std::vector<OpStrategySpec> expandToMesh(const std::vector<OpStrategySpec>& specs,
                                         const reference::OpShape& s, int meshNdim);

}  // namespace sb::strategies
