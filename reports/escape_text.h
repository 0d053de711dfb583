#pragma once

// The one loop under report.md's and report.html's escapes: text from users' suites and files
// with what a terminal acts on written as an escape first (hidden_text.h), then each character a
// renderer's table names written as its replacement.

#include <initializer_list>
#include <string>
#include <utility>

#include "harness/hidden_text.h"

namespace sb::reports {

using Replacements = std::initializer_list<std::pair<char, const char*>>;

inline std::string escapedText(const std::string& s, Replacements replacements) {
  std::string o;
  for (char c : harness::escapeHidden(s, harness::TextKind::kText)) {
    const char* with = nullptr;
    for (const auto& [from, to] : replacements) {
      if (c == from) with = to;
    }
    if (with) {
      o += with;
    } else {
      o += c;
    }
  }
  return o;
}

}  // namespace sb::reports
