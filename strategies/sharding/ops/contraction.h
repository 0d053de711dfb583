#pragma once

// What addmm (addmm.cpp) and conv2d (conv2d.cpp) share: the logical [M, K] x [K, N]
// strategies and the memory replay of a product whose pending sums are reduced before the
// bias is added.

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

}  // namespace sb::strategies
