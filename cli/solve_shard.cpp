// `stratbench solve shard`: a sharding plan of a whole model on a device mesh (auto-sharding,
// strategies/sharding/auto/model.h). One subcommand per file (cli/commands.h).

#include <algorithm>
#include <chrono>
#include <cstdint>
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
#include "harness/case.h"
#include "harness/comm/mesh.h"
#include "harness/dist/cost_profile.h"
#include "harness/error.h"
#include "harness/out_file.h"
#include "harness/run/records.h"
#include "harness/run/run_util.h"
#include "reference/graph.h"
#include "reference/json_strict.h"
#include "reference/torchscript/import.h"
#include "strategies/checkpointing/sac/policy.h"
#include "strategies/checkpointing/sac/sac_runtime.h"
#include "strategies/sharding/auto/model.h"

namespace {

using sb::cli::kExitBadInput;

// The most ranks a plan is solved for.
constexpr int64_t kMaxPlanRanks = 4096;

// `solve shard`: a sharding plan of a whole model as JSON (stdout or --out); exit 1 when no
// plan fits the memory limit (saying what the plan of least memory needs by the replay), 2 for
// malformed input.
struct ShardArgs {
  std::string workload = "gpt2", shape = "{}", mesh, profile, algo = "ilp", out, dtype = "float32";
  std::string sacPolicy;        // a selective checkpointing policy priced into the search
  sb::cli::ModelOptions model;  // a traced model instead of a graph workload
  double intra = 0, inter = 0, maxMemory = 0, timeLimit = 60, gapPct = 0;
  int tpAxis = -1;
};
int solveShard(const ShardArgs& a) {
  namespace h = sb::harness;
  namespace as = sb::strategies::autoshard;
  const std::string who = "stratbench solve shard: ";
  const h::InputFiles inputs = {{"--model", a.model.file}, {"--profile", a.profile}};
  nlohmann::json shape;
  std::vector<int64_t> mesh;
  at::ScalarType dtype = at::kFloat;
  std::string workload = a.workload;
  try {
    if (!a.model.file.empty()) {
      workload = "torchscript";
      shape = sb::cli::modelShape(a.model);
    } else {
      shape = sb::reference::parseJsonNoDuplicates(a.shape);
    }
  } catch (const nlohmann::json::exception& e) {
    std::cerr << who << "--shape is not valid JSON: " << sb::harness::errorText(e) << "\n";
    return kExitBadInput;
  } catch (const std::invalid_argument& e) {
    std::cerr << who << "--shape: " << sb::harness::errorText(e) << "\n";
    return kExitBadInput;
  }
  try {
    // As many ranks as `solve redistribute` plans for: the model prices every choice on them.
    mesh = h::DeviceMesh::parseShape(a.mesh, kMaxPlanRanks);
    if (mesh.size() > 3) throw std::invalid_argument("plans are for meshes of 1 to 3 axes");
  } catch (const std::exception& e) {
    std::cerr << who << "--mesh '" << a.mesh << "': " << sb::harness::errorText(e) << "\n";
    return kExitBadInput;
  }
  try {
    dtype = h::parseDtype(a.dtype);
  } catch (const std::exception& e) {
    std::cerr << who << "--dtype '" << a.dtype << "' is not a dtype\n";
    return kExitBadInput;
  }
  nlohmann::json params = nlohmann::json::object();
  if (a.intra > 0) params["intra_node_bandwidth"] = a.intra;
  if (a.inter > 0) params["inter_node_bandwidth"] = a.inter;
  h::CostProfile profile;
  try {
    if (!a.profile.empty()) {
      const h::CostProfile loaded = h::CostProfile::load(a.profile);
      // A profile prices the mesh it was measured on (its groups are that mesh's axes), as
      // `solve redistribute` holds it to: another mesh's numbers would price the wrong groups.
      if (h::DeviceMesh::parseShape(loaded.mesh, kMaxPlanRanks) != mesh) {
        std::cerr << who << "--profile " << a.profile << " was measured on mesh " << loaded.mesh
                  << ", not " << a.mesh << " (`stratbench calibrate --mesh " << a.mesh
                  << "` measures that one)\n";
        return kExitBadInput;
      }
      params["cost_profile"] = loaded.toJson();
    }
  } catch (const std::exception& e) {
    std::cerr << who << "--profile " << a.profile << ": " << sb::harness::errorText(e) << "\n";
    return kExitBadInput;
  }
  if (!a.out.empty()) {
    try {
      h::checkResultPath(a.out, inputs);  // refused before the solve, not after it
    } catch (const h::InputError& e) {
      std::cerr << who << "--out: " << sb::harness::errorText(e) << "\n";
      return kExitBadInput;
    }
  }
  try {
    const auto start = std::chrono::steady_clock::now();
    const as::CostOptions opts = as::costOptionsFrom(params, &profile, dtype);
    // A large graph on a large mesh takes seconds to price and CBC up to --time-limit: said
    // while it runs, on a terminal.
    std::optional<sb::cli::TtyProgress> progress(std::in_place, "solve shard",
                                                 "pricing every node's strategies on the mesh");
    as::ShardingModel model(sb::reference::buildGraph(workload, shape), mesh, opts);
    const std::string policyText = [&] {
      const size_t b = a.sacPolicy.find_first_not_of(" \t\n");
      const size_t e = a.sacPolicy.find_last_not_of(" \t\n");
      return b == std::string::npos ? std::string() : a.sacPolicy.substr(b, e - b + 1);
    }();
    if (!a.sacPolicy.empty() && policyText.empty()) {
      std::cerr << who << "--sac-policy is empty: expected a policy's name or JSON\n";
      return kExitBadInput;
    }
    if (!policyText.empty()) {
      // A name, or a policy of one's own as JSON ({default, ops, nodes}).
      nlohmann::json spec = policyText;
      if (policyText.front() == '{') {
        try {
          spec = sb::reference::parseJsonNoDuplicates(policyText);
        } catch (const std::exception& e) {
          std::cerr << who << "--sac-policy is not valid JSON: " << sb::harness::errorText(e)
                    << "\n";
          return kExitBadInput;
        }
      }
      try {
        const auto policy = sb::strategies::sac::resolvePolicy(model.graph(), spec);
        if (std::all_of(policy.region.begin(), policy.region.end(), [](int r) { return r < 0; })) {
          std::cerr << who << "--sac-policy: this graph has no repeated blocks, and a policy "
                    << "decides inside blocks: nothing to price\n";
          return kExitBadInput;
        }
        sb::strategies::sac::priceRecompute(model, policy);
      } catch (const std::invalid_argument& e) {
        std::cerr << who << "--sac-" << sb::harness::errorText(e) << "\n";
        return kExitBadInput;
      }
    }
    as::SolveOptions o;
    o.algo = a.algo;
    o.memoryLimit = a.maxMemory;
    o.timeLimitSeconds = a.timeLimit;
    o.relativeGap = a.gapPct / 100.0;
    o.tpAxis = a.tpAxis;
    progress->phase(a.algo + " solving (CBC stops at --time-limit " +
                    std::to_string(static_cast<int>(a.timeLimit)) + " s)");
    as::ShardingPlan plan = as::solvePlan(model, o);
    progress.reset();
    plan.shape = shape;
    plan.solver.totalSeconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const std::string text = plan.toJson(model).dump(2) + "\n";
    if (a.out.empty()) {
      std::cout << text;
    } else {
      h::replaceResultFile(a.out, text, inputs);
      std::cerr << "stratbench solve shard: " << a.algo << " plan of "
                << (a.model.file.empty() ? a.workload : a.model.file) << " on " << a.mesh << " ("
                << plan.solver.status << ", " << plan.solver.seconds << " s in CBC, "
                << plan.solver.totalSeconds << " s in all): predicted step " << plan.predictedStepUs
                << " us, peak " << plan.predictedPeakBytes << " bytes per rank -> " << a.out
                << "\n";
    }
    return 0;
  } catch (const as::NoPlanError& e) {
    std::cerr << who << sb::harness::errorText(e) << "\n";
    return 1;
  } catch (const h::InputError& e) {
    std::cerr << who << sb::harness::errorText(e) << "\n";
    return kExitBadInput;
  } catch (const sb::reference::torchscript::ImportError& e) {
    std::cerr << who << sb::harness::errorText(e) << "\n";
    return kExitBadInput;
  } catch (const std::logic_error& e) {
    // The graph workloads say what is wrong with a shape as std::invalid_argument.
    std::cerr << who << "--shape: " << sb::harness::errorText(e) << "\n";
    return kExitBadInput;
  } catch (const c10::Error& e) {
    std::cerr << who << e.what_without_backtrace() << "\n";
    return kExitBadInput;
  }
}

}  // namespace

