#pragma once

#include <stdexcept>
#include <string>
#include <vector>

#include "harness/case.h"
#include "harness/error.h"

namespace sb::harness {

// A suite file (suites/*.yaml):
//
//   suite: smoke                 # name, defaults to the file name
//   description: ...
//   defaults:                    # any case key; each case may override it
//     dtype: float32             # float32 | float64 | float16 | bfloat16
//     inputs: random             # random | exact (small integers: bitwise comparisons)
//     seed: 1234
//     repetitions: 10
//     min_time_s: 0.01           # per repetition
//     device: cpu
//   cases:
//     - name: linear-4x4x4x16
//       workload: linear
//       shape: {input: [4, 4, 4, 16], out_features: 32, bias: true}
//       mesh: 2x2                # or [2, 2]
//       strategies: ["sharding/linear/.*"]   # ids or regular expressions over ids
struct Suite {
  std::string name;
  std::string description;
  std::string file;
  // `golden: FILE` (beside the suite file): its training cases' reference losses per step
  // (harness/run/golden.h); empty when the suite keeps none.
  std::string golden;
  std::vector<CaseSpec> cases;
};

// Parses and validates a suite file. Throws InputError naming the file, line and key.
Suite loadSuite(const std::string& path);
// Same, from text (`file` names it in messages).
Suite parseSuite(const std::string& text, const std::string& file);

}  // namespace sb::harness
