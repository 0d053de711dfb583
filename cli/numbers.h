#pragma once

// Strict numbers on the command line: CLI11 validators that read the whole text as a number of
// the kind asked for and check it against a range, before CLI11 converts it. CLI11's own checks
// accept what its conversion accepts: "nan" passes PositiveNumber (every comparison with NaN is
// false), "-5" becomes 18446744073709551611 in a uint64_t, "1e30" wraps in an int64_t. Here
// each of those is exit 2 with a message naming the option, the value and the range, e.g.
// "--min-time: expected a number of seconds in (0, 3600], got 'nan'".

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <sstream>
#include <string>

#include <CLI/CLI.hpp>

#include "harness/parse_number.h"

namespace sb::cli {

// Largest byte count an option takes: 2^62, so that sums of a few stay inside int64_t.
inline constexpr double kMaxBytes = 4611686018427387904.0;

namespace detail {

inline std::string shortNumber(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

}  // namespace detail

// A path the user names (a file or folder to read or write): an empty one is refused, not taken
// as the default (`--out "$DIR"` with DIR unset wrote where the default goes).
inline CLI::Validator pathName() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        return text.empty() ? "expected a path, got an empty string (an unset variable?)"
                            : std::string();
      },
      "PATH");
}

// A value that must say something (a pattern, a policy, a host list): an empty one is refused,
// not taken as "everything" or "the default" (`--filter "$F"` with F unset ran every strategy).
inline CLI::Validator nonEmpty(const std::string& what) {
  return CLI::Validator(
      [what](std::string& text) -> std::string {
        return text.empty() ? "expected " + what + ", got an empty string (an unset variable?)"
                            : std::string();
      },
      "TEXT");
}

// A whole number in [lo, hi], digits only (no sign, exponent or fraction); `what` names it in
// the message ("repetitions", "ranks").
inline CLI::Validator wholeNumber(uint64_t lo, uint64_t hi, const std::string& what) {
  const std::string expected = "expected a whole number of " + what + " from " +
                               std::to_string(lo) + " to " + std::to_string(hi);
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        uint64_t v = 0;
        if (!harness::parseWholeNumber(text, lo, hi, &v)) return expected + ", got '" + text + "'";
        return std::string();
      },
      "INT in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
}

// A finite real number in [lo, hi], or (lo, hi] when `openLow`; `what` names its unit.
inline CLI::Validator realNumber(double lo, double hi, bool openLow, const std::string& what) {
  const std::string range = std::string(openLow ? "(" : "[") + detail::shortNumber(lo) + ", " +
                            detail::shortNumber(hi) + "]";
  const std::string expected = "expected a number of " + what + " in " + range;
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        double v = 0;
        if (!harness::parseFiniteReal(text, &v) || v > hi || v < lo || (openLow && v == lo)) {
          return expected + ", got '" + text + "'";
        }
        return std::string();
      },
      "NUMBER in " + range);
}

// A byte count in [lo, 2^62]: a whole number, written plainly or in scientific notation
// ("4096", "1e9", "1.5e9"); the option's variable may be a double, which then holds it exactly.
inline CLI::Validator byteCount(double lo, const std::string& what = "bytes") {
  const std::string expected = "expected a whole number of " + what + " from " +
                               detail::shortNumber(lo) + " to 2^62 (" +
                               detail::shortNumber(kMaxBytes) + ")";
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        double v = 0;
        if (!harness::parseFiniteReal(text, &v) || v < lo || v > kMaxBytes || v != std::floor(v)) {
          return expected + ", got '" + text + "'";
        }
        return std::string();
      },
      "BYTES");
}

}  // namespace sb::cli
