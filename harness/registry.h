#pragma once

#include <functional>
#include <map>
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

  // A family whose strategies depend on the case, e.g. every ordered pair of a case's layouts
  // (`sharding/redistribute/<from>-><to>`): too many to register up front, so the generator
  // makes those a case selects from when the case is planned. A generated strategy stays
  // registered, and one generated again (the same id for another case) is the one already
  // there, so ids stay unique. A generator throws for malformed case parameters.
  using Generator = std::function<std::vector<std::unique_ptr<Strategy>>(const CaseSpec&)>;
  struct GeneratorInfo {
    std::string idPattern;  // "sharding/redistribute/<from>-><to>"
    Family family;
    std::string description;
    Generator generate;
  };
  void addGenerator(GeneratorInfo info);
  const std::vector<GeneratorInfo>& generators() const { return generators_; }
  // Registers what every generator makes for `c`.
  void expandFor(const CaseSpec& c);

 private:
  std::vector<std::unique_ptr<Strategy>> strategies_;
  std::map<std::string, const Strategy*> byId_;
  std::vector<GeneratorInfo> generators_;
};

// Registers what `make` returns when constructed; used through SB_REGISTER_STRATEGIES.
struct StrategyRegistrar {
  explicit StrategyRegistrar(const std::function<std::vector<std::unique_ptr<Strategy>>()>& make);
  explicit StrategyRegistrar(StrategyRegistry::GeneratorInfo generator);
};

}  // namespace sb::harness

#define SB_CONCAT_INNER(a, b) a##b
#define SB_CONCAT(a, b) SB_CONCAT_INNER(a, b)
// Registers the strategies a function of type std::vector<std::unique_ptr<Strategy>>() returns.
#define SB_REGISTER_STRATEGIES(make_fn) \
  static const ::sb::harness::StrategyRegistrar SB_CONCAT(sbRegistrar_, __COUNTER__)(make_fn)
// Registers a generator (StrategyRegistry::GeneratorInfo) of strategies made per case.
#define SB_REGISTER_STRATEGY_GENERATOR(info) \
  static const ::sb::harness::StrategyRegistrar SB_CONCAT(sbRegistrar_, __COUNTER__)(info)
