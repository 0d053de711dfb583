#pragma once

// JSON that a user writes (a --shape, a plan file, a cost profile) read strictly: a key given
// twice in one object is refused, as the suite reader refuses it, instead of the last one
// silently winning.

#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace sb::harness {

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

}  // namespace sb::harness
