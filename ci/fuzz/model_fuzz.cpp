// libFuzzer target: the checks every model file passes before LibTorch's loader opens it
// (reference/torchscript/export.h's checkModelFile: a regular file, and a zip's central
// directory read for records that would inflate out of all proportion). Any bytes return or
// throw an ImportError naming the file; the directory's offsets and sizes come from the
// input, so AddressSanitizer watches every read of them.

#include <cstdint>
#include <string>

#include "ci/fuzz/input_file.h"
#include "reference/torchscript/export.h"
#include "reference/torchscript/import.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = fuzzInputFile(data, size, ".pt");
  if (path.empty()) return 0;
  try {
    sb::reference::torchscript::checkModelFile(path);
  } catch (const sb::reference::torchscript::ImportError& e) {
    if (std::string(e.what()).find(path) == std::string::npos) __builtin_trap();  // names the file
  }
  return 0;
}
