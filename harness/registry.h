#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "harness/strategy.h"

namespace sb::harness {

// Every strategy, by id. Filled before main() by the registrars at the bottom of each executor
// file (SB_REGISTER_STRATEGIES); a duplicate id is a hard error.
class StrategyRegistry {
 public:
  static StrategyRegistry& global();

  void add(std::unique_ptr<Strategy> strategy);
  const Strategy* find(const std::string& id) const;
  // In registration order: by file, then in the order each file lists them.
  std::vector<const Strategy*> all() const;
  // Those whose id matches `pattern` entirely (ECMAScript regex); throws on a bad pattern.
  std::vector<const Strategy*> matching(const std::string& pattern) const;

 private:
  std::vector<std::unique_ptr<Strategy>> strategies_;
};

// Registers what `make` returns when constructed; used through SB_REGISTER_STRATEGIES.
struct StrategyRegistrar {
  explicit StrategyRegistrar(const std::function<std::vector<std::unique_ptr<Strategy>>()>& make);
};

}  // namespace sb::harness

#define SB_CONCAT_INNER(a, b) a##b
#define SB_CONCAT(a, b) SB_CONCAT_INNER(a, b)
// Registers the strategies a function of type std::vector<std::unique_ptr<Strategy>>() returns.
#define SB_REGISTER_STRATEGIES(make_fn) \
  static const ::sb::harness::StrategyRegistrar SB_CONCAT(sbRegistrar_, __COUNTER__)(make_fn)
