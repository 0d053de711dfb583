// The runner's shared small helpers (see run_util.h).

#include "harness/run/run_util.h"

#include <sstream>

#include <c10/util/Exception.h>

namespace sb::harness {

std::string errorText(const std::exception& e) {
  if (auto* ce = dynamic_cast<const c10::Error*>(&e)) return ce->what_without_backtrace();
  return e.what();
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
