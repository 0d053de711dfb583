// libFuzzer target: the suite reader (harness/suite.h). Any text is either a suite or an
// InputError; a suite it accepts has names that the result files can hold.

#include <cstdint>
#include <string>

#include "harness/run/suite.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const auto suite = sb::harness::parseSuite(text, "fuzz.yaml");
    for (const auto& c : suite.cases) {
      if (c.name.empty() || c.meshSize() < 1 || c.meshSize() > 64) __builtin_trap();
      for (char ch : c.name) {
        if (static_cast<unsigned char>(ch) < 0x20) __builtin_trap();
      }
      (void)c.params.dump();  // throws on text that is not UTF-8
    }
  } catch (const sb::harness::InputError&) {
  }
  return 0;
}
