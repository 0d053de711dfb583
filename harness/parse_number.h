#pragma once

// Strict number parsing shared by the command line (harness/cli/numbers.h) and the suite
// reader (harness/suite.cpp): the whole text must be a number of the kind asked for. No
// LibTorch, no CLI11: the LibTorch-free front uses it too.

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>

namespace sb::harness {

// A whole number in [lo, hi] written with digits only (no sign, exponent, fraction or space).
inline bool parseWholeNumber(const std::string& text, uint64_t lo, uint64_t hi, uint64_t* out) {
  if (text.empty() || text.size() > 20) return false;
  for (char ch : text) {
    if (ch < '0' || ch > '9') return false;
  }
  errno = 0;
  const unsigned long long v = std::strtoull(text.c_str(), nullptr, 10);
  if (errno == ERANGE || v < lo || v > hi) return false;
  *out = v;
  return true;
}

// A finite decimal number (strtod's syntax without hex, inf, nan or spaces).
inline bool parseFiniteReal(const std::string& text, double* out) {
  if (text.empty() || text.size() > 64) return false;
  for (char ch : text) {
    const bool ok =
        (ch >= '0' && ch <= '9') || ch == '.' || ch == 'e' || ch == 'E' || ch == '+' || ch == '-';
    if (!ok) return false;
  }
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (end != text.c_str() + text.size() || errno == ERANGE || !std::isfinite(v)) return false;
  *out = v;
  return true;
}

}  // namespace sb::harness
