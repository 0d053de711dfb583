#include "harness/registry.h"

#include <optional>
#include <set>
#include <stdexcept>

#include <c10/util/Exception.h>

#include "harness/id_pattern.h"

namespace sb::harness {

const char* familyName(Family f) {
  switch (f) {
    case Family::kSharding:
      return "sharding";
    case Family::kChunking:
      return "chunking";
    case Family::kCheckpointing:
      return "checkpointing";
    case Family::kFsdp:
      return "fsdp";
    case Family::kPipeline:
      return "pipeline";
    case Family::kContextParallel:
      return "cp";
    case Family::kExpertParallel:
      return "moe";
    case Family::kComposed:
      return "compose";
  }
  TORCH_INTERNAL_ASSERT(false, "unknown family ", static_cast<int>(f));
}

const std::vector<std::string>& familyNames() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (Family f : {Family::kSharding, Family::kChunking, Family::kCheckpointing, Family::kFsdp,
                     Family::kPipeline, Family::kContextParallel, Family::kExpertParallel,
                     Family::kComposed}) {
      v.push_back(familyName(f));
    }
    return v;
  }();
  return names;
}

bool drawsRandomNumbers(const CaseSpec& c) {
  return c.shape.is_object() && c.shape.contains("random") && c.shape.at("random") == true;
}

Applicability applicabilityOf(const Strategy& s, const CaseSpec& c) {
  // A value malformed for this strategy is bad input wherever the case is of its kind, even
  // where it cannot run it (an `unsupported` row would hide the mistake under a pattern); a
  // case of another kind may mean the key for another strategy (`budget`, `axes`, `plan` are
  // several strategies' words), so there the strategy is only not applicable.
  try {
    s.checkParams(c);
  } catch (const InputError&) {
    std::optional<Applicability> a;
    try {
      a = s.applies(c);
    } catch (const std::exception&) {
    }
    if (a && a->kind == Applicability::Kind::kNotApplicable) return *a;
    throw;
  }
  if (drawsRandomNumbers(c) && !s.repeatsDraws(c)) {
    // Not applicable stays so (another workload's strategy); anything else is this.
    try {
      const Applicability a = s.applies(c);
      if (a.kind == Applicability::Kind::kNotApplicable) return a;
    } catch (const std::exception&) {
    }
    return Applicability::unsupported(
        "the model draws random numbers (shape key random: true: dropout in training), which "
        "only an executor running the module itself on the whole batch draws as the reference "
        "does (torch/checkpoint, torch/sac, torch/file on one rank); any other split or graph of "
        "the step draws other numbers");
  }
  if (c.training.enabled() && !s.trainsSteps()) {
    // A strategy that cannot run the case at all says why itself (its reason names the model
    // or shape it cannot run, which trains or not); only one that could run it once is
    // turned away for the steps.
    const Applicability a = s.applies(c);
    if (a.kind != Applicability::Kind::kApplies) return a;
    return Applicability::unsupported(
        "runs one forward and backward; steps: " + std::to_string(c.training.steps) +
        " (optimizer steps) need a strategy that trains (sharding/fsdp/*, sharding/linear/* "
        "on a mesh, sharding/megatron/*, sharding/auto/*, sharding/plan, checkpointing/*)");
  }
  return s.applies(c);
}

Tolerance Strategy::tolerance(const std::string&, const CaseSpec& c, const at::Tensor&) const {
  if (c.inputs == reference::InputMode::kExact) {
    return Tolerance::bitwise("exact inputs: every summation order gives the same integers");
  }
  return Tolerance::defaultFor(c.dtype);
}

StrategyRegistry& StrategyRegistry::global() {
  static StrategyRegistry registry;
  return registry;
}

void StrategyRegistry::add(std::unique_ptr<Strategy> strategy) {
  TORCH_INTERNAL_ASSERT(strategy != nullptr);
  TORCH_INTERNAL_ASSERT(find(strategy->id()) == nullptr, "strategy id '", strategy->id(),
                        "' registered twice");
  byId_[strategy->id()] = strategy.get();
  strategies_.push_back(std::move(strategy));
}

const Strategy* StrategyRegistry::find(const std::string& id) const {
  auto it = byId_.find(id);
  return it == byId_.end() ? nullptr : it->second;
}

