#pragma once

// JSON that a user writes (a --shape, a plan file, a cost profile) read strictly: a key given
// twice in one object is refused, as the suite reader refuses it, instead of the last one
// silently winning.

#include <cmath>
#include <cstdint>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace sb::reference {

// Parses `text`; throws nlohmann::json::parse_error for malformed JSON and
// std::invalid_argument ("key 'layers' is given twice") for a duplicate key.
inline nlohmann::json parseJsonNoDuplicates(const std::string& text) {
  std::vector<std::set<std::string>> keys;  // one set per open object
  return nlohmann::json::parse(
      text, [&](int, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
        using E = nlohmann::json::parse_event_t;
        if (event == E::object_start) {
          keys.emplace_back();
        } else if (event == E::object_end) {
          if (!keys.empty()) keys.pop_back();
        } else if (event == E::key && !keys.empty()) {
          const std::string key = parsed.get<std::string>();
          if (!keys.back().insert(key).second) {
            throw std::invalid_argument("key '" + key + "' is given twice");
          }
        }
        return true;
      });
}

// A whole number in [lo, hi] held by a JSON value, or nothing. An integer literal is compared
// as an integer (through a double, 2^62 + 511 reads as 2^62 and passes a range that ends
// there); a literal with a fraction or an exponent (4e6) is taken where a double holds it
// exactly (up to 2^53) and has no fraction (1.5 bytes is no number of bytes).
inline std::optional<int64_t> jsonWholeNumber(const nlohmann::json& v, int64_t lo, int64_t hi) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(INT64_MAX)) return std::nullopt;
    const auto x = static_cast<int64_t>(u);
    return x >= lo && x <= hi ? std::optional<int64_t>(x) : std::nullopt;
  }
  if (v.is_number_integer()) {
    const auto x = v.get<int64_t>();
    return x >= lo && x <= hi ? std::optional<int64_t>(x) : std::nullopt;
  }
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (!std::isfinite(d) || d != std::floor(d) || std::fabs(d) > 0x1p53) return std::nullopt;
    const auto x = static_cast<int64_t>(d);
    return x >= lo && x <= hi ? std::optional<int64_t>(x) : std::nullopt;
  }
  return std::nullopt;
}

}  // namespace sb::reference
