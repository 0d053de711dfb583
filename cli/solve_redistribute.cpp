// `stratbench solve redistribute`: the redistribution planner's plan between two layouts, beside
// the paths of its anchors, or its comparison with them over every pair of layouts
// (strategies/sharding/layout/redistribute.h, redistribute_anchors.h). This file only parses
// the arguments and prints. One subcommand per file (cli/commands.h).

#include <unistd.h>

#include <cstdint>
#include <iostream>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/common.h"
#include "cli/numbers.h"
#include "harness/case.h"
#include "harness/comm/mesh.h"
#include "harness/dist/cost_profile.h"
#include "harness/run/run_util.h"
#include "strategies/sharding/layout/placement.h"
#include "strategies/sharding/layout/redistribute.h"
#include "strategies/sharding/layout/redistribute_anchors.h"

namespace {

using sb::cli::kExitBadInput;

// `solve redistribute`: the planner's plan from one layout to another as JSON, with the paths
// ColossalAI's greedy walk and DTensor's axis-by-axis rules take beside it; or, with
// --compare-anchors, the comparison over every ordered pair of layouts (at most one partial
// axis). Exit 2 naming the value for a malformed shape, mesh, layout or profile.
int solveRedistribute(const std::string& shapeText, const std::string& meshText,
                      const std::string& fromText, const std::string& toText,
                      const std::string& profilePath, const std::string& objectiveText,
                      const std::string& dtypeText, bool compare, double timeLimit) {
  namespace h = sb::harness;
  h::RedistGeometry g;
  try {
    const auto shape = nlohmann::json::parse(shapeText);
    if (!shape.is_array() || shape.empty() || shape.size() > 8) {
      throw std::invalid_argument("must be a JSON list of 1 to 8 dimensions, e.g. [64, 32, 16]");
    }
    for (const auto& d : shape) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0 || d.get<int64_t>() > (int64_t{1} << 40)) {
        throw std::invalid_argument("dimension " + d.dump() + " is not an integer from 0 to 2^40");
      }
      g.shape.push_back(d.get<int64_t>());
    }
    // Every byte count below is an int64: the whole tensor must fit one, with room to spare.
    long double bytes = 8;
    for (int64_t d : g.shape) bytes *= static_cast<long double>(d);
    if (bytes > static_cast<long double>(int64_t{1} << 62)) {
      throw std::invalid_argument("the tensor would hold more than 2^62 bytes");
    }
  } catch (const std::exception& e) {
    std::cerr << "stratbench solve redistribute: --shape '" << sb::harness::shownValue(shapeText)
              << "': " << sb::harness::errorText(e) << "\n";
    return kExitBadInput;
  }
  try {
    g.mesh = h::DeviceMesh::parseShape(meshText, 4096);
    if (g.mesh.size() > 4) {
      throw std::invalid_argument("at most 4 axes and 4096 ranks");
    }
  } catch (const std::exception& e) {
    std::cerr << "stratbench solve redistribute: --mesh '" << meshText
              << "': " << sb::harness::errorText(e) << "\n";
    return kExitBadInput;
  }
  try {
    g.elemSize = static_cast<int64_t>(c10::elementSize(h::parseDtype(dtypeText)));
  } catch (const std::exception& e) {
    std::cerr << "stratbench solve redistribute: --dtype '" << dtypeText << "' is not a dtype\n";
    return kExitBadInput;
  }
  std::optional<h::CostProfile> profile;
  h::RedistCostModel model;
  if (!profilePath.empty()) {
    try {
      profile = h::CostProfile::load(profilePath);
    } catch (const std::exception& e) {
      std::cerr << "stratbench solve redistribute: " << sb::harness::errorText(e) << "\n";
      return kExitBadInput;
    }
    if (profile->mesh != meshText) {
      std::cerr << "stratbench solve redistribute: --profile " << profilePath
                << " was measured on mesh " << profile->mesh << ", not " << meshText << "\n";
      return kExitBadInput;
    }
    model.profile = &*profile;
  }
  const auto objective =
      objectiveText == "bytes" ? h::PlanObjective::kBytes : h::PlanObjective::kTime;
  const int ndim = static_cast<int>(g.shape.size());
  const int meshNdim = static_cast<int>(g.mesh.size());
  if (!compare) {
    if (fromText.empty() || toText.empty()) {
      std::cerr << "stratbench solve redistribute: give --from and --to (or --compare-anchors)\n";
      return kExitBadInput;
    }
    h::Layout from, to;
    try {
      from = h::Layout::parse(fromText, ndim, meshNdim);
      to = h::Layout::parse(toText, ndim, meshNdim);
    } catch (const h::LayoutError& e) {
      std::cerr << "stratbench solve redistribute: " << sb::harness::errorText(e) << "\n";
      return kExitBadInput;
    }
    const auto plan = h::planRedistribution(g, from, to, model, objective);
    nlohmann::json j = plan.toJson(g, meshNdim);
    j["shape"] = g.shape;
    j["mesh"] = meshText;
    j["objective"] = objectiveText;
    j["cost_model"] = model.toJson();
    j["anchors"] = h::anchorPlansJson(g, from, to, model);
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  h::CompareLimits limits;
  limits.maxSeconds = timeLimit;
  if (::isatty(STDERR_FILENO)) {
    // Larger meshes take minutes (2x2x2: 40,000 pairs): said while it runs, on a terminal.
    limits.progress = [](size_t done, size_t total) {
      std::cerr << "\rstratbench solve redistribute: " << done << " of " << total << " pairs"
                << std::flush;
    };
  }
  nlohmann::json j;
  try {
    j = h::compareWithAnchors(g, model, objective, limits);
  } catch (const h::CompareStopped& e) {
    if (limits.progress) std::cerr << "\n";
    std::cerr << "stratbench solve redistribute: --compare-anchors " << sb::harness::errorText(e)
              << "; give a longer --time-limit or a smaller mesh or shape\n";
    return 1;
  }
  if (limits.progress) std::cerr << "\n";
  j["shape"] = g.shape;
  j["mesh"] = meshText;
  j["objective"] = objectiveText;
  j["cost_model"] = model.toJson();
  std::cout << j.dump(2) << "\n";
  return 0;
}

}  // namespace

