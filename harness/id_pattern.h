#pragma once

// Regular expressions over strategy ids (a suite's `strategies` entries, `--filter`), matched
// by RE2: in time linear in the id's length whatever the pattern, and without recursion, so
// that no pattern can hang a run (`(.|.)*Z` backtracks forever in std::regex) or overflow the
// stack (a long pattern does in std::regex). RE2's syntax is ECMAScript's without
// backreferences and lookaround; a pattern that uses them is refused with RE2's reason.

#include <memory>
#include <string>

namespace re2 {
class RE2;
}

namespace sb::harness {

class IdPattern {
 public:
  // Longest pattern accepted, in bytes.
  static constexpr size_t kMaxLength = 1000;

  // Throws std::invalid_argument naming the pattern and what is wrong with it.
  explicit IdPattern(const std::string& pattern);
  ~IdPattern();
  IdPattern(IdPattern&&) noexcept;
  IdPattern& operator=(IdPattern&&) noexcept;

  bool fullMatch(const std::string& id) const;  // the whole id
  bool search(const std::string& id) const;     // anywhere in the id

 private:
  std::unique_ptr<re2::RE2> re_;
};

}  // namespace sb::harness
