// Planning a suite (see plan.h).

#include "harness/run/plan.h"

#include <algorithm>
#include <map>
#include <set>
#include <stdexcept>

#include "harness/comm/c10d_backend.h"
#include "harness/id_pattern.h"
#include "harness/measure/device.h"
#include "harness/registry.h"
#include "harness/run/predict.h"
#include "harness/run/run_util.h"
#include "harness/run/runner.h"

namespace sb::harness {

std::string deviceMissing(const CaseSpec& c) {
  std::string why;
  if (c.device == "cuda" && !cudaUsable(&why)) return "device cuda: " + why;
  return "";
}

std::vector<PlannedCase> planSuite(const Suite& suite, const RunOptions& options) {
  {
    const auto have = availableBackends();
    if (std::find(have.begin(), have.end(), options.backend) == have.end()) {
      std::string list;
      for (const auto& b : have) list += (list.empty() ? "" : ", ") + b;
      throw InputError("backend '" + options.backend + "' is not available in this build (" + list +
                       ")");
    }
    if (options.rankFault && options.backend == "threads") {
      throw InputError("--plant-rank-fault needs a multi-process backend (--backend gloo)");
    }
  }
  // --filter (strategy ids) and --case (case names): none, or a pattern, bad input naming the
  // option where it is not one.
  const auto pattern = [](const std::string& text, const char* option) {
    std::optional<IdPattern> p;
    if (text.empty()) return p;
    try {
      p.emplace(text);
    } catch (const std::invalid_argument& e) {
      throw InputError(std::string(option) + ": " + e.what());
    }
    return p;
  };
  const std::optional<IdPattern> filter = pattern(options.filter, "--filter");
  const std::optional<IdPattern> caseFilter = pattern(options.caseFilter, "--case");
  auto& registry = StrategyRegistry::global();
  std::vector<PlannedCase> plan;
  size_t selected = 0;
  for (CaseSpec c : suite.cases) {
    if (caseFilter && !caseFilter->search(c.name)) continue;
    const nlohmann::json userParams = c.params;  // before the runner adds its own
    if (options.repetitions) c.repetitions = *options.repetitions;
    if (options.seed) c.seed = *options.seed;
    if (options.minTimeSec) c.minTimeSec = *options.minTimeSec;
    c.backend = options.backend;
    // Strategies that price a plan they choose (auto-sharding) read the case's profile here.
    if (const CostProfile* p = profileFor(options, c); p && !c.params.contains("cost_profile")) {
      c.params["cost_profile"] = p->toJson();
    }
    if (options.worldSize && c.meshSize() != *options.worldSize) {
      throw InputError(c.where() + ": case '" + c.name + "' has mesh " + c.meshString() + " (" +
                       std::to_string(c.meshSize()) + " ranks) but the world size is " +
                       std::to_string(*options.worldSize));
    }
    try {
      registry.expandFor(c);
    } catch (const InputError&) {
      throw;
    } catch (const std::exception& e) {
      throw InputError(c.where() + ": case '" + c.name + "': " + errorText(e));
    }
    PlannedCase pc{c, {}};
    // A strategy's applicability; a parameter of the case that it reads and finds malformed is
    // bad input (InputError), named with the case.
    const auto applicability = [&](const Strategy& s) {
      try {
        return applicabilityOf(s, c);
      } catch (const InputError& e) {
        throw InputError(c.where() + ": case '" + c.name + "': strategy '" + s.id() +
                         "': " + e.what());
      }
    };
    std::vector<const Strategy*> chosen;
    for (const auto& pattern : c.strategies) {
      std::vector<const Strategy*> matched;
      if (const Strategy* exact = registry.find(pattern)) {
        // Named by id: the user asked for exactly this strategy on this case. One for another
        // kind of case (another workload, another mesh) is an error in the suite; one of the
        // right kind that cannot run this model or shape is an `unsupported` row saying why,
        // as it would be where a pattern selected it.
        const Applicability a = applicability(*exact);
        if (a.kind == Applicability::Kind::kNotApplicable) {
          throw InputError(c.where() + ": case '" + c.name + "': strategy '" + pattern +
                           "' cannot run it: " + a.reason);
        }
        matched.push_back(exact);
      } else {
        try {
          matched = registry.matching(pattern);
        } catch (const c10::Error& e) {
          throw InputError(c.where() + ": case '" + c.name + "': " + e.what_without_backtrace());
        }
        if (matched.empty()) {
          throw InputError(c.where() + ": case '" + c.name + "': '" + pattern +
                           "' is neither a strategy id nor a pattern matching one (see "
                           "`stratbench list`)");
        }
      }
      for (const Strategy* s : matched) {
        if (std::find(chosen.begin(), chosen.end(), s) == chosen.end()) chosen.push_back(s);
      }
    }
    // Each chosen strategy's applicability, once (its params checked first).
    std::vector<Applicability> applicable;
    for (const Strategy* s : chosen) applicable.push_back(applicability(*s));
    // A parameter that none of the case's strategies reads would be silently ignored (a
    // misspelt `budgt: 0.5` ran with no budget and passed): refused, naming the key. Only the
    // strategies of the case's kind count: a key that only a strategy of another kind reads
    // (`chunk` under `(pipeline|chunking)/.*` on an mlp_chain, which chunking does not run)
    // would be ignored as silently, its value never checked.
    {
      std::set<std::string> known;
      std::map<std::string, std::string> elsewhere;  // key -> a not-applicable reader, why
      for (size_t k = 0; k < chosen.size(); ++k) {
        const bool ofKind = applicable[k].kind != Applicability::Kind::kNotApplicable;
        for (const auto& key : chosen[k]->caseParams()) {
          if (ofKind) {
            known.insert(key);
          } else if (!elsewhere.count(key)) {
            elsewhere[key] = "'" + chosen[k]->id() +
                             "' reads it and cannot run this case: " + applicable[k].reason;
          }
        }
      }
      for (const auto& item : userParams.items()) {
        if (known.count(item.key())) continue;
        std::string list;
        for (const auto& k : known) list += (list.empty() ? "" : ", ") + k;
        const auto other = elsewhere.find(item.key());
        throw InputError(
            c.where() + ": case '" + c.name + "': params key '" + item.key() +
            "' is read by none of its strategies that run it (" +
            (known.empty() ? std::string("they read no parameters") : "they read: " + list) + ")" +
            (other == elsewhere.end() ? "" : "; " + other->second));
      }
    }
    for (size_t k = 0; k < chosen.size(); ++k) {
      const Strategy* s = chosen[k];
      if (filter && !filter->search(s->id())) continue;
      Applicability a = applicable[k];
      // Not applicable: another kind of case, which a pattern over several families selects
      // without meaning it (a named one was refused above).
      if (a.kind == Applicability::Kind::kNotApplicable) continue;
      pc.strategies.push_back({s, a, nullptr});
    }
    selected += pc.strategies.size();
    if (!pc.strategies.empty()) plan.push_back(std::move(pc));
  }
  for (const auto& [id, fault] : options.plantedFaults) {
    const auto faultsOf = [](const Strategy& st) {
      std::string can;
      for (const auto& f : st.plantableFaults()) can += (can.empty() ? "" : ", ") + f;
      return can.empty() ? std::string("none") : can;
    };
    // An id that holds '=' given without a fault splits at its own '=': name the whole id.
    if (const Strategy* whole = registry.find(id + "=" + fault)) {
      throw InputError("--plant-fault '" + id + "=" + fault + "': no fault given (expected " +
                       whole->id() + "=FAULT, FAULT one of: " + faultsOf(*whole) + ")");
    }
    const Strategy* s = registry.find(id);
    if (!s) throw InputError("--plant-fault: no strategy has the id '" + id + "'");
    std::shared_ptr<const Strategy> faulty = s->withPlantedFault(fault);
    if (!faulty) {
      throw InputError("--plant-fault: strategy '" + id + "' has no fault '" + fault +
                       "' (it has: " + faultsOf(*s) + ")");
    }
    bool used = false;
    for (auto& pc : plan) {
      for (auto& e : pc.strategies) {
        if (e.strategy == s) {
          e.owned = faulty;
          e.strategy = faulty.get();
          used = true;
        }
      }
    }
    if (!used) throw InputError("--plant-fault: strategy '" + id + "' runs in no case");
  }
  for (const auto& [id, fraction] : options.plantedSlowdowns) {
    bool used = false;
    for (const auto& pc : plan) {
      for (const auto& e : pc.strategies) used = used || e.strategy->id() == id;
    }
    if (!used) throw InputError("--plant-slowdown: strategy '" + id + "' runs in no case");
  }
  if (selected == 0) {
    throw InputError(suite.file + ": " +
                     (options.filter.empty()
                          ? std::string("no case selects a strategy that "
                                        "applies to it")
                          : "--filter '" + options.filter + "' selects no strategy of any case") +
                     (options.caseFilter.empty()
                          ? std::string()
                          : " (of the cases --case '" + options.caseFilter + "' selects)"));
  }
  // --trace: every level a row writes under it, checked before any row runs (a link or a file at
  // one left the run to go on without that row's traces, exit 0).
  if (!options.traceDir.empty()) {
    for (const auto& pc : plan) {
      for (const auto& e : pc.strategies) {
        std::string at = options.traceDir;
        for (const auto& level : traceLevels(pc.spec, e.strategy->id())) {
          at += "/" + level;
          const std::string why = traceLevelProblem(at);
          if (why == "not found") break;
          if (!why.empty()) throw InputError("--trace: " + at + why);
        }
      }
    }
  }
  return plan;
}

}  // namespace sb::harness
