// The runner's shared small helpers (see run_util.h).

#include "harness/run/run_util.h"

#include <sstream>

#include <c10/util/Exception.h>

#include "harness/hidden_text.h"

namespace sb::harness {

std::string errorText(const std::exception& e) {
  const auto* ce = dynamic_cast<const c10::Error*>(&e);
  const std::string text = ce ? ce->what_without_backtrace() : e.what();
  constexpr size_t kHead = 3072, kTail = 1024;
  // What a terminal would act on (ESC, a direction override quoted from the input) shown as
  // an escape: the message is printed and written into results, which refuse them.
  if (text.size() <= kHead + kTail) return escapeHidden(text, TextKind::kText);
  // Cut between characters, never inside one: a message of broken UTF-8 is one no JSON writer
  // takes (the row's record would be lost).
  size_t head = kHead, tail = text.size() - kTail;
  while (head > 0 && (static_cast<unsigned char>(text[head]) & 0xC0) == 0x80) --head;
  while (tail < text.size() && (static_cast<unsigned char>(text[tail]) & 0xC0) == 0x80) ++tail;
  return escapeHidden(text.substr(0, head) + " ... (" + std::to_string(tail - head) +
                          " bytes left out) ... " + text.substr(tail),
                      TextKind::kText);
}

std::string shownValue(const std::string& value, size_t most) {
  if (value.size() <= most) return value;
  size_t head = most;
  while (head > 0 && (static_cast<unsigned char>(value[head]) & 0xC0) == 0x80) --head;
  return value.substr(0, head) + "... (" + std::to_string(value.size()) + " bytes)";
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
