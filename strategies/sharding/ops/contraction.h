#pragma once

// What addmm and mm (addmm.cpp), conv2d (conv2d.cpp) and bmm (matmul.cpp) share: the logical
// [M, K] x [K, N] strategies, the memory replay of a product whose pending sums are reduced
// before the bias is added, and that of a product without a bias.

#include <string>
#include <vector>

#include "strategies/sharding/ops/op_rule.h"

namespace sb::strategies {

// A [M, K] x [K, N] contraction with M, K, N split over the given axes: the logical strategy
// of a Linear, addmm or convolution, named "out = input x other" in logical [M, K] x [K, N]
// form.
struct MatmulSplit {
  std::string name;
  std::vector<int> m, k, n;
  std::vector<int> meshDims;
};

std::vector<MatmulSplit> linearSplits(bool withSingleAxisBatch);

// The product (with `columns` bytes of im2col columns, 0 for addmm), the bias added after the
// reduction, the backward (which recomputes the columns) and the gradient all-reduces.
void contractionReplay(MemoryReplay& m, int64_t columns);

// A product without a bias (bmm, matmul, mm): its output, the all-reduce of its pending sums
// (a copy and the backend's scratch, the local product going), then both operands' gradients
// and their all-reduces.
void productMemory(MemoryReplay& m);

}  // namespace sb::strategies
