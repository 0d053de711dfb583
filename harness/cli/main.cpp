// The stratbench command line, the full harness (stratbench-core; `stratbench`, the front in
// front.cpp, runs `solve checkpoint` itself and hands every other command here).
//
//   stratbench list [--family F] [--filter REGEX] [--json] [--plugin LIB.so...]
//   stratbench run SUITE [--filter REGEX] [--backend threads|gloo] [--out DIR] [--repetitions N]
//                        [--seed S] [--min-time SEC] [--world-size N] [--timeout SEC]
//                        [--cost-profile FILE...] [--plugin LIB.so...]
//   stratbench launch -n N [--nnodes K --node-rank I --master-addr A --master-port P]
//                        [--hosts H0,H1,...] [--timeout SEC] -- run SUITE --backend gloo ...
//   stratbench calibrate [--backend threads|gloo] [--mesh RxC] [--out FILE] [--max-bytes B]
//   stratbench report RESULTS... [--baseline FILE...] [--out DIR] [--history DIR] [--gate]
//                        [--gate-perf] [--perf-threshold PCT] [--mem-threshold PCT]
//   stratbench solve checkpoint --chain FILE.json --budget M|none [--solver S] [--slots N]
//                        [--max-solver-memory BYTES]
//   stratbench solve chunk --workload W --shape JSON --max-memory BYTES [--dtype D]
//   stratbench solve redistribute --shape JSON --mesh RxC (--from L --to L | --compare-anchors)
//                        [--profile FILE] [--objective time|bytes] [--dtype D]
//   stratbench solve shard --workload W --shape JSON --mesh RxC [--profile FILE |
//                        --intra-node-bandwidth B --inter-node-bandwidth B] [--max-memory BYTES]
//                        [--algo ilp|megatron|data-parallel|replicated] [--time-limit S]
//                        [--mip-rel-gap PCT] [--out plan.json] [--dtype D]
//   stratbench graph --workload gpt2|bert|mlp --shape JSON [--json]
//
// Exit codes: 0 everything passed (run) or the gate passed (report), 1 a strategy failed or
// errored (run), the gate failed (report --gate) or no schedule fits (solve), 2 bad input or
// usage (a plugin refused included). Plugins (harness/plugin.h) come from --plugin and from
// STRATBENCH_PLUGIN_PATH (files or folders, ':'-separated).

#include <algorithm>
#include <chrono>
#include <csignal>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <limits>
#include <sstream>
#include <thread>

#include <torch/version.h>
#include <CLI/CLI.hpp>

#include <unistd.h>

#include "harness/c10d_backend.h"
#include "harness/calibrate.h"
#include "harness/case.h"
#include "harness/cli/numbers.h"
#include "harness/cli/solve_checkpoint.h"
#include "harness/id_pattern.h"
#include "harness/launcher.h"
#include "harness/plugin_loader.h"
#include "harness/records.h"
#include "harness/redistribute.h"
#include "harness/registry.h"
#include "harness/runner.h"
#include "harness/threads_backend.h"
#include "reference/graph.h"
#include "reference/transformer.h"
#include "reports/report.h"
#include "strategies/checkpointing/solvers.h"
#include "strategies/chunking/estimator.h"
#include "strategies/sharding/auto/model.h"

