// Selective (operator-level) activation checkpointing as executors: `checkpointing/sac/<policy>`
// runs a graph workload (GPT-2, BERT, LLaMA, the residual MLP, an imported model) node by node
// through the plan executor on one rank, every block's nodes under the policy's saved-tensor
// hooks (sac_runtime.h), and is checked like every row: the output and every parameter's
// gradient (over optimizer steps: every step's loss and every parameter and optimizer state)
// against the plain LibTorch model. Bitwise where the plain graph run (the same executor without
// the policy, run once per case when the row is judged) is bitwise the reference on a tensor:
// a recomputation reruns the same kernels on the same operands and dropout seed. Where the plain
// graph run is not (an imported conv net's im2col convolution rounds otherwise than oneDNN's,
// issue 59), the policy's run is held to the plain run's own distance from the reference, no
// further, element for element at most its largest.
//
// Predicted and judged (tolerance 0): the matmul flops of the step, forward, backward and
// recomputation, and the nodes recomputed, by the recompute model (sac_runtime.h), against what
// ATen ran, counted by a RecordFunction observer, as torchtitan's test pins a policy's flops with
// FlopCounterMode; and the peak, by the plan's memory replay with the policy's saved set and
// recomputations (plan_memory.h's RecomputePolicy), to the byte on the operators the replay is
// checked on (an imported graph's within 5%, as its plans' are). What an imported operator saves
// is not in the flops model: such rows' flops are measured, and say why there is no prediction.
//
// Policies: save-all, recompute-all, torchtitan, cheap (policy.h), and `checkpointing/sac/policy`,
// whose policy is params.policy (a built-in's name or {default, ops, nodes}).

#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>

#include "harness/comm/mesh.h"
#include "harness/comm/threads_backend.h"
#include "harness/error.h"
#include "harness/measure/update_profile.h"
#include "harness/registry.h"
#include "reference/graph.h"
#include "reference/json_strict.h"
#include "reference/training.h"
#include "strategies/checkpointing/sac/budget.h"
#include "strategies/checkpointing/sac/policy.h"
#include "strategies/checkpointing/sac/sac_runtime.h"
#include "strategies/sharding/auto/model.h"
#include "strategies/sharding/auto/plan_executor.h"
#include "strategies/sharding/auto/plan_memory.h"
#include "strategies/sharding/sharding_util.h"

namespace sb::strategies::sac {
namespace {

using autoshard::PlanExecutor;
using autoshard::SolvedPlan;
using harness::Applicability;
using harness::Box;
using harness::CaseSpec;
using harness::RankContext;

constexpr const char* kFaultRng = "recompute_without_rng";
constexpr const char* kFaultFreed = "saved_freed_early";
constexpr const char* kFaultViewBase = "budget_ignores_view_base";

struct Solved {
  std::shared_ptr<const SolvedPlan> plan;
  Policy policy;
  RecomputeModel model;
  // checkpointing/sac/budget: the budget (bytes above the step's start) and the solver's plan.
  int64_t budgetBytes = 0;
  double budgetFraction = 0;
  std::optional<BudgetPlan> budget;
};

// A result of the plain graph run, kept in host memory the tracker does not count (a later row's
// peak must not include it).
struct PlainTensor {
  std::vector<int64_t> sizes;
  at::ScalarType dtype;
  std::vector<char> bytes;
  at::Tensor view() { return at::from_blob(bytes.data(), sizes, at::TensorOptions().dtype(dtype)); }
};

// The case through the plan executor without a policy, on a world of its own.
std::map<std::string, at::Tensor> plainRun(const CaseSpec& c, const Solved& s) {
  const reference::WorkloadData data =
      c.training.enabled()
          ? reference::buildTraining(c.workload, c.shape, c.dtype, c.seed, c.inputs, c.training)
          : reference::findWorkload(c.workload)->build(c.shape, c.dtype, c.seed, c.inputs);
  std::map<std::string, at::Tensor> out;
  harness::ThreadsWorld world{harness::DeviceMesh(c.mesh)};
  world.run([&](RankContext& ctx) {
    PlanExecutor plain(c, s.plan, std::nullopt, false, false);
    plain.prepare(ctx, data);
    plain.step(ctx);
    for (const auto& [name, t] : plain.results()) {
      if (t.defined()) out[name] = t.detach().clone();
    }
  });
  return out;
}

class SacExecutor final : public harness::RankExecutor {
 public:
  SacExecutor(const CaseSpec& c, std::shared_ptr<Solved> s, SacFault fault)
      : case_(c), solved_(std::move(s)), inner_(c, solved_->plan, maxMemory(c), false, false) {
    runtime_ = std::make_shared<SacRuntime>(solved_->plan->model->graph(), solved_->policy,
                                            solved_->model, fault);
    inner_.setRecompute(runtime_);
  }

