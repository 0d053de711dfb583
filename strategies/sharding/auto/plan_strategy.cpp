// The plan strategies: `sharding/auto/<algo>` solves the plan of a whole model (model.h) for
// the case (ilp, megatron, data-parallel, replicated), `sharding/plan` reads one from a file
// (params.plan); both run it with the same executor (plan_executor.h), and declare its layouts,
// its communication per node and its tolerances.

#include "harness/in_file.h"
#include "strategies/sharding/auto/plan_executor.h"

#include <ATen/ATen.h>

#include <cmath>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>
#include <set>

#include "harness/measure/update_profile.h"
#include "harness/registry.h"
#include "harness/run/suite.h"
#include "reference/json_strict.h"
#include "reference/training.h"
#include "strategies/sharding/auto/model.h"
#include "strategies/sharding/auto/plan_memory.h"
#include "strategies/sharding/sharding_util.h"

namespace sb::strategies::autoshard {
namespace {

using harness::Applicability;
using harness::CommStats;

constexpr const char* kFault = "skip_edge_redistribution";
// The memory model's planted faults: the integer program's rows without the parameters (a plan
// over the memory limit chosen, which the measured peak flags), and a replay that frees each
// value at its last reader's forward, not after what that reader saved goes (the prediction
// off, which the tolerance-0 judgement flags).
constexpr const char* kFaultRows = "rows_without_parameters";
constexpr const char* kFaultReplay = "liveness_frees_early";
// The rows free each activation at the forward of the node before its last reader: the plan
// may still fit and run right; its rows are off where the activation still lives, which the
// forward points' judgement against the replay flags (memory_rows).
constexpr const char* kFaultRowsEarly = "rows_free_early";
// The cost model's: the integer program without the edges of parameters read by more than one
// node (a plan's objective under its step priced node by node, which the row's check of the
// two flags).
constexpr const char* kFaultProgram = "program_without_parameter_edges";

std::string cacheKey(const std::string& id, const CaseSpec& c) {
  return id + "|" + c.workload + "|" + c.shape.dump() + "|" + c.meshString() + "|" +
         harness::dtypeName(c.dtype) + "|" + c.params.dump();
}

// A number parameter of the case within the range the command line's option of the same
// meaning takes (`solve shard --max-memory`, `--time-limit`, `--mip-rel-gap`): a suite may not
// pass what the command line refuses (time_limit 0 was CBC's std::invalid_argument; max_memory
// 1e30 became INT64_MIN as a promise).
struct ParamRange {
  double lo, hi;
  bool openLow;
  const char* expected;
};
const std::map<std::string, ParamRange>& paramRanges() {
  static const std::map<std::string, ParamRange> r = {
      {"max_memory", {0, 4611686018427387904.0, false, "a whole number of bytes from 0 to 2^62"}},
      {"time_limit", {0, 86400, true, "a number of seconds in (0, 86400]"}},
      {"mip_rel_gap", {0, 100, false, "a number of percent in [0, 100]"}},
      {"tp_axis", {0, 15, false, "a mesh axis, a whole number from 0 (megatron only)"}}};
  return r;
}
double numberParam(const CaseSpec& c, const std::string& key, double fallback) {
  if (!c.params.contains(key)) return fallback;
  const auto& v = c.params.at(key);
  const ParamRange& r = paramRanges().at(key);
  const bool whole = key == "max_memory" || key == "tp_axis";
  double x = std::nan("");
  if (whole) {
    // Compared as an integer: 2^62 + 511 through a double would read as 2^62 and pass.
    if (auto n =
            reference::jsonWholeNumber(v, static_cast<int64_t>(r.lo), static_cast<int64_t>(r.hi))) {
      x = static_cast<double>(*n);
    }
  } else if (v.is_number()) {
    x = v.get<double>();
  }
  const bool inRange = x >= r.lo && x <= r.hi && !(r.openLow && x == r.lo);
  if (!inRange) {
    throw harness::InputError(c.where() + ": params." + key + ": expected " + r.expected +
                              ", got " + v.dump());
  }
  return x;
}

// sharding/plan's own: params.plan the path of a plan file, and no Megatron axis.
void checkPlanFileParams(const CaseSpec& c) {
  if (!c.params.contains("plan") || !c.params.at("plan").is_string()) {
    throw harness::InputError(c.where() + ": params.plan: expected the path of a plan file");
  }
  if (c.params.contains("tp_axis")) {
    throw harness::InputError(c.where() +
                              ": params.tp_axis: Megatron's tensor-parallel axis, for "
                              "sharding/auto/megatron; a plan from a file has its layouts");
  }
}

}  // namespace

void checkPlanParams(const CaseSpec& c) {
  harness::CostProfile profile;
  costOptionsFrom(c.params, &profile, c.dtype);
  for (const auto& [key, range] : paramRanges()) numberParam(c, key, 0);
}

std::shared_ptr<SolvedPlan> solveCasePlan(const CaseSpec& c, const std::string& algo,
                                          const std::function<void(ShardingModel&)>& prepare) {
  auto s = std::make_shared<SolvedPlan>();
  const CostOptions opts = costOptionsFrom(c.params, s->profile.get(), c.dtype);
  s->model =
      std::make_unique<ShardingModel>(reference::buildGraph(c.workload, c.shape), c.mesh, opts);
  if (prepare) prepare(*s->model);
  if (algo == "file") {
    numberParam(c, "max_memory", 0);  // the executor's promise: checked as a solve's limit is
    checkPlanFileParams(c);
    const std::string path = c.params.at("plan").get<std::string>();
    if (const auto why = harness::notARegularFile(path); !why.empty()) {
      throw harness::InputError(c.where() + ": params.plan: " + path + ": " + why);
    }
    std::ifstream in(path);
    if (!in) throw harness::InputError(c.where() + ": params.plan: cannot read " + path);
    nlohmann::json j;
    try {
      // Strict: a key given twice in a plan is refused, not the last one kept.
      j = reference::parseJsonNoDuplicates(
          std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()));
    } catch (const nlohmann::json::exception& e) {
      throw harness::InputError(path + ": not valid JSON: " + e.what());
    } catch (const std::invalid_argument& e) {
      throw harness::InputError(path + ": " + e.what());
    }
    s->plan = ShardingPlan::fromJson(j, *s->model, path);
    s->plan.shape = c.shape;
    s->json = s->plan.toJson(*s->model);
    s->edges = planEdges(*s->model, s->plan.choice);
    return s;
  }
  try {
    SolveOptions o;
    o.algo = algo;
    o.memoryLimit = numberParam(c, "max_memory", 0);
    o.timeLimitSeconds = numberParam(c, "time_limit", 60);
    o.relativeGap = numberParam(c, "mip_rel_gap", 0) / 100.0;
    o.tpAxis = static_cast<int>(numberParam(c, "tp_axis", -1));
    s->plan = solvePlan(*s->model, o);
    s->plan.shape = c.shape;
    s->json = s->plan.toJson(*s->model);
    // The edges that redistribute: the cheapest paths by the model's own pricing, what the
    // plan's prediction counted.
    s->edges = planEdges(*s->model, s->plan.choice);
  } catch (const NoPlanError& e) {
    s->problem = e.what();
  }
  return s;
}