namespace {

constexpr int kExitBadInput = 2;

using sb::harness::StrategyRegistry;

int listStrategies(const std::string& family, const std::string& filter, bool json) {
  std::optional<sb::harness::IdPattern> re;
  if (!filter.empty()) {
    try {
      re.emplace(filter);
    } catch (const std::invalid_argument& e) {
      std::cerr << "stratbench: --filter: " << e.what() << "\n";
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
      arr.push_back(j);
    }
    for (const auto& gen : StrategyRegistry::global().generators()) {
      if (!family.empty() && family != sb::harness::familyName(gen.family)) continue;
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
    std::cout << "\n";
  }
  std::cout << shown.size() << " strategies\n";
  for (const auto& gen : StrategyRegistry::global().generators()) {
    if (!family.empty() && family != sb::harness::familyName(gen.family)) continue;
    std::cout << "generated per case: " << gen.idPattern << " ("
              << sb::harness::familyName(gen.family) << "): " << gen.description;
    if (gen.origin != "built-in") std::cout << " [plugin " << gen.origin << "]";
    std::cout << "\n";
  }
  return 0;
}

// `solve redistribute`: the planner's plan from one layout to another as JSON, with the paths
// ColossalAI's greedy walk and DTensor's axis-by-axis rules take beside it; or, with
// --compare-anchors, the comparison over every ordered pair of layouts (at most one partial
// axis). Exit 2 naming the value for a malformed shape, mesh, layout or profile.
int solveRedistribute(const std::string& shapeText, const std::string& meshText,
                      const std::string& fromText, const std::string& toText,
                      const std::string& profilePath, const std::string& objectiveText,
                      const std::string& dtypeText, bool compare) {
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
    std::cerr << "stratbench solve redistribute: --shape '" << shapeText << "': " << e.what()
              << "\n";
    return kExitBadInput;
  }
  try {
    g.mesh = h::DeviceMesh::parseShape(meshText);
    if (g.mesh.size() > 4 || h::DeviceMesh(g.mesh).size() > 4096) {
      throw std::invalid_argument("at most 4 axes and 4096 ranks");
    }
  } catch (const std::exception& e) {
    std::cerr << "stratbench solve redistribute: --mesh '" << meshText << "': " << e.what() << "\n";
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
      std::cerr << "stratbench solve redistribute: " << e.what() << "\n";
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
  // A plan and its anchors for one pair, as JSON.
  const auto anchorJson = [&](const std::optional<std::vector<h::RedistStep>>& steps,
                              const h::Layout& from) -> nlohmann::json {
    if (!steps) return nullptr;
    const auto p = h::planFromSteps(g, from, *steps, model);
    return {{"path", p.path()},
            {"steps", p.steps.size()},
            {"predicted_bytes_max_rank", p.maxRankBytes(g)},
            {"predicted_time_us", p.predictedUs}};
  };
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
      std::cerr << "stratbench solve redistribute: " << e.what() << "\n";
      return kExitBadInput;
    }
    const auto plan = h::planRedistribution(g, from, to, model, objective);
    nlohmann::json j = plan.toJson(g, meshNdim);
    j["shape"] = g.shape;
    j["mesh"] = meshText;
    j["objective"] = objectiveText;
    j["cost_model"] = model.toJson();
    j["anchors"] = {
        {"colossalai_greedy", anchorJson(h::colossalGreedySteps(from, to, meshNdim), from)},
        {"dtensor", anchorJson(h::dtensorSteps(from, to, meshNdim), from)}};
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  // Every ordered pair of layouts with at most one partial axis.
  const auto layouts = h::enumerateLayouts(ndim, meshNdim, 1);
  struct Tally {
    int pairs = 0, cheaper = 0, equal = 0, dearer = 0;
    double saved = 0, bestSaving = 0;  // bytes saved, summed; the largest relative saving
    int64_t planBytes = 0, anchorBytes = 0;
  };
  Tally colossal, dtensor;
  nlohmann::json worse = nlohmann::json::array();
  const auto tally = [&](Tally& t, const char* name, const h::RedistPlan& plan,
                         const std::optional<std::vector<h::RedistStep>>& steps,
                         const h::Layout& from) {
    if (!steps) return;
    const auto p = h::planFromSteps(g, from, *steps, model);
    const int64_t ours = plan.maxRankBytes(g), theirs = p.maxRankBytes(g);
    ++t.pairs;
    t.planBytes += ours;
    t.anchorBytes += theirs;
    if (ours < theirs) {
      ++t.cheaper;
      t.saved += static_cast<double>(theirs - ours);
      t.bestSaving = std::max(t.bestSaving, 1.0 - static_cast<double>(ours) / theirs);
    } else if (ours == theirs) {
      ++t.equal;
    } else {
      ++t.dearer;
      worse.push_back({{"anchor", name},
                       {"from", plan.from.sequence()},
                       {"to", plan.to.sequence()},
                       {"plan_bytes", ours},
                       {"anchor_bytes", theirs}});
    }
  };
  for (const auto& a : layouts) {
    for (const auto& b : layouts) {
      const auto plan = h::planRedistribution(g, a, b, model, objective);
      tally(colossal, "colossalai_greedy", plan, h::colossalGreedySteps(a, b, meshNdim), a);
      tally(dtensor, "dtensor", plan, h::dtensorSteps(a, b, meshNdim), a);
    }
  }
  const auto tallyJson = [](const Tally& t) -> nlohmann::json {
    return {{"pairs_with_a_path", t.pairs},
            {"plan_cheaper", t.cheaper},
            {"plan_equal", t.equal},
            {"plan_more_bytes", t.dearer},
            {"plan_bytes_total", t.planBytes},
            {"anchor_bytes_total", t.anchorBytes},
            {"mean_saving_where_cheaper", t.cheaper ? t.saved / t.cheaper : 0.0},
            {"largest_relative_saving", t.bestSaving}};
  };
  nlohmann::json j = {{"shape", g.shape},
                      {"mesh", meshText},
                      {"layouts", layouts.size()},
                      {"pairs", layouts.size() * layouts.size()},
                      {"objective", objectiveText},
                      {"cost_model", model.toJson()},
                      {"colossalai_greedy", tallyJson(colossal)},
                      {"dtensor", tallyJson(dtensor)},
                      {"plan_more_bytes_than_an_anchor", worse}};
  std::cout << j.dump(2) << "\n";
  return 0;
}

// `graph`: a graph workload's nodes (shapes, arguments, layers), as text or JSON.
int graphMain(const std::string& workload, const std::string& shapeText, bool json) {
  try {
    const auto g = sb::reference::buildGraph(workload, nlohmann::json::parse(shapeText));
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

// `solve shard`: a sharding plan of a whole model as JSON (stdout or --out); exit 1 when no
// plan fits the memory limit (saying the least any plan needs), 2 for malformed input.
struct ShardArgs {
  std::string workload = "gpt2", shape = "{}", mesh, profile, algo = "ilp", out, dtype = "float32";
  double intra = 0, inter = 0, maxMemory = 0, timeLimit = 60, gapPct = 0;
};
int solveShard(const ShardArgs& a) {
  namespace h = sb::harness;
  namespace as = sb::strategies::autoshard;
  const std::string who = "stratbench solve shard: ";
  nlohmann::json shape;
  std::vector<int64_t> mesh;
  at::ScalarType dtype = at::kFloat;
  try {
    shape = nlohmann::json::parse(a.shape);
  } catch (const std::exception& e) {
    std::cerr << who << "--shape is not valid JSON: " << e.what() << "\n";
    return kExitBadInput;
  }
  try {
    mesh = h::DeviceMesh::parseShape(a.mesh);
    if (mesh.size() > 2) throw std::invalid_argument("plans are for 1-D and 2-D meshes");
  } catch (const std::exception& e) {
    std::cerr << who << "--mesh '" << a.mesh << "': " << e.what() << "\n";
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
    if (!a.profile.empty()) params["cost_profile"] = h::CostProfile::load(a.profile).toJson();
  } catch (const std::exception& e) {
    std::cerr << who << "--profile " << a.profile << ": " << e.what() << "\n";
    return kExitBadInput;
  }
  try {
    const auto start = std::chrono::steady_clock::now();
    const as::CostOptions opts = as::costOptionsFrom(params, &profile, dtype);
    const as::ShardingModel model(sb::reference::buildGraph(a.workload, shape), mesh, opts);
    as::SolveOptions o;
    o.algo = a.algo;
    o.memoryLimit = a.maxMemory;
    o.timeLimitSeconds = a.timeLimit;
    o.relativeGap = a.gapPct / 100.0;
    as::ShardingPlan plan = as::solvePlan(model, o);
    plan.shape = shape;
    plan.solver.totalSeconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const std::string text = plan.toJson(model).dump(2) + "\n";
    if (a.out.empty()) {
      std::cout << text;
    } else {
      sb::harness::writeFileAtomic(a.out, text);
      std::cerr << "stratbench solve shard: " << a.algo << " plan of " << a.workload << " on "
                << a.mesh << " (" << plan.solver.status << ", " << plan.solver.seconds
                << " s in CBC, " << plan.solver.totalSeconds << " s in all): predicted step "
                << plan.predictedStepUs << " us, peak " << plan.predictedPeakBytes
                << " bytes per rank -> " << a.out << "\n";
    }
    return 0;
  } catch (const as::NoPlanError& e) {
    std::cerr << who << e.what() << "\n";
    return 1;
  } catch (const h::InputError& e) {
    std::cerr << who << e.what() << "\n";
    return kExitBadInput;
  } catch (const std::invalid_argument& e) {
    std::cerr << who << "--shape: " << e.what() << "\n";
    return kExitBadInput;
  } catch (const c10::Error& e) {
    std::cerr << who << e.what_without_backtrace() << "\n";
    return kExitBadInput;
  }
}

// `solve chunk`: the search's plan as JSON; exit 1 when none fits, 2 on a bad shape.
int solveChunk(const std::string& workload, const std::string& shapeText, double maxMemory,
               const std::string& dtypeName) {
  namespace ch = sb::strategies::chunking;
  if (workload != "gpt2_prefill" && workload != "vit_encoder") {
    std::cerr << "stratbench solve: --workload '" << workload
              << "' is not one the chunk search knows (gpt2_prefill, vit_encoder)\n";
    return kExitBadInput;
  }
  sb::reference::TransformerShape shape;
  at::ScalarType dtype;
  try {
    shape = sb::reference::TransformerShape::parse(nlohmann::json::parse(shapeText), workload);
    dtype = sb::harness::parseDtype(dtypeName);
  } catch (const nlohmann::json::parse_error& e) {
    std::cerr << "stratbench solve: --shape is not valid JSON: " << e.what() << "\n";
    return kExitBadInput;
  } catch (const c10::Error& e) {
    std::cerr << "stratbench solve: --shape: " << e.what_without_backtrace() << "\n";
    return kExitBadInput;
  } catch (const std::exception& e) {
    std::cerr << "stratbench solve: " << e.what() << "\n";
    return kExitBadInput;
  }
  const auto r =
      ch::searchChunkPlan(shape, c10::elementSize(dtype), static_cast<int64_t>(maxMemory));
  if (!r.plan) {
    std::cerr << "stratbench solve: no chunk plan of " << workload << " (" << shape.toString()
              << ") fits --max-memory " << static_cast<int64_t>(maxMemory)
              << " bytes; the smallest of " << r.plansTried << " plans needs " << r.smallest
              << " (unchunked " << r.unchunked << ")\n";
    return 1;
  }
  nlohmann::json j;
  j["workload"] = workload;
  j["shape"] = shape.toString();
  j["max_memory"] = static_cast<int64_t>(maxMemory);
  j["plan"] = {{"region", r.plan->region},
               {"dim", "seq"},
               {"chunk", r.plan->chunk},
               {"chunks", (shape.seq + r.plan->chunk - 1) / r.plan->chunk}};
  j["estimated_activation_peak_bytes"] = r.estimate;
  j["unchunked_estimate_bytes"] = r.unchunked;
  j["plans_tried"] = r.plansTried;
  std::cout << j.dump(2) << "\n";
  return 0;
}

// `stratbench launch -n N [...] -- COMMAND...`: everything after "--" is the ranks' command.
int launchMain(int argc, char** argv) {
  sb::harness::LaunchOptions o;
  int split = argc;
  for (int i = 2; i < argc; ++i) {
    if (std::string(argv[i]) == "--") {
      split = i;
      break;
    }
  }
  CLI::App app{"stratbench launch: start N ranks of a multi-process run on this host"};
  app.name("stratbench launch");
  std::string hosts;
  double timeoutSec = 300, graceSec = 10;
  app.add_option("-n,--nproc-per-node", o.procsPerNode, "Ranks to start on this host")
      ->required()
      ->check(sb::cli::wholeNumber(1, 1024, "ranks"));
  app.add_option("--nnodes", o.nnodes, "Hosts taking part, each running its own launch")
      ->check(sb::cli::wholeNumber(1, 4096, "hosts"));
  app.add_option("--node-rank", o.nodeRank, "This host's place among them (0 serves the store)")
      ->check(sb::cli::wholeNumber(0, 4095, "hosts"));
  app.add_option("--master-addr", o.masterAddr, "Address of node 0")->capture_default_str();
  app.add_option("--master-port", o.masterPort, "Port of node 0's store (0: any free port)")
      ->check(sb::cli::wholeNumber(0, 65535, "port"));
  app.add_option("--hosts", hosts,
                 "Comma-separated hosts, node 0 first: sets --nnodes and --master-addr");
  app.add_option("--timeout", timeoutSec, "Seconds the other ranks get to finish after a rank dies")
      ->check(sb::cli::realNumber(0, 86400, true, "seconds"))
      ->capture_default_str();
  app.add_option("--grace", graceSec, "Seconds the ranks get after rank 0 has finished")
      ->check(sb::cli::realNumber(0, 86400, true, "seconds"))
      ->capture_default_str();
  std::vector<std::string> before;
  for (int i = split - 1; i >= 2; --i) before.push_back(argv[i]);  // CLI11 wants them reversed
  try {
    app.parse(before);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : kExitBadInput;
  }
  if (split + 1 >= argc) {
    std::cerr << "stratbench launch: nothing to run: expected `-- run SUITE ...` after the "
                 "options\n";
    return kExitBadInput;
  }
  for (int i = split + 1; i < argc; ++i) o.command.push_back(argv[i]);
  if (!hosts.empty()) {
    std::vector<std::string> list;
    std::stringstream ss(hosts);
    for (std::string h; std::getline(ss, h, ',');) {
      if (!h.empty()) list.push_back(h);
    }
    if (list.empty()) {
      std::cerr << "stratbench launch: --hosts '" << hosts << "' names no host\n";
      return kExitBadInput;
    }
    o.nnodes = static_cast<int>(list.size());
    o.masterAddr = list.front();
  }
  {
    // Every rank is a process that loads LibTorch and runs its own threads: beyond a few per
    // core a host only thrashes (and a thousand forks take minutes to stop).
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    const int most = std::max(8, 8 * cores);
    if (o.procsPerNode > most) {
      std::cerr << "stratbench launch: -n " << o.procsPerNode << ": at most " << most
                << " ranks on this host (8 per CPU core, at least 8; it has " << cores
                << "): each rank is a process running LibTorch\n";
      return kExitBadInput;
    }
  }
  if (o.nodeRank >= o.nnodes) {
    std::cerr << "stratbench launch: --node-rank " << o.nodeRank << " is not below --nnodes "
              << o.nnodes << "\n";
    return kExitBadInput;
  }
  if (o.nnodes > 1 && o.masterPort == 0) {
    std::cerr << "stratbench launch: --nnodes " << o.nnodes
              << " needs --master-port: every host must know where node 0's store listens\n";
    return kExitBadInput;
  }
  o.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeoutSec * 1000));
  o.grace = std::chrono::milliseconds(static_cast<int64_t>(graceSec * 1000));
  char self[4096];
  const ssize_t len = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (len <= 0) {
    std::cerr << "stratbench launch: cannot find this executable (/proc/self/exe)\n";
    return 1;
  }
  self[len] = '\0';
  return sb::harness::launch(o, self);
}

// `stratbench calibrate`: on threads in this process, or on a c10d backend as one rank of a
// launched run; rank 0 writes the profile.
int calibrateMain(const std::string& backend, const std::string& meshText,
                  const std::string& outPath, int64_t maxBytes) {
  using namespace sb::harness;
  DeviceMesh mesh(DeviceMesh::parseShape(meshText));
  CalibrateOptions co;
  co.sizes.erase(
      std::remove_if(co.sizes.begin(), co.sizes.end(), [&](int64_t s) { return s > maxBytes; }),
      co.sizes.end());
  CostProfile profile;
  bool writer = true;
  if (backend == "threads") {
    ThreadsWorld world(mesh);
    profile = calibrate(world, co, std::cout);
  } else {
    const DistEnv env = detectDistEnv();
    std::signal(SIGPIPE, SIG_IGN);
    Session session(env, backend, std::chrono::minutes(5));
    World* world = session.world(mesh);
    if (!world) return 0;  // this rank is outside the mesh
    writer = session.rank() == 0;
    std::ostringstream quiet;
    profile = calibrate(*world, co, writer ? std::cout : quiet);
  }
  if (!writer) return 0;
  writeFileAtomic(outPath, profile.toJson().dump(2) + "\n");
  std::cout << "profile: " << outPath << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "launch") return launchMain(argc, argv);
  CLI::App app{
      "stratbench: verify, time and memory-profile parallelization and memory "
      "strategies against a plain LibTorch reference"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("stratbench (LibTorch ") + TORCH_VERSION + ")");