  void prepare(RankContext& ctx, const reference::WorkloadData& data) override {
    inner_.prepare(ctx, data);
    // A sharded plan's ranks hold other pieces: this rank's matmul flops.
    if (case_.meshSize() > 1) {
      model_ = modelRecompute(*solved_->plan->model, solved_->plan->plan.choice, solved_->policy,
                              ctx.rank());
    }
  }
  void step(RankContext& ctx) override { inner_.step(ctx); }
  // The plan's replay with the policy (plan_memory.h's RecomputePolicy).
  std::optional<int64_t> predictedPeakBytes() const override { return inner_.predictedPeakBytes(); }
  // The plan's step by the search's cost model, the recomputations priced in (model.h's
  // RecomputePricing).
  std::optional<double> predictedTimeUs() const override {
    // A budget's plan is solved on its own operators' costs, not priced into a plan's search.
    if (solved_->budget) return std::nullopt;
    return inner_.predictedTimeUs();
  }
  // A budget's plan promises the step fits it, above what the step starts with.
  // params.max_memory: the plan's, as sharding/auto's rows promise it.
  std::optional<int64_t> memoryLimitBytes() const override {
    if (!solved_->budget) return inner_.memoryLimitBytes();
    return inner_.heldBytes() + solved_->budgetBytes;
  }
  static std::optional<int64_t> maxMemory(const CaseSpec& c) {
    if (!c.params.contains("max_memory")) return {};
    return reference::jsonWholeNumber(c.params.at("max_memory"), 1, int64_t{1} << 62);
  }
  std::map<std::string, at::Tensor> results() const override { return inner_.results(); }

  std::vector<std::pair<std::string, std::string>> recordParams() const override {
    auto out = inner_.recordParams();
    for (auto& p : runParams(*runtime_, model_, solved_->plan->model->graph())) out.push_back(p);
    if (const auto& b = solved_->budget) {
      out.emplace_back("budget", std::to_string(solved_->budgetFraction));
      out.emplace_back("budget_bytes", std::to_string(solved_->budgetBytes));
      out.emplace_back("budget_status", b->status);
      out.emplace_back("plan_from", b->chosen);
      out.emplace_back("rounds", std::to_string(b->rounds));
      out.emplace_back("ascent_replays", std::to_string(b->ascents));
      out.emplace_back("solve_seconds", std::to_string(b->seconds));
      out.emplace_back("model_peak_bytes", std::to_string(b->peak));
      out.emplace_back("keep_all_peak_bytes", std::to_string(b->keepAllPeak));
      out.emplace_back("least_peak_bytes", std::to_string(b->leastPeak));
      out.emplace_back("recompute_us", std::to_string(b->recomputeUs));
      out.emplace_back("greedy_recompute_us", std::to_string(b->greedyUs));
      out.emplace_back("greedy_peak_bytes", std::to_string(b->greedyPeak));
    }
    return out;
  }
  nlohmann::json details() const override {
    nlohmann::json j = inner_.details();
    addRunDetails(j, *runtime_, model_, solved_->plan->model->graph());
    return j;
  }
  bool capturesValues() const override { return inner_.capturesValues(); }
  void setCapture(bool on) override { inner_.setCapture(on); }
  std::vector<harness::TraceValue> captured() const override { return inner_.captured(); }

 private:
  const CaseSpec& case_;
  std::shared_ptr<Solved> solved_;
  RecomputeModel model_{solved_->model};  // this rank's (its flops)
  PlanExecutor inner_;
  std::shared_ptr<SacRuntime> runtime_;
};

class SacStrategy final : public harness::Strategy {
 public:
  // `policy` empty: params.policy.
  SacStrategy(std::string policy, std::string fault = "")
      : Strategy(
            "checkpointing/sac/" + (policy.empty() ? std::string("policy") : policy),
            "selective checkpointing: " + (policy.empty() ? std::string("params.policy") : policy),
            harness::Family::kCheckpointing),
        policy_(std::move(policy)),
        fault_(std::move(fault)) {}

