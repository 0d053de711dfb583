// The runner's shared small helpers (see run_util.h).

#include "harness/run/run_util.h"

#include <sstream>

#include <c10/util/Exception.h>

namespace sb::harness {

std::string errorText(const std::exception& e) {
  const auto* ce = dynamic_cast<const c10::Error*>(&e);
  const std::string text = ce ? ce->what_without_backtrace() : e.what();
  constexpr size_t kHead = 3072, kTail = 1024;
  if (text.size() <= kHead + kTail) return text;
  return text.substr(0, kHead) + " ... (" + std::to_string(text.size() - kHead - kTail) +
         " bytes left out) ... " + text.substr(text.size() - kTail);
}

std::string shownValue(const std::string& value, size_t most) {
  if (value.size() <= most) return value;
  return value.substr(0, most) + "... (" + std::to_string(value.size()) + " bytes)";
}
int64_t nowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string seconds(std::chrono::milliseconds ms) {
  std::ostringstream os;
  os << ms.count() / 1000.0 << " s";
  return os.str();
}

}  // namespace sb::harness