namespace sb::cli {

Command addSolveRedistribute(CLI::App& solve) {
  struct Args {
    std::string redistShape, redistMesh, redistFrom, redistTo, redistProfile,
        redistObjective = "bytes", redistDtype = "float32";
    bool redistCompare = false;
    double redistTimeLimit = 300;
  };
  const auto a = std::make_shared<Args>();
  auto* redistCmd = solve.add_subcommand(
      "redistribute", "The cheapest redistribution plan between two layouts of a tensor");
  redistCmd->add_option("--shape", a->redistShape, "The full tensor's shape, JSON: [64, 32, 16]")
      ->required();
  redistCmd->add_option("--mesh", a->redistMesh, "Mesh extents, e.g. 2x2")->required();
  redistCmd->add_option("--from", a->redistFrom,
                        "Layout: [S01, R, R], S01RR or [Shard(0), Shard(0)]");
  redistCmd->add_option("--to", a->redistTo, "Layout, in any of those spellings");
  redistCmd->add_option("--profile", a->redistProfile, "Cost profile from `stratbench calibrate`")
      ->check(sb::cli::pathName());
  redistCmd->add_option("--objective", a->redistObjective, "time or bytes")
      ->capture_default_str()
      ->check(CLI::IsMember({"time", "bytes"}));
  redistCmd->add_option("--dtype", a->redistDtype, "float32, float64, bfloat16, float16")
      ->capture_default_str();
  redistCmd->add_flag("--compare-anchors", a->redistCompare,
                      "Compare with ColossalAI's and DTensor's paths over every pair of layouts");
  redistCmd
      ->add_option("--time-limit", a->redistTimeLimit,
                   "Seconds --compare-anchors may take before it stops (exit 1)")
      ->capture_default_str()
      ->check(sb::cli::realNumber(0, 86400, true, "seconds"));
  return {redistCmd, [a] {
            return solveRedistribute(a->redistShape, a->redistMesh, a->redistFrom, a->redistTo,
                                     a->redistProfile, a->redistObjective, a->redistDtype,
                                     a->redistCompare, a->redistTimeLimit);
          }};
}

}  // namespace sb::cli