  std::vector<std::string> caseParams() const override {
    // The plan the policy runs inside (sharding/auto's parameters).
    // The budget's solver plans one rank's replicated step: of the plan's keys, the cost
    // model's.
    std::vector<std::string> out = {"cost_profile", "intra_node_bandwidth", "inter_node_bandwidth",
                                    "time_limit"};
    if (policy_ == "budget") {
      out.insert(out.end(), {"budget", "budget_bytes"});
      return out;
    }
    out.insert(out.end(), {"algo", "plan", "max_memory", "mip_rel_gap", "tp_axis"});
    if (policy_.empty()) out.push_back("policy");
    return out;
  }
  std::vector<std::pair<std::string, std::string>> params() const override {
    return {{"policy", policy_.empty() ? "params.policy" : policy_}};
  }
  nlohmann::json describe() const override {
    return {{"policy", policy_.empty() ? "params.policy" : policy_},
            {"workloads", reference::graphWorkloads()},
            {"mesh", policy_ == "budget" ? "one rank"
                                         : "one rank, or a plan's ranks (params.algo) on a mesh "
                                           "of 1 to 3 axes"},
            {"params", caseParams()}};
  }

  static std::string caseKey(const CaseSpec& c) {
    return c.workload + "|" + c.shape.dump() + "|" + c.meshString() + "|" +
           harness::dtypeName(c.dtype) + "|" + c.params.dump() + "|" + std::to_string(c.seed) +
           "|" + std::to_string(static_cast<int>(c.inputs)) + "|" +
           std::to_string(c.training.steps) + c.training.optimizer.toString();
  }
  // params.algo: the plan the policy runs inside (sharding/auto's: ilp, megatron,
  // data-parallel, replicated), or params.plan: a plan file (sharding/plan's); by default the
  // search's (ilp) on a mesh, replicated on one rank.
  static std::string algoOf(const CaseSpec& c) {
    if (c.params.contains("plan")) {
      if (c.params.contains("algo")) {
        throw harness::InputError(c.where() +
                                  ": params: expected one of algo (a plan solved) and plan (a "
                                  "plan file), not both");
      }
      return "file";
    }
    if (!c.params.contains("algo")) return c.meshSize() > 1 ? "ilp" : "replicated";
    const auto& a = c.params.at("algo");
    const auto& algos = autoshard::planAlgos();
    if (!a.is_string() ||
        std::find(algos.begin(), algos.end(), a.get<std::string>()) == algos.end()) {
      throw harness::InputError(c.where() +
                                ": params.algo: expected one of ilp, megatron, data-parallel, "
                                "replicated, got " +
                                a.dump());
    }
    return a.get<std::string>();
  }

  std::shared_ptr<Solved> solved(const CaseSpec& c) const {
    // Never a solve of params that are not checked (applicabilityOf asks applies() whether a
    // case whose params failed is of this strategy's kind).
    checkParams(c);
    const std::string key = caseKey(c);
    const std::lock_guard<std::mutex> lock(mu_);
    if (auto it = cache_.find(key); it != cache_.end()) return it->second;
    auto s = std::make_shared<Solved>();
    if (policy_ == "budget") {
      auto plan = autoshard::solveCasePlan(c, "replicated");
      if (plan->problem.empty()) solveForBudget(c, *plan, *s);
      s->plan = std::move(plan);
    } else {
      nlohmann::json spec = policy_;
      if (policy_.empty()) {
        if (!c.params.contains("policy")) {
          throw harness::InputError(c.where() +
                                    ": params.policy: expected a policy's name (save-all, "
                                    "recompute-all, torchtitan, cheap) or an object "
                                    "{default, ops, nodes}");
        }
        spec = c.params.at("policy");
      }
      // The policy priced into the plan's search (its recomputations' time, its dropped
      // tensors in the rows) and into the replay that checks a plan's memory.
      s->plan = autoshard::solveCasePlan(c, algoOf(c), [&](autoshard::ShardingModel& m) {
        try {
          s->policy = resolvePolicy(m.graph(), spec);
        } catch (const std::invalid_argument& e) {
          throw harness::InputError(c.where() + ": params." + e.what());
        }
        priceRecompute(m, s->policy);
      });
    }
    // (A budget on a mesh has no policy: applies() says it is unsupported.)
    if (s->plan->problem.empty() && !s->policy.save.empty()) {
      s->model = modelRecompute(*s->plan->model, s->plan->plan.choice, s->policy);
    }
    cache_[key] = s;
    return s;
  }