std::vector<std::pair<std::vector<int>, CommStats>> planCommByGroup(
    const SolvedPlan& s, const CaseSpec& c, int rank, const std::vector<bool>* recomputed) {
  std::vector<std::pair<std::vector<int>, CommStats>> out;
  const auto& g = s.model->graph();
  for (size_t v = 0; v < g.nodes.size(); ++v) {
    const Candidate& cand = s.model->candidates(v)[s.plan.choice[v]];
    for (auto& p : opCommByGroup(cand.op, c.mesh, rank, c.dtype)) out.push_back(p);
    if (recomputed && v < recomputed->size() && (*recomputed)[v]) {
      for (const auto& part : opCommParts(cand.op, c.mesh, rank, c.dtype)) {
        if (!part.backward) out.emplace_back(part.axes, part.comm);
      }
    }
  }
  for (const auto& e : s.edges) {
    for (auto& p : e.forward.commByGroup(e.geometry, rank, false)) out.push_back(p);
    for (auto& p : e.backward.commByGroup(e.geometry, rank, false)) out.push_back(p);
    if (recomputed && static_cast<size_t>(e.node) < recomputed->size() &&
        (*recomputed)[static_cast<size_t>(e.node)]) {
      for (auto& p : e.forward.commByGroup(e.geometry, rank, false)) out.push_back(p);
    }
  }
  addTrainingComm(out, c);
  return out;
}

