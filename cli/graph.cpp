// `stratbench graph`: a graph workload's nodes (reference/graph.h), as text or JSON. One
// subcommand per file (cli/commands.h).

#include <iomanip>
#include <iostream>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/common.h"
#include "harness/json_strict.h"
#include "reference/graph.h"

namespace {

using sb::cli::kExitBadInput;

// `graph`: a graph workload's nodes (shapes, arguments, layers), as text or JSON.
int graphMain(const std::string& workload, const std::string& shapeText, bool json) {
  try {
    // Strict: a key given twice is refused (the suite reader refuses it too), not the last kept.
    const auto g =
        sb::reference::buildGraph(workload, sb::harness::parseJsonNoDuplicates(shapeText));
    if (json) {
      std::cout << g.toJson().dump(2) << "\n";
      return 0;
    }
    std::cout << g.workload << ": " << g.nodes.size() << " nodes, " << g.parameters.size()
              << " parameters, output " << g.output << "\n";
    for (const auto& n : g.nodes) {
      std::cout << "  " << std::left << std::setw(24) << n.name << " " << n.shape.toString()
                << " <- ";
      for (size_t i = 0; i < n.args.size(); ++i) std::cout << (i ? ", " : "") << n.args[i];
      std::cout << "\n";
    }
    return 0;
  } catch (const nlohmann::json::exception& e) {
    std::cerr << "stratbench graph: --shape is not valid JSON: " << e.what() << "\n";
  } catch (const std::exception& e) {
    std::cerr << "stratbench graph: --shape: " << e.what() << "\n";
  }
  return kExitBadInput;
}

}  // namespace

namespace sb::cli {

Command addGraph(CLI::App& app) {
  struct Args {
    std::string graphWorkload = "gpt2", graphShape = "{}";
    bool graphJson = false;
  };
  const auto a = std::make_shared<Args>();
  auto* graphCmd = app.add_subcommand("graph", "Print a graph workload (gpt2, bert, mlp)");
  graphCmd->add_option("--workload", a->graphWorkload, "gpt2, bert or mlp")->capture_default_str();
  graphCmd->add_option("--shape", a->graphShape, "JSON, e.g. '{\"layers\": 2}'")
      ->capture_default_str();
  graphCmd->add_flag("--json", a->graphJson, "As JSON");
  return {graphCmd, [a] { return graphMain(a->graphWorkload, a->graphShape, a->graphJson); }};
}

}  // namespace sb::cli