namespace sb::cli {

Command addSolveShard(CLI::App& solve) {
  const auto shard = std::make_shared<ShardArgs>();
  auto* shardCmd = solve.add_subcommand(
      "shard", "A sharding plan of a whole model on a device mesh (auto-sharding)");
  shardCmd->add_option("--workload", shard->workload, "gpt2, bert, llama or mlp")
      ->capture_default_str();
  shardCmd->add_option("--shape", shard->shape, "JSON, e.g. '{\"layers\": 12}'")
      ->capture_default_str();
  sb::cli::addModelOptions(shardCmd, shard->model,
                           "A TorchScript file (torch.jit.trace(...).save) to plan instead");
  shardCmd->add_option("--mesh", shard->mesh, "Mesh extents, e.g. 2x4 (axis 0 across nodes)")
      ->required();
  shardCmd->add_option("--profile", shard->profile, "Cost profile from `stratbench calibrate`")
      ->check(sb::cli::pathName());
  shardCmd->add_option("--intra-node-bandwidth", shard->intra, "GB/s of mesh axes in a node")
      ->check(sb::cli::realNumber(sb::strategies::autoshard::kMinBandwidthGBps,
                                  sb::strategies::autoshard::kMaxBandwidthGBps, false, "GB/s"));
  shardCmd->add_option("--inter-node-bandwidth", shard->inter, "GB/s of groups across mesh axis 0")
      ->check(sb::cli::realNumber(sb::strategies::autoshard::kMinBandwidthGBps,
                                  sb::strategies::autoshard::kMaxBandwidthGBps, false, "GB/s"));
  shardCmd->add_option("--max-memory", shard->maxMemory, "Bytes per rank (0: no limit)")
      ->check(sb::cli::byteCount(0));
  shardCmd->add_option("--algo", shard->algo, "ilp, megatron, data-parallel or replicated")
      ->capture_default_str()
      ->check(CLI::IsMember(sb::strategies::autoshard::planAlgos()));
  shardCmd
      ->add_option("--tp-axis", shard->tpAxis,
                   "megatron: the mesh axis tensor parallel uses (default: the last)")
      ->check(CLI::Range(0, 15));
  shardCmd->add_option("--time-limit", shard->timeLimit, "Seconds for CBC")
      ->capture_default_str()
      ->check(sb::cli::realNumber(0, 86400, true, "seconds"));
  shardCmd->add_option("--mip-rel-gap", shard->gapPct, "Relative gap to stop at, in %")
      ->check(sb::cli::realNumber(0, 100, false, "percent"));
  shardCmd->add_option("--out", shard->out, "Write the plan here (default: stdout)")
      ->check(sb::cli::pathName());
  shardCmd
      ->add_option("--sac-policy", shard->sacPolicy,
                   "Price a selective checkpointing policy into the search: save-all, "
                   "recompute-all, torchtitan, cheap, or JSON {default, ops, nodes}")
      ->check(sb::cli::nonEmpty("a policy (leave --sac-policy out to save every activation)"));
  shardCmd->add_option("--dtype", shard->dtype, "float32, float64, bfloat16, float16")
      ->capture_default_str();
  return {shardCmd, [shard] { return solveShard(*shard); }};
}

}  // namespace sb::cli