std::vector<harness::NodeComm> planCommByNode(const SolvedPlan& s, const CaseSpec& c, int rank,
                                              const std::vector<bool>* recomputed) {
  const auto& g = s.model->graph();
  std::vector<harness::NodeComm> fwd, bwd;
  for (size_t v = 0; v < g.nodes.size(); ++v) {
    fwd.push_back({g.nodes[v].name, "forward", {}});
    bwd.push_back({g.nodes[v].name, "backward", {}});
    const Candidate& cand = s.model->candidates(v)[s.plan.choice[v]];
    const bool again = recomputed && v < recomputed->size() && (*recomputed)[v];
    for (const auto& part : opCommParts(cand.op, c.mesh, rank, c.dtype)) {
      (part.backward ? bwd : fwd).back().comm += part.comm;
      // Recomputed in the backward: counted there, at the node.
      if (again && !part.backward) bwd.back().comm += part.comm;
    }
  }
  for (const auto& e : s.edges) {
    fwd[e.node].comm += e.forward.comm(e.geometry, rank, false);
    bwd[e.node].comm += e.backward.comm(e.geometry, rank, false);
    if (recomputed && static_cast<size_t>(e.node) < recomputed->size() &&
        (*recomputed)[static_cast<size_t>(e.node)]) {
      bwd[e.node].comm += e.forward.comm(e.geometry, rank, false);
    }
  }
  // The backward runs the nodes the other way.
  std::vector<harness::NodeComm> out = std::move(fwd);
  out.insert(out.end(), std::make_move_iterator(bwd.rbegin()), std::make_move_iterator(bwd.rend()));
  addTrainingComm(out, c);
  return out;
}

harness::Tolerance planTolerance(harness::Tolerance base, const SolvedPlan& s, const CaseSpec& c,
                                 const at::Tensor& expected) {
  // The plan sums partial products over ranks and runs bmm where the reference runs a
  // batched matmul: bounded as a split reduction over every rank of the longest sum.
  // Exact inputs stay integers only through sums and products: a normalisation, softmax or
  // activation makes fractions that another summation order rounds otherwise.
  if (base.exact) {
    static const std::set<std::string> kIntegerOps = {
        "embedding", "add",     "mul",   "sum",     "addmm",   "mm",        "bmm",       "matmul",
        "view",      "reshape", "split", "getitem", "permute", "transpose", "contiguous"};
    for (const auto& n : s.model->graph().nodes) {
      if (kIntegerOps.count(n.shape.op)) continue;
      base = harness::Tolerance::defaultFor(c.dtype);
      base.reason = "exact inputs leave the integers at " + n.shape.op + " (" + n.name +
                    "), so sums in another order round otherwise: judged as random inputs";
      break;
    }
  }
  int64_t length = 1;
  for (const auto& n : s.model->graph().nodes) {
    for (const auto& o : n.shape.outputs()) {
      int64_t numel = 1;
      for (int64_t d : o) numel *= d;
      length = std::max(length, numel);
    }
  }
  const harness::Tolerance split =
      harness::splitReductionTolerance(base, c.dtype, length, c.meshSize(), expected);
  // Over steps, each step's rounding moves the next step's parameters.
  return c.training.enabled() ? harness::overSteps(split, c.dtype, c.training.steps, expected)
                              : split;
}