  // params.budget (a fraction of keeping everything's step peak) or params.budget_bytes.
  void solveForBudget(const CaseSpec& c, const SolvedPlan& plan, Solved& s) const {
    if (c.meshSize() > 1) return;  // unsupported (applies)
    const auto& g = plan.model->graph();
    if (c.params.contains("budget") == c.params.contains("budget_bytes")) {
      throw harness::InputError(c.where() +
                                ": params: expected one of budget (a fraction of keeping "
                                "everything's peak, in (0, 1]) and budget_bytes");
    }
    const int64_t keepAll =
        replayPolicyPeak(*plan.model, plan.plan.choice,
                         makePolicy(g, "save-all", std::vector<bool>(g.nodes.size(), true)));
    if (c.params.contains("budget")) {
      s.budgetFraction = c.params.at("budget").get<double>();
      s.budgetBytes = static_cast<int64_t>(s.budgetFraction * static_cast<double>(keepAll));
    } else {
      s.budgetBytes = c.params.at("budget_bytes").get<int64_t>();
      s.budgetFraction = static_cast<double>(s.budgetBytes) / static_cast<double>(keepAll);
    }
    BudgetOptions o;
    if (c.params.contains("time_limit"))
      o.timeLimitSeconds = c.params.at("time_limit").get<double>();
    o.ignoreViewBase = fault_ == kFaultViewBase;
    s.budget = solveBudget(*plan.model, plan.plan.choice, s.budgetBytes, o);
    s.policy = s.budget->status == "infeasible"
                   ? makePolicy(g, "budget", std::vector<bool>(g.nodes.size(), false))
                   : s.budget->policy;
  }

  // Each key on its own: the cost model's, the budget's, the plan's search's, the policy's form
  // (what names nodes or operators is checked against the graph when the policy resolves).
  void checkParams(const CaseSpec& c) const override {
    const auto number = [&](const char* key, bool ok, const char* expected) {
      if (!ok) {
        throw harness::InputError(c.where() + ": params." + key + ": expected " + expected +
                                  ", got " + c.params.at(key).dump());
      }
    };
    if (policy_ == "budget") {
      if (c.params.contains("time_limit")) {
        const auto& t = c.params.at("time_limit");
        number("time_limit", t.is_number() && t.get<double>() > 0 && t.get<double>() <= 86400,
               "a number of seconds in (0, 86400]");
      }
      if (c.params.contains("budget") && c.params.contains("budget_bytes")) {
        throw harness::InputError(c.where() +
                                  ": params: expected one of budget (a fraction of keeping "
                                  "everything's peak, in (0, 1]) and budget_bytes, not both");
      }
      if (c.params.contains("budget")) {
        const auto& b = c.params.at("budget");
        number("budget", b.is_number() && b.get<double>() > 0 && b.get<double>() <= 1,
               "a fraction in (0, 1]");
      }
      if (c.params.contains("budget_bytes")) {
        const auto& b = c.params.at("budget_bytes");
        number("budget_bytes", b.is_number_integer() && b.get<int64_t>() > 0,
               "a whole number of bytes above 0");
      }
      harness::CostProfile profile;
      autoshard::costOptionsFrom(c.params, &profile, c.dtype);
      return;
    }
    autoshard::checkPlanParams(c);
    algoOf(c);
    if (c.params.contains("plan") && !c.params.at("plan").is_string()) {
      throw harness::InputError(c.where() + ": params.plan: expected the path of a plan file");
    }
    if (policy_.empty() && c.params.contains("policy")) {
      try {
        checkPolicySpec(c.params.at("policy"));
      } catch (const std::invalid_argument& e) {
        throw harness::InputError(c.where() + ": params." + e.what());
      }
    }
  }

