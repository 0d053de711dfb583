#pragma once

// reference/hidden_text.h's rules (what a name or a text must not hold) under harness's names,
// and the one terminal sequence stratbench writes itself.

#include <cstdio>

#include "reference/hidden_text.h"

namespace sb::harness {

using reference::codePointAt;
using reference::escapeHidden;
using reference::firstInvalidUtf8;
using reference::HiddenCharacter;
using reference::hiddenCharacter;
using reference::TextKind;

// The one terminal sequence stratbench writes itself: a live progress line's "return, clear to
// the end of the line", written to C's stderr directly, past the filter that escapes every ESC
// printed through std::cerr (cli/terminal_safe.h).
inline void clearTerminalLine() {
  std::fputs("\r\033[K", stderr);
  std::fflush(stderr);
}

}  // namespace sb::harness