  auto* list = app.add_subcommand("list", "List the registered strategies");
  std::string family, listFilter;
  bool json = false;
  list->add_option("--family", family, "Only this family")
      ->check(CLI::IsMember({"sharding", "chunking", "checkpointing"}));
  list->add_option("--filter", listFilter, "Only ids matching this regular expression");
  list->add_flag("--json", json,
                 "Print JSON: id, name, family, origin, parameters, sharding sequences");
  std::vector<std::string> pluginPaths;
  const char* pluginHelp =
      "Load strategies from this shared library (repeatable; STRATBENCH_PLUGIN_PATH adds more, "
      "':'-separated files or folders)";
  list->add_option("--plugin", pluginPaths, pluginHelp);

  auto* run = app.add_subcommand("run", "Run a suite: verify, time and profile every strategy");
  std::string suitePath;
  sb::harness::RunOptions opts;
  int repetitions = 0, worldSize = 0;
  uint64_t seed = 0;
  double minTime = 0;
  run->add_option("suite", suitePath, "Suite file, e.g. suites/smoke.yaml")->required();
  run->add_option("--filter", opts.filter, "Only strategy ids matching this regular expression");
  run->add_option("--backend", opts.backend,
                  "Communication backend: threads (one process), or gloo or nccl (a CUDA "
                  "LibTorch; one GPU per rank) under `stratbench launch`, torchrun, srun or "
                  "mpirun")
      ->check(CLI::IsMember(sb::harness::availableBackends()))
      ->capture_default_str();
  double timeoutSec = 300;
  run->add_option("--timeout", timeoutSec,
                  "Seconds a rank may wait in a collective before the case fails")
      ->check(sb::cli::realNumber(0, 86400, true, "seconds"))
      ->capture_default_str();
  std::string rankFault;
  run->add_option(
      "--plant-rank-fault", rankFault,
      "Test only: KIND@RANK[@ROW] (throw, crash, hang) in that rank's ROW-th row (default 1)");
  run->add_option("--out", opts.outDir, "Output directory for results.csv and results.json")
      ->capture_default_str();
  run->add_option("--repetitions", repetitions, "Timing repetitions (overrides the suite)")
      ->check(sb::cli::wholeNumber(1, 100000, "repetitions"));
  run->add_option("--seed", seed, "Input seed (overrides the suite)")
      ->check(sb::cli::wholeNumber(0, std::numeric_limits<uint64_t>::max(), "seed"));
  run->add_option("--min-time", minTime, "Minimum seconds per repetition (overrides the suite)")
      ->check(sb::cli::realNumber(0, 3600, true, "seconds"));
  run->add_option("--world-size", worldSize, "Require every case's mesh to have N ranks")
      ->check(sb::cli::wholeNumber(1, 1024, "ranks"));

