#pragma once

// What reference/graph.cpp and reference/graph_models.cpp share, internal to reference/: the
// plain LibTorch models the graph workloads are checked against.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>

#include "reference/graph.h"

namespace sb::reference {

// The graph workload `workload` (gpt2, bert, mlp, llama) written as plain LibTorch, apart from
// its graph: parameters `p` and inputs `in` by the graph's names; `seed` seeds dropout.
at::Tensor graphModelRef(const std::string& workload, const GraphShape& s,
                         const std::map<std::string, at::Tensor>& p,
                         const std::map<std::string, at::Tensor>& in, uint64_t seed);

}  // namespace sb::reference
