#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "harness/strategy.h"

namespace sb::harness {

// Every strategy, by id. Filled before main() by the registrars at the bottom of each executor
// file (SB_REGISTER_STRATEGIES), and by plugins (harness/plugin.h) as they are loaded. A
// duplicate id among the built-in strategies is a hard error; one from a plugin refuses the
// plugin (held registrations, below).
class StrategyRegistry {
 public:
  static StrategyRegistry& global();

  // Adds a built-in strategy; its id must be new.
  void add(std::unique_ptr<Strategy> strategy);
  const Strategy* find(const std::string& id) const;
  // Where `id` came from: "built-in", or the path of the plugin that registered it.
  std::string originOf(const std::string& id) const;
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
    std::string origin = "built-in";  // set when a plugin's generator is committed
  };
  void addGenerator(GeneratorInfo info);
  const std::vector<GeneratorInfo>& generators() const { return generators_; }
  // Registers what every generator makes for `c`.
  void expandFor(const CaseSpec& c);

  // Held registrations, for the plugin loader (harness/plugin_loader.h). While held, registrars
  // (a plugin's, running inside dlopen) queue their functions instead of calling them, so that
  // nothing of a plugin runs before the loader has checked the API version it was built
  // against. commitHeld() then makes and adds them all, or none: it throws
  // std::invalid_argument naming the first id that is already registered (and where from) or
  // that the plugin registers twice. dropHeld() forgets them.
  using Maker = std::function<std::vector<std::unique_ptr<Strategy>>()>;
  void holdRegistrations();
  bool holding() const { return holding_; }
  void hold(Maker make) { heldMakers_.push_back(std::move(make)); }
  void hold(GeneratorInfo generator) { heldGenerators_.push_back(std::move(generator)); }
  // Returns the ids added.
  std::vector<std::string> commitHeld(const std::string& origin);
  void dropHeld();

 private:
  std::vector<std::unique_ptr<Strategy>> strategies_;
  std::map<std::string, const Strategy*> byId_;
  std::map<std::string, std::string> origins_;  // ids that came from a plugin
  std::vector<GeneratorInfo> generators_;
  bool holding_ = false;
  std::vector<Maker> heldMakers_;
  std::vector<GeneratorInfo> heldGenerators_;
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