  std::vector<std::string> plantFaults;
  run->add_option("--plant-fault", plantFaults,
                  "Test only: run strategy ID with a deliberate bug, as ID=FAULT (repeatable)");

  run->add_option("--plugin", pluginPaths, pluginHelp);

  std::vector<std::string> profilePaths;
  run->add_option("--cost-profile", profilePaths,
                  "Calibration profile(s) from `stratbench calibrate`: predicted times of the "
                  "cases on their backend and mesh come from it (repeatable)");

  auto* calib = app.add_subcommand(
      "calibrate",
      "Measure latency and bandwidth of each collective per mesh axis, and matmul "
      "throughput, into a cost profile");
  std::string calibBackend = "threads", calibMesh = "2x2", calibOut = "out/calibration.json";
  int64_t calibMax = int64_t{1} << 22;
  calib->add_option("--backend", calibBackend, "threads, or gloo under `stratbench launch`")
      ->check(CLI::IsMember(sb::harness::availableBackends()))
      ->capture_default_str();
  calib->add_option("--mesh", calibMesh, "Mesh shape, e.g. 2x2 or 4")->capture_default_str();
  calib->add_option("--out", calibOut, "Profile file (JSON)")->capture_default_str();
  calib->add_option("--max-bytes", calibMax, "Largest size per collective")
      ->check(sb::cli::wholeNumber(1024, uint64_t{1} << 32, "bytes"))
      ->capture_default_str();

