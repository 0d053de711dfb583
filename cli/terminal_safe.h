#pragma once

// What stratbench prints is shown, never acted on: a path, a value or a name quoted in a line
// ("results: o<ESC>]0;PWNED<BEL>...", "--history: leaving out ...") may hold what a terminal
// acts on (ESC sequences, BEL ending an OSC link, C1 controls, text-direction overrides). Error
// messages escaped them one by one (errorText); this escapes every line written to std::cout
// and std::cerr the same way (harness/hidden_text.h escapeHidden: "\u001b"), whatever prints
// it. Line breaks and tabs pass; JSON printed through it stays JSON ("\u001b" is the same
// character there). Header-only and LibTorch-free: the front (cli/front.cpp) and the core
// (cli/main.cpp) both install it first thing. The live progress line's own "\r\033[K" is
// written to C's stderr directly, past it (harness/run/progress.cpp, cli/common.cpp).

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <streambuf>
#include <string>

#include "harness/hidden_text.h"

namespace sb::cli {

class TerminalSafeBuf final : public std::streambuf {
 public:
  explicit TerminalSafeBuf(std::streambuf* out) : out_(out) {}

 protected:
  int_type overflow(int_type c) override {
    if (traits_type::eq_int_type(c, traits_type::eof())) return traits_type::not_eof(c);
    line_ += traits_type::to_char_type(c);
    if (c == '\n' || line_.size() >= 4096) flushLine();
    return c;
  }
  std::streamsize xsputn(const char* s, std::streamsize n) override {
    for (std::streamsize i = 0; i < n; ++i) overflow(traits_type::to_int_type(s[i]));
    return n;
  }
  int sync() override {
    flushLine();
    return out_->pubsync();
  }

 private:
  void flushLine() {
    if (line_.empty()) return;
    // A cut inside a UTF-8 character (a line past 4 KiB, a flush mid-character) leaves its bytes
    // as they are: escapeHidden decodes whole characters only.
    const std::string shown = harness::escapeHidden(line_, harness::TextKind::kText);
    out_->sputn(shown.data(), static_cast<std::streamsize>(shown.size()));
    line_.clear();
  }

  std::streambuf* out_;
  std::string line_;
};

// Installs the filter on std::cout and std::cerr for the life of the process, once. The buffers
// are never destroyed: the streams are flushed at exit after every static object is gone.
inline void installTerminalSafeOutput() {
  static const bool installed = [] {
    std::cout.rdbuf(new TerminalSafeBuf(std::cout.rdbuf()));
    std::cerr.rdbuf(new TerminalSafeBuf(std::cerr.rdbuf()));
    return true;
  }();
  (void)installed;
}

// Paths and values given are written into JSON (a run's records, a plan, a report), which holds
// UTF-8 only: bytes that are not (a path from another locale) aborted a run after it had taken
// its folder's lock. False, having said which argument, where one is not UTF-8 text.
inline bool argumentsAreUtf8(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const int64_t at = harness::firstInvalidUtf8(arg);
    if (at < 0) continue;
    char hex[8];
    std::snprintf(hex, sizeof hex, "0x%02x", static_cast<unsigned char>(arg[at]));
    std::cerr << "stratbench: argument " << i << " ('" << arg.substr(0, std::min<int64_t>(at, 200))
              << "...') is not UTF-8 text (byte " << hex << " at " << at
              << "): stratbench writes paths and values into JSON, which holds UTF-8 only; "
                 "rename the file or folder\n";
    return false;
  }
  return true;
}

}  // namespace sb::cli