std::string StrategyRegistry::originOf(const std::string& id) const {
  auto it = origins_.find(id);
  return it == origins_.end() ? "built-in" : it->second;
}

void StrategyRegistry::holdRegistrations() {
  dropHeld();
  holding_ = true;
}

void StrategyRegistry::dropHeld() {
  holding_ = false;
  heldMakers_.clear();
  heldGenerators_.clear();
}

std::vector<std::string> StrategyRegistry::commitHeld(const std::string& origin) {
  std::vector<Maker> makers = std::move(heldMakers_);
  std::vector<GeneratorInfo> gens = std::move(heldGenerators_);
  dropHeld();
  std::vector<std::unique_ptr<Strategy>> made;
  std::set<std::string> seen;
  for (const auto& make : makers) {
    for (auto& s : make()) {
      if (s == nullptr)
        throw std::invalid_argument("a registration function returned a null strategy");
      if (find(s->id()) != nullptr) {
        throw std::invalid_argument("strategy id '" + s->id() + "' is already registered (" +
                                    originOf(s->id()) + ")");
      }
      if (!seen.insert(s->id()).second) {
        throw std::invalid_argument("strategy id '" + s->id() + "' is registered twice by it");
      }
      // (a plugin built against a later header may name a family this binary does not know)
      const int fam = static_cast<int>(s->family());
      if (fam < 0 || fam >= static_cast<int>(familyNames().size())) {
        throw std::invalid_argument("strategy '" + s->id() + "' names family " +
                                    std::to_string(fam) + ", which this stratbench does not " +
                                    "know (it knows " + std::to_string(familyNames().size()) +
                                    ", 0 to " + std::to_string(familyNames().size() - 1) + ")");
      }
      made.push_back(std::move(s));
    }
  }
  for (auto& g : gens) {
    const int fam = static_cast<int>(g.family);
    if (fam < 0 || fam >= static_cast<int>(familyNames().size())) {
      throw std::invalid_argument("generator '" + g.idPattern + "' names family " +
                                  std::to_string(fam) + ", which this stratbench does not know");
    }
  }
  std::vector<std::string> ids;
  for (auto& s : made) {
    ids.push_back(s->id());
    origins_[s->id()] = origin;
    add(std::move(s));
  }
  for (auto& g : gens) {
    g.origin = origin;
    addGenerator(std::move(g));
  }
  return ids;
}

void StrategyRegistry::addGenerator(GeneratorInfo info) {
  TORCH_INTERNAL_ASSERT(info.generate, "generator without a function");
  generators_.push_back(std::move(info));
}

void StrategyRegistry::expandFor(const CaseSpec& c) {
  for (const auto& g : generators_) {
    for (auto& s : g.generate(c)) {
      if (find(s->id()) != nullptr) continue;
      if (g.origin != "built-in") origins_[s->id()] = g.origin;
      add(std::move(s));
    }
  }
}

std::vector<const Strategy*> StrategyRegistry::all() const {
  std::vector<const Strategy*> out;
  for (const auto& s : strategies_) out.push_back(s.get());
  return out;
}

std::vector<const Strategy*> StrategyRegistry::matching(const std::string& pattern) const {
  std::optional<IdPattern> re;
  try {
    re.emplace(pattern);
  } catch (const std::invalid_argument& e) {
    TORCH_CHECK(false, e.what());
  }
  std::vector<const Strategy*> out;
  for (const auto& s : strategies_) {
    if (re->fullMatch(s->id())) out.push_back(s.get());
  }
  return out;
}

StrategyRegistrar::StrategyRegistrar(
    const std::function<std::vector<std::unique_ptr<Strategy>>()>& make) {
  auto& registry = StrategyRegistry::global();
  if (registry.holding()) {
    registry.hold(make);
    return;
  }
  for (auto& s : make()) registry.add(std::move(s));
}

StrategyRegistrar::StrategyRegistrar(StrategyRegistry::GeneratorInfo generator) {
  auto& registry = StrategyRegistry::global();
  if (registry.holding()) {
    registry.hold(std::move(generator));
    return;
  }
  registry.addGenerator(std::move(generator));
}

}  // namespace sb::harness
