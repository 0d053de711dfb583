// libFuzzer target: the noise-file reader of `report --noise` (reports/compare.h). Any file is
// a noise model or a ReportInputError naming the file; a model it accepts holds bands a
// calibration can produce (finite, in [0, 1e6) percent) and a positive factor.

#include <cmath>
#include <cstdint>
#include <string>

#include "ci/fuzz/input_file.h"
#include "reports/compare.h"
#include "reports/results_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = fuzzInputFile(data, size, ".noise.json");
  if (path.empty()) return 0;
  try {
    const auto m = sb::reports::readNoise(path);
    if (!(m.floorPct >= 0 && m.floorPct < 1e6) || !(m.factor > 0 && m.factor < 1e6)) {
      __builtin_trap();
    }
    for (const auto& [key, band] : m.byKey) {
      if (!(band.bandPct >= 0 && band.bandPct < 1e6) || !(band.spreadPct >= 0) || band.runs < 0) {
        __builtin_trap();
      }
    }
  } catch (const sb::reports::ReportInputError& e) {
    if (std::string(e.what()).find(path) == std::string::npos) __builtin_trap();  // names the file
  }
  return 0;
}
