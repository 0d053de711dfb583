// libFuzzer target: the result-file reader of `report` (reports/results_file.h). Any file is
// rows or a ReportInputError naming it; rows it accepts hold values a run can produce.

#include <cmath>
#include <cstdint>
#include <string>

#include "ci/fuzz/input_file.h"
#include "reports/results_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = fuzzInputFile(data, size, ".csv");
  if (path.empty()) return 0;
  try {
    (void)sb::reports::readResults(path);
  } catch (const sb::reports::ReportInputError&) {
  }
  return 0;
}
