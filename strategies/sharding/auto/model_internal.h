#pragma once

// What the files of the auto-sharding model (cost_model.cpp, liveness.cpp, program.cpp,
// algorithms.cpp) share and model.h does not show: the test of an all-replicated strategy, and
// the liveness walk that the peak, the liveness rows and the integer program's memory rows all
// read. Internal: not installed, not for users of model.h.

#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "strategies/sharding/auto/model.h"

namespace sb::strategies::autoshard {

// Whether every operand and output of `r` is replicated (cost_model.cpp).
bool allReplicated(const ResolvedOp& r);

// Bytes two nodes' candidates decide together: [candidate of u][candidate of v].
struct NodePair {
  int u = 0, v = 0;
  const std::vector<std::vector<double>>* bytes = nullptr;
};

// A memory row whose terms name nodes (bytes per candidate of the node), and pairs of nodes (a
// copy made by an edge's redistribution, which exists only where the two layouts differ).
struct NodeRow {
  std::string what;
  int layer = -1;
  std::vector<std::pair<int, const std::vector<double>*>> terms;
  std::vector<NodePair> pairs;
  // Of the terms, the node's own transient (a gathered parameter's copy, a scaled softmax's
  // input): live while it runs, gone once it ran.
  const std::vector<double>* transient = nullptr;
  int transientOf = -1;
};

// The liveness rows (model.h), each a sum of per-node, per-candidate bytes, handed to `sink`
// one at a time (only those whose node's layer `wants`): a graph of N nodes has 2N of them,
// each of O(N) terms.
void forEachLivenessRow(const ShardingModel& m, const std::map<std::string, int>& firstReader,
                        const std::function<bool(int layer)>& wants,
                        const std::function<void(const NodeRow&)>& sink);

}  // namespace sb::strategies::autoshard