  Applicability applies(const CaseSpec& c) const override {
    if (!reference::findGraphWorkload(c.workload)) {
      return Applicability::notApplicable("not a graph workload (gpt2, bert, llama, mlp)");
    }
    if (c.mesh.empty() || c.mesh.size() > 3) {
      return Applicability::notApplicable("plans are for meshes of 1 to 3 axes");
    }
    if (policy_ == "budget" && c.meshSize() > 1) {
      return Applicability::unsupported(
          "the budget's solver replays one rank's step; a budget inside a sharded plan is not "
          "solved yet (a named policy is: checkpointing/sac/<policy> with params.algo)");
    }
    if (c.shape.is_object() && c.shape.value("microbatches", int64_t{1}) != 1) {
      return Applicability::notApplicable(
          "the reference accumulates micro-batches (shape key microbatches); the policy runs the "
          "whole batch");
    }
    if (policy_.empty() && !c.params.contains("policy")) {
      return Applicability::notApplicable("a case without params.policy (the built-ins need none)");
    }
    if (policy_ == "budget" && !c.params.contains("budget") && !c.params.contains("budget_bytes")) {
      return Applicability::notApplicable("a case without params.budget or params.budget_bytes");
    }
    if (policy_ == "budget" && c.training.enabled()) {
      return Applicability::unsupported(
          "a budget bounds one step's activations; over optimizer steps the state is not in it "
          "yet");
    }
    const auto s = solved(c);
    if (!s->plan->problem.empty()) return Applicability::unsupported(s->plan->problem);
    const auto& regions = s->policy.region;
    if (std::all_of(regions.begin(), regions.end(), [](int r) { return r < 0; })) {
      // A policy decides inside repeated blocks: without them it would run the plain step and
      // pass as if it had checkpointed.
      return Applicability::unsupported(
          "this graph has no repeated blocks (layers its builder or the import recognises from "
          "module paths), and a policy decides inside blocks: nothing to checkpoint");
    }
    if (s->budget && s->budget->status == "infeasible") {
      return Applicability::unsupported("budget " + std::to_string(s->budgetBytes) +
                                        " B is below the least peak any policy "
                                        "reaches here: " +
                                        std::to_string(s->budget->leastPeak) +
                                        " B (recomputing every block operator; keeping all: " +
                                        std::to_string(s->budget->keepAllPeak) + " B)");
    }
    if (!fault_.empty() && !s->model.unmodelled.empty()) {
      return Applicability::unsupported(fault_ + ": " + s->model.unmodelled +
                                        "'s saving is not modelled, so whether there is anything "
                                        "to plant here is not known");
    }
    if (fault_ == kFaultRng && !s->model.recomputesDropout) {
      return Applicability::unsupported(
          std::string(kFaultRng) + ": this policy recomputes no dropout here, nothing to plant");
    }
    if (fault_ == kFaultFreed && !s->model.savedTwice) {
      return Applicability::unsupported(
          std::string(kFaultFreed) +
          ": no recomputed tensor has two backward readers here, nothing to plant");
    }
    return Applicability::yes();
  }

  std::unique_ptr<harness::RankExecutor> makeExecutor(const CaseSpec& c) const override {
    const SacFault f = fault_ == kFaultRng     ? SacFault::kRecomputeWithoutRng
                       : fault_ == kFaultFreed ? SacFault::kSavedFreedEarly
                                               : SacFault::kNone;
    return std::make_unique<SacExecutor>(c, solved(c), f);
  }

  Box resultBox(const std::string& tensor, const CaseSpec& c, int rank) const override {
    return autoshard::planResultBox(*solved(c)->plan, tensor, c, rank);
  }
  Box resultBoxOf(const std::string& tensor, const CaseSpec& c, int rank,
                  at::IntArrayRef fullShape) const override {
    if (harness::isWholeTrainingResult(tensor)) return Box::whole(fullShape);
    return resultBox(tensor, c, rank);
  }
  // The plan's collectives and redistributions, and the recomputed nodes' forward ones again in
  // their backward.
  std::vector<std::pair<std::vector<int>, harness::CommStats>> predictCommByGroup(
      const CaseSpec& c, int rank) const override {
    const auto s = solved(c);
    return autoshard::planCommByGroup(*s->plan, c, rank, &s->model.recomputed);
  }
  harness::CommStats predictComm(const CaseSpec& c, int rank) const override {
    return totalComm(predictCommByGroup(c, rank));
  }
  std::optional<std::vector<harness::NodeComm>> predictCommByNode(const CaseSpec& c,
                                                                  int rank) const override {
    const auto s = solved(c);
    return autoshard::planCommByNode(*s->plan, c, rank, &s->model.recomputed);
  }
  // The plan's replay with the policy's saved set and recomputations (plan_memory.h) claims the
  // peak to the byte on the operators it is checked on; a graph with others is judged within
  // the default 5%.
  PredictionTolerance casePredictionTolerance(const CaseSpec& c) const override {
    if (!autoshard::unverifiedOperators(solved(c)->plan->model->graph()).empty()) return {};
    return PredictionTolerance::exactMemory();
  }
  bool trainsSteps() const override { return true; }

