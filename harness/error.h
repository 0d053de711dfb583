#pragma once
// The two errors a user's input or a case can raise, apart from our own bugs (which assert).

#include <stdexcept>

namespace sb::harness {

// Bad input from the user: a malformed file, an unknown name, an impossible request. The CLI
// turns it into exit code 2. The message names the file, line and key where there is one.
class InputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Thrown by prepare() when the case turns out to be one the strategy cannot run (e.g. no
// checkpoint schedule fits the budget): the row is `unsupported` with this message.
class UnsupportedCase : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace sb::harness
