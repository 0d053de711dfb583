#pragma once

#include <cstdint>
#include <iosfwd>
#include <vector>

#include "harness/comm/world.h"
#include "harness/dist/cost_profile.h"

namespace sb::harness {

struct CalibrateOptions {
  // Sizes per collective in nccl-tests' convention (bytes of the all-reduce buffer, of the
  // all-gather output, of the reduce-scatter input, of the all-to-all send buffer).
  std::vector<int64_t> sizes{1 << 10, 1 << 12, 1 << 14, 1 << 16, 1 << 18, 1 << 20, 1 << 22};
  // Square float32 matmul sizes for the compute fit.
  std::vector<int64_t> gemmSizes{8, 32, 64, 128, 256};
};

// `stratbench calibrate`: on `world` (every process of the mesh calls it), times each
// collective at each size on every group of mesh axes (each axis alone, then all of them), the
// way nccl-tests does: a barrier, then a loop of the collective; the time of an iteration is
// the slowest rank's. Then a float32 matmul on every rank at once. Prints a table to `out`
// and returns the profile with its fits.
CostProfile calibrate(World& world, const CalibrateOptions& options, std::ostream& out);

}  // namespace sb::harness