  auto* report = app.add_subcommand(
      "report",
      "Merge result files, compare with a baseline, gate, write report.md/html and plots");
  sb::reports::ReportOptions ropts;
  report->add_option("results", ropts.results, "results.csv files or run directories");
  report->add_option("--baseline", ropts.baselines, "Baseline results.csv files or directories");
  report->add_option("--out", ropts.outDir,
                     "Report directory (default: that of the first results file)");
  report->add_option("--history", ropts.historyDir,
                     "Directory of runs (folders with results.csv) for the trend plots");
  report->add_flag("--gate", ropts.gate, "Exit 1 when the gate fails");
  report->add_flag("--gate-perf", ropts.gateOptions.hardPerf,
                   "Time regressions fail the gate too (soft by default)");
  report->add_flag("--allow-gone", ropts.gateOptions.allowGone,
                   "A baseline row missing from the results only warns");
  report->add_flag("--allow-mispredicted", ropts.gateOptions.allowMispredicted,
                   "A row whose prediction is past its strategy's tolerance only warns");
  report
      ->add_option("--perf-threshold", ropts.gateOptions.perfThresholdPct,
                   "Minimum change of the median time, in %")
      ->capture_default_str()
      ->check(sb::cli::realNumber(0, 1000, true, "percent"));
  report
      ->add_option("--mem-threshold", ropts.gateOptions.memThresholdPct,
                   "Minimum change of peak memory, in %")
      ->capture_default_str()
      ->check(sb::cli::realNumber(0, 1000, false, "percent"));
  bool noPlots = false;
  report->add_flag("--no-plots", noPlots, "Skip the matplotlib plots");