namespace {

class PlanStrategy final : public harness::Strategy {
 public:
  std::vector<std::string> caseParams() const override {
    return {"plan",         "max_memory",           "time_limit",           "mip_rel_gap",
            "cost_profile", "intra_node_bandwidth", "inter_node_bandwidth", "tp_axis"};
  }
  // `algo` empty: the plan comes from params.plan.
  explicit PlanStrategy(std::string algo, std::string fault = "")
      : Strategy(algo.empty() ? "sharding/plan" : "sharding/auto/" + algo,
                 algo.empty() ? "plan from params.plan" : "auto-sharding: " + algo,
                 harness::Family::kSharding),
        algo_(std::move(algo)),
        fault_(std::move(fault)) {}

  std::vector<std::pair<std::string, std::string>> params() const override {
    return {{"algo", algo_.empty() ? "file" : algo_}};
  }
  nlohmann::json describe() const override {
    return {{"algo", algo_.empty() ? "file" : algo_},
            {"workloads", reference::graphWorkloads()},
            {"params",
             {"max_memory", "time_limit", "mip_rel_gap", "intra_node_bandwidth",
              "inter_node_bandwidth", "tp_axis (megatron)", "plan (sharding/plan)"}}};
  }

  std::shared_ptr<const SolvedPlan> solved(const CaseSpec& c) const {
    const std::string key = cacheKey(id(), c);
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = cache_.find(key); it != cache_.end()) return it->second;
    auto s = solveCasePlan(c, algo_.empty() ? "file" : algo_, [&](ShardingModel& m) {
      if (fault_ == kFaultRows) m.plantRowsWithoutParameters();
      if (fault_ == kFaultProgram) m.plantProgramWithoutParameterEdges();
      if (fault_ == kFaultRowsEarly) m.plantRowsFreeEarly();
    });
    cache_[key] = s;
    return s;
  }

  void checkParams(const CaseSpec& c) const override {
    checkPlanParams(c);
    if (c.params.contains("plan") && !c.params.at("plan").is_string()) {
      throw harness::InputError(c.where() +
                                ": params.plan: expected the path of a plan file, got " +
                                c.params.at("plan").dump());
    }
    if (algo_.empty() && c.params.contains("plan")) checkPlanFileParams(c);
  }

  Applicability applies(const CaseSpec& c) const override {
    if (algo_.empty() && !c.params.contains("plan")) {
      return Applicability::notApplicable("a case without params.plan (the plan file)");
    }
    if (!reference::findGraphWorkload(c.workload)) {
      return Applicability::notApplicable("not a graph workload (gpt2, bert, llama, mlp)");
    }
    if (c.mesh.empty() || c.mesh.size() > 3) {
      return Applicability::notApplicable("plans are for meshes of 1 to 3 axes");
    }
    if (c.shape.is_object() && c.shape.value("microbatches", int64_t{1}) != 1) {
      return Applicability::notApplicable(
          "the reference accumulates micro-batches (shape key microbatches); a plan runs the "
          "whole batch");
    }
    const auto s = solved(c);
    if (!s->problem.empty()) return Applicability::unsupported(s->problem);
    if (fault_ == kFault && s->edges.empty()) {
      // A fault with nothing to plant would pass as the plan itself: said, never a silent pass.
      return Applicability::unsupported(std::string(kFault) +
                                        ": this plan redistributes on no edge, nothing to skip");
    }
    return Applicability::yes();
  }

