// libFuzzer target: the golden-file reader of `run` with a suite's `golden:` (harness/run/
// golden.h). Any file is golden losses or an InputError naming the file; losses it accepts are
// finite, and every case it names has at least one step.

#include <cmath>
#include <cstdint>
#include <string>

#include "ci/fuzz/input_file.h"
#include "harness/error.h"
#include "harness/run/golden.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = fuzzInputFile(data, size, ".golden.csv");
  if (path.empty()) return 0;
  try {
    const auto g = sb::harness::readGolden(path);
    for (const auto& [name, steps] : g.cases) {
      if (steps.empty()) __builtin_trap();
      for (const auto& s : steps) {
        if (!std::isfinite(s.loss) || !std::isfinite(s.gradNorm)) __builtin_trap();
      }
    }
  } catch (const sb::harness::InputError& e) {
    if (std::string(e.what()).find(path) == std::string::npos) __builtin_trap();  // names the file
  }
  return 0;
}
