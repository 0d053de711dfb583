#pragma once

// A model's graph (reference/graph.h: a graph workload, or a traced model's import) summed up
// for the degree search of composed parallelism (parallel_search.h): its units (the embedding,
// each repeated block, the head), each with its matmul flops, its parameters (cut by tp or
// whole), the activations it saves (inside tp regions or on the residual stream; its matmuls'
// outputs apart), its element-wise traffic, its tp collectives and its attention's keys and
// values. Nothing is allocated.
//
// The tp regions are Megatron's plan read off the graph: a matmul reading a parameter whose
// input is on the residual stream is column-parallel (its output, and everything computed from
// it, inside a region), one whose input is inside a region is row-parallel (its output back on
// the stream, a collective each way). Every node but the views saves its output for the
// backward (autograd saves an operator's inputs or outputs; each value counted once).

#include "reference/graph.h"
#include "strategies/sharding/compose/parallel_search.h"

namespace sb::strategies::compose {

// Throws std::invalid_argument when the graph has no repeated blocks or its sizes cannot be
// read (a traced model's heads from its attention's views).
ModelCosts modelCosts(const reference::Graph& g, int64_t elementBytes);

}  // namespace sb::strategies::compose