  harness::Tolerance tolerance(const std::string& tensor, const CaseSpec& c,
                               const at::Tensor& expected) const override {
    const auto s = solved(c);
    if (c.meshSize() > 1) {
      // Each rank's pieces are judged against the reference as the plan's own rows are (a
      // recomputation reruns the rank's kernels and collectives on the same operands).
      return autoshard::planTolerance(Strategy::tolerance(tensor, c, expected), *s->plan, c,
                                      expected);
    }
    at::Tensor plain;
    {
      // One case's plain run at a time, shared by the policies (rows run case by case).
      static std::mutex mu;
      static std::string key;
      static std::map<std::string, PlainTensor> results;
      const std::lock_guard<std::mutex> lock(mu);
      const std::string k = caseKey(c);
      if (key != k) {
        results.clear();
        for (const auto& [name, t] : plainRun(c, *s)) {
          const at::Tensor h = t.cpu().contiguous();
          PlainTensor p{h.sizes().vec(), h.scalar_type(), std::vector<char>(h.nbytes())};
          std::memcpy(p.bytes.data(), h.data_ptr(), h.nbytes());
          results.emplace(name, std::move(p));
        }
        key = k;
      }
      if (auto it = results.find(tensor); it != results.end()) plain = it->second.view().clone();
    }
    if (plain.defined() && plain.sizes() == expected.sizes() &&
        plain.scalar_type() == expected.scalar_type() &&
        at::equal(plain, expected.to(plain.device()))) {
      return harness::Tolerance::bitwise(
          "the plain graph run is bitwise the reference here, and a recomputation reruns its "
          "kernels on the same operands and dropout seed");
    }
    if (!plain.defined() || plain.sizes() != expected.sizes()) {
      return autoshard::planTolerance(Strategy::tolerance(tensor, c, expected), *s->plan, c,
                                      expected);
    }
    // The plain run's own distance from the reference, and no further.
    const double off = (plain.to(at::kDouble) - expected.to(plain.device()).to(at::kDouble))
                           .abs()
                           .max()
                           .item<double>();
    harness::Tolerance t;
    t.atol = off;
    t.rtol = 0;
    char buf[64];
    snprintf(buf, sizeof buf, "%.6g", off);
    t.reason = std::string("the plain graph run is ") + buf +
               " from the reference on this tensor (another rounding order); a recomputation "
               "reruns its kernels, so the policy's run is held to that distance";
    return t;
  }

  nlohmann::json caseDetails(const CaseSpec& c) const override {
    const auto s = solved(c);
    const auto& g = s->plan->model->graph();
    nlohmann::json nodes = nlohmann::json::object();
    for (size_t v = 0; v < g.nodes.size(); ++v) {
      if (s->policy.region[v] < 0) continue;
      nodes[g.nodes[v].name] = s->policy.save[v] ? "save" : "recompute";
    }
    return {{"policy", s->policy.name}, {"decisions", nodes}};
  }

  std::vector<std::string> plantableFaults() const override {
    if (policy_ == "budget") return {kFaultRng, kFaultFreed, kFaultViewBase};
    return {kFaultRng, kFaultFreed};
  }
  std::unique_ptr<harness::Strategy> withPlantedFault(const std::string& name) const override {
    if (name != kFaultRng && name != kFaultFreed &&
        !(name == kFaultViewBase && policy_ == "budget")) {
      return nullptr;
    }
    return std::make_unique<SacStrategy>(policy_, name);
  }

 private:
  std::string policy_, fault_;
  mutable std::mutex mu_;
  mutable std::map<std::string, std::shared_ptr<Solved>> cache_;
};

std::vector<std::unique_ptr<harness::Strategy>> registerAll() {
  std::vector<std::unique_ptr<harness::Strategy>> out;
  for (const auto& p : builtinPolicies()) out.push_back(std::make_unique<SacStrategy>(p));
  out.push_back(std::make_unique<SacStrategy>(""));
  out.push_back(std::make_unique<SacStrategy>("budget"));
  return out;
}

}  // namespace
}  // namespace sb::strategies::sac

SB_REGISTER_STRATEGIES(sb::strategies::sac::registerAll);
