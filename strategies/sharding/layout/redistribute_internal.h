#pragma once

// Helpers of the redistribution planner (redistribute.cpp) that its anchors
// (redistribute_anchors.cpp) use too: shared by those two files only, not part of the layout
// library's API.

#include <vector>

#include "strategies/sharding/layout/placement.h"

namespace sb::harness {

// Axes neither sharding a dimension nor holding pending sums.
std::vector<int> replicatedAxes(const Layout& l, int meshNdim);

}  // namespace sb::harness
