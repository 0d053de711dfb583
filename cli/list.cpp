// `stratbench list`: the registered strategies (built-in and plugins') and the strategies
// generated per case, as a table or as JSON. One subcommand per file (cli/commands.h).

#include <algorithm>
#include <iomanip>
#include <iostream>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/common.h"
#include "cli/numbers.h"
#include "harness/id_pattern.h"
#include "harness/registry.h"
#include "harness/run/run_util.h"

namespace {

using sb::cli::kExitBadInput;
using sb::harness::StrategyRegistry;

int listStrategies(const std::string& family, const std::string& filter, bool json) {
  std::optional<sb::harness::IdPattern> re;
  if (!filter.empty()) {
    try {
      re.emplace(filter);
    } catch (const std::invalid_argument& e) {
      std::cerr << "stratbench: --filter: " << sb::harness::errorText(e) << "\n";
      return kExitBadInput;
    }
  }
  std::vector<const sb::harness::Strategy*> shown;
  for (const auto* s : StrategyRegistry::global().all()) {
    if (!family.empty() && family != sb::harness::familyName(s->family())) continue;
    if (re && !re->search(s->id())) continue;
    shown.push_back(s);
  }
  if (json) {
    nlohmann::json arr = nlohmann::json::array();
    for (const auto* s : shown) {
      nlohmann::json j = s->describe();
      j["id"] = s->id();
      j["name"] = s->displayName();
      j["family"] = sb::harness::familyName(s->family());
      j["origin"] = StrategyRegistry::global().originOf(s->id());
      nlohmann::json params = nlohmann::json::object();
      for (const auto& [k, v] : s->params()) params[k] = v;
      j["params"] = params;
      // The deliberate bugs `run --plant-fault ID=FAULT` builds it with (test only).
      j["planted_faults"] = s->plantableFaults();
      arr.push_back(j);
    }
    for (const auto& gen : StrategyRegistry::global().generators()) {
      if (!family.empty() && family != sb::harness::familyName(gen.family)) continue;
      if (re && !re->search(gen.idPattern)) continue;  // by its pattern: its ids come per case
      arr.push_back({{"id", gen.idPattern},
                     {"family", sb::harness::familyName(gen.family)},
                     {"generated", true},
                     {"origin", gen.origin},
                     {"name", gen.description}});
    }
    std::cout << arr.dump(2) << "\n";
    return 0;
  }
  size_t idWidth = 2;
  for (const auto* s : shown) idWidth = std::max(idWidth, s->id().size());
  std::cout << std::left << std::setw(idWidth) << "id"
            << "  " << std::setw(10) << "family"
            << "  name\n";
  for (const auto* s : shown) {
    std::cout << std::left << std::setw(idWidth) << s->id() << "  " << std::setw(10)
              << sb::harness::familyName(s->family()) << "  " << s->displayName();
    // Built-in strategies say nothing more; a plugin's name the library they came from.
    const std::string origin = StrategyRegistry::global().originOf(s->id());
    if (origin != "built-in") std::cout << "  [plugin " << origin << "]";
    // The deliberate bugs `run --plant-fault ID=FAULT` can build it with.
    std::string faults;
    for (const auto& f : s->plantableFaults()) faults += (faults.empty() ? "" : ", ") + f;
    if (!faults.empty()) std::cout << "  [faults: " << faults << "]";
    std::cout << "\n";
  }
  std::cout << shown.size() << " strategies\n";
  for (const auto& gen : StrategyRegistry::global().generators()) {
    if (!family.empty() && family != sb::harness::familyName(gen.family)) continue;
    if (re && !re->search(gen.idPattern)) continue;  // by its pattern: its ids come per case
    std::cout << "generated per case: " << gen.idPattern << " ("
              << sb::harness::familyName(gen.family) << "): " << gen.description;
    if (gen.origin != "built-in") std::cout << " [plugin " << gen.origin << "]";
    std::cout << "\n";
  }
  return 0;
}

}  // namespace

namespace sb::cli {

Command addList(CLI::App& app) {
  struct Args {
    std::string family, listFilter;
    bool json = false;
    std::vector<std::string> pluginPaths;
  };
  const auto a = std::make_shared<Args>();
  auto* list = app.add_subcommand("list", "List the registered strategies");
  std::string families;
  for (const auto& f : sb::harness::familyNames()) families += (families.empty() ? "" : ", ") + f;
  list->add_option("--family", a->family, "Only this family (" + families + ")")
      ->check(CLI::IsMember(sb::harness::familyNames()));
  list->add_option("--filter", a->listFilter, "Only ids matching this regular expression")
      ->check(sb::cli::nonEmpty("a regular expression (leave --filter out to list every id)"));
  list->add_flag("--json", a->json,
                 "Print JSON: id, name, family, origin, parameters, sharding sequences");
  list->add_option("--plugin", a->pluginPaths, kPluginHelp)->check(sb::cli::pathName());
  return {list, [a] {
            if (!loadPluginsOrSay(a->pluginPaths)) return kExitBadInput;
            return listStrategies(a->family, a->listFilter, a->json);
          }};
}

}  // namespace sb::cli
