// libFuzzer target: the result-file reader of `report` (reports/results_file.h). Any file is
// rows or a ReportInputError naming it; rows it accepts hold values a run can produce.

#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>

#include "reports/results_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = "/tmp/stratbench-fuzz-" + std::to_string(getpid()) + ".csv";
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return 0;
  std::fwrite(data, 1, size, f);
  std::fclose(f);
  try {
    (void)sb::reports::readResults(path);
  } catch (const sb::reports::ReportInputError&) {
  }
  return 0;
}
