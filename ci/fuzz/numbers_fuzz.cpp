// libFuzzer target: the command line's strict numbers (harness/cli/numbers.h). Property: a
// text a validator accepts is a number of its kind inside its range, and CLI11 converts it to
// that value; a text it refuses gets a message naming the text.

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "cli/numbers.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  {
    std::string t = text;
    const std::string err = sb::cli::wholeNumber(1, 100000, "repetitions")(t);
    if (err.empty()) {
      char* end = nullptr;
      const unsigned long long v = std::strtoull(text.c_str(), &end, 10);
      if (v < 1 || v > 100000 || text.find('-') != std::string::npos) __builtin_trap();
    }
  }
  {
    std::string t = text;
    const std::string err = sb::cli::realNumber(0, 3600, true, "seconds")(t);
    if (err.empty()) {
      const double v = std::strtod(text.c_str(), nullptr);
      if (!std::isfinite(v) || !(v > 0) || v > 3600) __builtin_trap();
    }
  }
  {
    std::string t = text;
    const std::string err = sb::cli::byteCount(1)(t);
    if (err.empty()) {
      const double v = std::strtod(text.c_str(), nullptr);
      if (!(v >= 1) || v > sb::cli::kMaxBytes || v != std::floor(v)) __builtin_trap();
      const auto bytes = static_cast<int64_t>(v);  // what the commands do with it
      if (bytes < 1) __builtin_trap();
    }
  }
  return 0;
}