  auto* solveCmd = app.add_subcommand(
      "solve",
      "Plan a strategy: a checkpoint schedule, a chunk plan, a redistribution, a model's sharding");
  solveCmd->require_subcommand(1);
  auto* ckpt = solveCmd->add_subcommand(
      "checkpoint", "A checkpoint schedule for a chain (JSON, rotor's notation) under a budget");
  sb::cli::CheckpointArgs ckptArgs;
  sb::cli::addCheckpointOptions(ckpt, ckptArgs);

  auto* chunkCmd = solveCmd->add_subcommand(
      "chunk", "A chunk plan for a transformer workload under an activation-memory limit");
  std::string chunkWorkload = "gpt2_prefill", chunkShape, chunkDtype = "float32";
  double maxMemory = 0;
  chunkCmd->add_option("--workload", chunkWorkload, "gpt2_prefill or vit_encoder")
      ->capture_default_str();
  chunkCmd->add_option("--shape", chunkShape, "JSON, e.g. '{\"seq\": 1024, \"d_model\": 64}'")
      ->required();
  chunkCmd->add_option("--max-memory", maxMemory, "Activation memory limit in bytes")
      ->required()
      ->check(sb::cli::byteCount(1));
  chunkCmd->add_option("--dtype", chunkDtype, "float32, float64, bfloat16, float16")
      ->capture_default_str();

