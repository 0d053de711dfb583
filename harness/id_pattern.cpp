#include "harness/id_pattern.h"

#include <stdexcept>

#include <re2/re2.h>

namespace sb::harness {

IdPattern::IdPattern(const std::string& pattern) {
  if (pattern.size() > kMaxLength) {
    throw std::invalid_argument("the pattern is " + std::to_string(pattern.size()) +
                                " bytes long; at most " + std::to_string(kMaxLength));
  }
  RE2::Options options;
  options.set_log_errors(false);
  options.set_max_mem(int64_t{8} << 20);  // the compiled program, bounded
  re_ = std::make_unique<re2::RE2>(pattern, options);
  if (!re_->ok()) {
    throw std::invalid_argument("'" + pattern + "' is not a valid regular expression: " +
                                re_->error() + " (RE2 syntax: no backreferences or lookaround)");
  }
}

IdPattern::~IdPattern() = default;
IdPattern::IdPattern(IdPattern&&) noexcept = default;
IdPattern& IdPattern::operator=(IdPattern&&) noexcept = default;

bool IdPattern::fullMatch(const std::string& id) const { return RE2::FullMatch(id, *re_); }
bool IdPattern::search(const std::string& id) const { return RE2::PartialMatch(id, *re_); }

}  // namespace sb::harness
