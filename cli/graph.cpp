// `stratbench graph`: a graph workload's nodes (reference/graph.h), as text or JSON; with
// --model, a traced model's imported graph and the table of its operators with and without a
// strategy set (as DTensor's op-coverage tool prints one). One subcommand per file
// (cli/commands.h).

#include <iomanip>
#include <iostream>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/common.h"
#include "harness/run/run_util.h"
#include "reference/graph.h"
#include "reference/json_strict.h"
#include "reference/torchscript/import.h"
#include "reference/torchscript/linearize.h"

namespace {

using sb::cli::kExitBadInput;
namespace ts = sb::reference::torchscript;

struct GraphArgs {
  std::string workload = "gpt2", shape = "{}";
  sb::cli::ModelOptions model;
  bool json = false, stages = false;
};

// The chain the checkpointing family runs the model as (reference/torchscript/linearize.h).
nlohmann::json stagesJson(const sb::reference::Graph& g,
                          const std::vector<ts::ChainStage>& stages) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& s : stages) {
    out.push_back({{"name", s.name},
                   {"nodes", s.nodes.size()},
                   {"input", s.input},
                   {"output", s.output},
                   {"output_shape", g.valueShape(s.output)}});
  }
  return out;
}

void printStages(const sb::reference::Graph& g, const std::vector<ts::ChainStage>& stages) {
  std::cout << "chain: " << stages.size()
            << " stages (cut where one activation alone crosses; checkpointing runs these)\n";
  for (size_t i = 0; i < stages.size(); ++i) {
    std::string dims;
    for (int64_t d : g.valueShape(stages[i].output))
      dims += (dims.empty() ? "" : "x") + std::to_string(d);
    std::cout << "  " << std::right << std::setw(3) << i << "  " << std::left << std::setw(28)
              << stages[i].name << std::right << std::setw(4) << stages[i].nodes.size()
              << " nodes -> " << stages[i].output << " [" << dims << "]\n";
  }
}

void printCoverage(const ts::ImportedModel& m) {
  int with = 0, without = 0;
  for (const auto& r : m.coverage) (r.strategies ? with : without) += r.count;
  std::cout << "operators: " << with << " with a strategy set, " << without
            << " without (run replicated)\n";
  std::cout << "  " << std::left << std::setw(32) << "aten operator" << std::setw(7) << "nodes"
            << std::setw(11) << "strategies"
            << "graph nodes\n";
  for (const auto& r : m.coverage) {
    std::cout << "  " << std::left << std::setw(32) << r.aten << std::setw(7) << r.count
              << std::setw(11) << (r.strategies ? "yes" : "NO") << r.mapped << "\n";
  }
  if (m.exported) {
    std::cout << "torch.export archive of PyTorch " << m.exportedBy << ": " << m.exportCheck
              << "\n";
  }
  std::cout << "imported in " << m.importSeconds << " s ("
            << (m.exported ? "the archive read in " : "torch::jit::load ") << m.loadSeconds << " s"
            << (m.exported ? ", checked in " + std::to_string(m.checkSeconds) + " s" : "") << ")\n";
}

// `graph`: a graph workload's nodes (shapes, arguments, layers), as text or JSON.
int graphMain(const GraphArgs& a) {
  const std::string who = "stratbench graph: ";
  try {
    nlohmann::json shape;
    std::string workload = a.workload;
    if (!a.model.file.empty()) {
      workload = "torchscript";
      shape = sb::cli::modelShape(a.model);
    } else {
      // Strict: a key given twice is refused (the suite reader refuses it too), not the last.
      shape = sb::reference::parseJsonNoDuplicates(a.shape);
    }
    const auto g = sb::reference::buildGraph(workload, shape);
    std::shared_ptr<const ts::ImportedModel> imported;
    if (workload == "torchscript") imported = ts::importModel(ts::ImportSpec::fromJson(shape));
    std::vector<ts::ChainStage> stages;
    if (a.stages) {
      if (!imported) {
        std::cerr << who << "--stages needs --model: the built-in chain networks are cut by hand "
                  << "(reference/chain_nets.h)\n";
        return kExitBadInput;
      }
      stages = ts::linearizeModel(*imported, false, ts::ChainInput::kFloatingOrIds);
    }
    if (a.json) {
      nlohmann::json j = g.toJson();
      if (imported) {
        nlohmann::json cov = nlohmann::json::array();
        for (const auto& r : imported->coverage) {
          cov.push_back({{"aten", r.aten},
                         {"nodes", r.count},
                         {"strategies", r.strategies},
                         {"graph_nodes", r.mapped}});
        }
        j["coverage"] = cov;
      }
      if (a.stages) j["stages"] = stagesJson(g, stages);
      std::cout << j.dump(2) << "\n";
      return 0;
    }
    std::cout << (a.model.file.empty() ? g.workload : a.model.file) << ": " << g.nodes.size()
              << " nodes, " << g.parameters.size() << " parameters, output " << g.output;
    if (g.shape.layers > 0 && imported) std::cout << ", " << g.shape.layers << " repeated blocks";
    std::cout << "\n";
    for (const auto& n : g.nodes) {
      std::cout << "  " << std::left << std::setw(24) << n.name << " " << n.shape.toString()
                << " <- ";
      for (size_t i = 0; i < n.args.size(); ++i) std::cout << (i ? ", " : "") << n.args[i];
      std::cout << "\n";
    }
    if (imported) printCoverage(*imported);
    if (a.stages) printStages(g, stages);
    return 0;
  } catch (const nlohmann::json::exception& e) {
    std::cerr << who << "--shape is not valid JSON: " << sb::harness::errorText(e) << "\n";
  } catch (const ts::ImportError& e) {
    std::cerr << who << sb::harness::errorText(e) << "\n";
  } catch (const std::exception& e) {
    std::cerr << who << (a.model.file.empty() ? "--shape: " : "") << sb::harness::errorText(e)
              << "\n";
  }
  return kExitBadInput;
}

}  // namespace

namespace sb::cli {

Command addGraph(CLI::App& app) {
  const auto a = std::make_shared<GraphArgs>();
  auto* graphCmd = app.add_subcommand(
      "graph",
      "Print a graph workload (gpt2, bert, llama, mlp), or a traced model's imported graph");
  graphCmd->add_option("--workload", a->workload, "gpt2, bert, llama or mlp")
      ->capture_default_str();
  graphCmd->add_option("--shape", a->shape, "JSON, e.g. '{\"layers\": 2}'")->capture_default_str();
  sb::cli::addModelOptions(graphCmd, a->model,
                           "A TorchScript file (torch.jit.trace(...).save): import it instead");
  graphCmd->add_flag("--json", a->json, "As JSON");
  graphCmd->add_flag("--stages", a->stages,
                     "With --model: the chain of stages checkpointing runs the model as");
  return {graphCmd, [a] { return graphMain(*a); }};
}

}  // namespace sb::cli