  auto* redistCmd = solveCmd->add_subcommand(
      "redistribute", "The cheapest redistribution plan between two layouts of a tensor");
  std::string redistShape, redistMesh, redistFrom, redistTo, redistProfile,
      redistObjective = "bytes", redistDtype = "float32";
  bool redistCompare = false;
  redistCmd->add_option("--shape", redistShape, "The full tensor's shape, JSON: [64, 32, 16]")
      ->required();
  redistCmd->add_option("--mesh", redistMesh, "Mesh extents, e.g. 2x2")->required();
  redistCmd->add_option("--from", redistFrom, "Layout: [S01, R, R], S01RR or [Shard(0), Shard(0)]");
  redistCmd->add_option("--to", redistTo, "Layout, in any of those spellings");
  redistCmd->add_option("--profile", redistProfile, "Cost profile from `stratbench calibrate`");
  redistCmd->add_option("--objective", redistObjective, "time or bytes")
      ->capture_default_str()
      ->check(CLI::IsMember({"time", "bytes"}));
  redistCmd->add_option("--dtype", redistDtype, "float32, float64, bfloat16, float16")
      ->capture_default_str();
  redistCmd->add_flag("--compare-anchors", redistCompare,
                      "Compare with ColossalAI's and DTensor's paths over every pair of layouts");

  auto* shardCmd = solveCmd->add_subcommand(
      "shard", "A sharding plan of a whole model on a device mesh (auto-sharding)");
  ShardArgs shard;
  shardCmd->add_option("--workload", shard.workload, "gpt2, bert or mlp")->capture_default_str();
  shardCmd->add_option("--shape", shard.shape, "JSON, e.g. '{\"layers\": 12}'")
      ->capture_default_str();
  shardCmd->add_option("--mesh", shard.mesh, "Mesh extents, e.g. 2x4 (axis 0 across nodes)")
      ->required();
  shardCmd->add_option("--profile", shard.profile, "Cost profile from `stratbench calibrate`");
  shardCmd->add_option("--intra-node-bandwidth", shard.intra, "GB/s of mesh axes in a node")
      ->check(sb::cli::realNumber(0, 1e6, true, "GB/s"));
  shardCmd->add_option("--inter-node-bandwidth", shard.inter, "GB/s of groups across mesh axis 0")
      ->check(sb::cli::realNumber(0, 1e6, true, "GB/s"));
  shardCmd->add_option("--max-memory", shard.maxMemory, "Bytes per rank (0: no limit)")
      ->check(sb::cli::byteCount(0));
  shardCmd->add_option("--algo", shard.algo, "ilp, megatron, data-parallel or replicated")
      ->capture_default_str()
      ->check(CLI::IsMember(sb::strategies::autoshard::planAlgos()));
  shardCmd->add_option("--time-limit", shard.timeLimit, "Seconds for CBC")
      ->capture_default_str()
      ->check(sb::cli::realNumber(0, 86400, true, "seconds"));
  shardCmd->add_option("--mip-rel-gap", shard.gapPct, "Relative gap to stop at, in %")
      ->check(sb::cli::realNumber(0, 100, false, "percent"));
  shardCmd->add_option("--out", shard.out, "Write the plan here (default: stdout)");
  shardCmd->add_option("--dtype", shard.dtype, "float32, float64, bfloat16, float16")
      ->capture_default_str();