  std::unique_ptr<harness::RankExecutor> makeExecutor(const CaseSpec& c) const override {
    const double limit = numberParam(c, "max_memory", 0);
    return std::make_unique<PlanExecutor>(
        c, solved(c),
        limit > 0 ? std::optional<int64_t>(static_cast<int64_t>(limit)) : std::nullopt,
        fault_ == kFault, fault_ == kFaultReplay);
  }

  Box resultBox(const std::string& tensor, const CaseSpec& c, int rank) const override {
    return planResultBox(*solved(c), tensor, c, rank);
  }
  Box resultBoxOf(const std::string& tensor, const CaseSpec& c, int rank,
                  at::IntArrayRef fullShape) const override {
    // A step's loss and gradient norm, and AdamW's step count: every rank holds them whole.
    if (harness::isWholeTrainingResult(tensor)) return Box::whole(fullShape);
    return resultBox(tensor, c, rank);
  }

  std::vector<std::pair<std::vector<int>, CommStats>> predictCommByGroup(const CaseSpec& c,
                                                                         int rank) const override {
    return planCommByGroup(*solved(c), c, rank);
  }
  CommStats predictComm(const CaseSpec& c, int rank) const override {
    return totalComm(predictCommByGroup(c, rank));
  }
  std::optional<std::vector<harness::NodeComm>> predictCommByNode(const CaseSpec& c,
                                                                  int rank) const override {
    return planCommByNode(*solved(c), c, rank);
  }

  harness::Tolerance tolerance(const std::string& tensor, const CaseSpec& c,
                               const at::Tensor& expected) const override {
    return planTolerance(Strategy::tolerance(tensor, c, expected), *solved(c), c, expected);
  }
  bool trainsSteps() const override { return true; }
  // The replay (plan_memory.h) claims the peak to the byte on the operators it is checked on;
  // a graph with others is judged within the default 5%.
  PredictionTolerance casePredictionTolerance(const CaseSpec& c) const override {
    const auto s = solved(c);
    if (!s->problem.empty() || !unverifiedOperators(s->model->graph()).empty()) return {};
    return PredictionTolerance::exactMemory();
  }

  nlohmann::json caseDetails(const CaseSpec& c) const override {
    const auto s = solved(c);
    if (!s->problem.empty()) return {{"problem", s->problem}};
    nlohmann::json j = s->json;
    j["edges_redistributed"] = s->edges.size();
    nlohmann::json reads = nlohmann::json::array();
    for (const auto& e : s->edges) {
      reads.push_back(planReadName(s->model->graph(), e.node, e.operand));
    }
    j["edge_reads"] = reads;
    return j;
  }
  std::vector<harness::TraceValue> referenceTrace(
      const CaseSpec& c, const reference::WorkloadData& data) const override {
    const auto s = solved(c);
    return planReferenceTrace(*s->model, s->edges, c, data);
  }

  std::vector<std::string> plantableFaults() const override {
    return {kFault, kFaultRows, kFaultReplay, kFaultProgram, kFaultRowsEarly};
  }
  std::unique_ptr<harness::Strategy> withPlantedFault(const std::string& name) const override {
    if (name != kFault && name != kFaultRows && name != kFaultReplay && name != kFaultProgram &&
        name != kFaultRowsEarly) {
      return nullptr;
    }
    return std::make_unique<PlanStrategy>(algo_, name);
  }

 private:
  std::string algo_, fault_;
  mutable std::mutex mu_;
  mutable std::map<std::string, std::shared_ptr<const SolvedPlan>> cache_;
};

std::vector<std::unique_ptr<harness::Strategy>> registerAll() {
  std::vector<std::unique_ptr<harness::Strategy>> out;
  for (const auto& algo : planAlgos()) out.push_back(std::make_unique<PlanStrategy>(algo));
  out.push_back(std::make_unique<PlanStrategy>(""));
  return out;
}

}  // namespace
}  // namespace sb::strategies::autoshard

SB_REGISTER_STRATEGIES(sb::strategies::autoshard::registerAll);