  auto* graphCmd = app.add_subcommand("graph", "Print a graph workload (gpt2, bert, mlp)");
  std::string graphWorkload = "gpt2", graphShape = "{}";
  bool graphJson = false;
  graphCmd->add_option("--workload", graphWorkload, "gpt2, bert or mlp")->capture_default_str();
  graphCmd->add_option("--shape", graphShape, "JSON, e.g. '{\"layers\": 2}'")
      ->capture_default_str();
  graphCmd->add_flag("--json", graphJson, "As JSON");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : kExitBadInput;
  }

  if (*list || *run) {
    try {
      sb::harness::loadPlugins(pluginPaths);
    } catch (const sb::harness::PluginError& e) {
      std::cerr << "stratbench: " << e.what() << "\n";
      return kExitBadInput;
    }
  }
  if (*list) return listStrategies(family, listFilter, json);
  if (*ckpt) return sb::cli::solveCheckpoint(ckptArgs);
  if (*chunkCmd) return solveChunk(chunkWorkload, chunkShape, maxMemory, chunkDtype);
  if (*shardCmd) return solveShard(shard);
  if (*graphCmd) return graphMain(graphWorkload, graphShape, graphJson);
  if (*redistCmd) {
    return solveRedistribute(redistShape, redistMesh, redistFrom, redistTo, redistProfile,
                             redistObjective, redistDtype, redistCompare);
  }
  if (*calib) {
    try {
      return calibrateMain(calibBackend, calibMesh, calibOut, calibMax);
    } catch (const sb::harness::DistEnvError& e) {
      std::cerr << "stratbench calibrate: " << e.what() << "\n";
      return kExitBadInput;
    } catch (const c10::Error& e) {
      std::cerr << "stratbench calibrate: " << e.what_without_backtrace() << "\n";
      return kExitBadInput;
    } catch (const std::exception& e) {
      std::cerr << "stratbench calibrate: " << e.what() << "\n";
      return 1;
    }
  }
  if (*report) {
    ropts.plots = !noPlots;
    try {
      return sb::reports::runReport(ropts, std::cout);
    } catch (const sb::reports::ReportInputError& e) {
      std::cerr << "stratbench report: " << e.what() << "\n";
      return kExitBadInput;
    }
  }
  for (const auto& pf : plantFaults) {
    const auto eq = pf.rfind('=');  // ids contain "=", fault names do not
    if (eq == std::string::npos || eq == 0 || eq + 1 == pf.size()) {
      std::cerr << "stratbench: --plant-fault '" << pf << "': expected STRATEGY_ID=FAULT\n";
      return kExitBadInput;
    }
    opts.plantedFaults.emplace_back(pf.substr(0, eq), pf.substr(eq + 1));
  }

  if (run->count("--repetitions")) opts.repetitions = repetitions;
  if (run->count("--seed")) opts.seed = seed;
  if (run->count("--min-time")) opts.minTimeSec = minTime;
  if (run->count("--world-size")) opts.worldSize = worldSize;
  opts.collectiveTimeout = std::chrono::milliseconds(static_cast<int64_t>(timeoutSec * 1000));
  try {
    if (!rankFault.empty()) opts.rankFault = sb::harness::parseRankFault(rankFault);
    for (const auto& p : profilePaths)
      opts.costProfiles.push_back(sb::harness::CostProfile::load(p));
    const auto suite = sb::harness::loadSuite(suitePath);
    const auto plan = sb::harness::planSuite(suite, opts);
    return sb::harness::runPlanned(suite, plan, opts, std::cout);
  } catch (const sb::harness::InputError& e) {
    std::cerr << "stratbench: " << e.what() << "\n";
    return kExitBadInput;
  } catch (const sb::harness::OutputBusy& e) {
    std::cerr << "stratbench: " << e.what() << "\n";
    return kExitBadInput;
  } catch (const c10::Error& e) {
    std::cerr << "stratbench: " << e.what_without_backtrace() << "\n";
    return kExitBadInput;
  } catch (const std::runtime_error& e) {
    // A multi-process run that could not start: the store or a rank unreachable.
    std::cerr << "stratbench: " << e.what() << "\n";
    return 1;
  }
}
