#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "harness/registry.h"
#include "strategies/test/test_util.h"

namespace sb::strategies {
namespace {

using test::param;
using test::strategy;

// CI-sized instances of every chain workload, dropout on where the workload has it.
const std::map<std::string, nlohmann::json>& workloads() {
  static const std::map<std::string, nlohmann::json> w = {
      {"mlp_chain", {{"batch", 8}, {"width", 32}, {"depth", 6}, {"dropout", 0.2}}},
      {"gpt2_stack",
       {{"batch", 2}, {"seq", 16}, {"d_model", 32}, {"heads", 4}, {"layers", 3}, {"dropout", 0.2}}},
      {"resnet18", {{"batch", 2}, {"image", 32}, {"width", 8}}},
      {"densenet121",
       {{"batch", 2}, {"image", 32}, {"growth", 8}, {"init", 8}, {"blocks", {8, 4, 2, 2}}}},
  };
  return w;
}

harness::CaseSpec chainCase(const std::string& workload, double budget) {
  harness::CaseSpec c = test::linearCase({1, 1}, 1, {1});
  c.workload = workload;
  c.shape = workloads().at(workload);
  if (budget > 0) c.params["budget"] = budget;
  return c;
}

class CheckpointExecutor : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

// Every solver on every workload (the fixed schedules none, full and sqrt unconstrained, the
// budget-driven ones at 85% of keeping every tape, where they must recompute): the
// gradients of every parameter, the input's gradient, the output and the batch-norm buffers
// are all compared bitwise with the plain run.
TEST_P(CheckpointExecutor, GivesBitwiseTheGradientsAndBuffersOfThePlainRun) {
  const auto& [workload, solver] = GetParam();
  const bool fixed = solver == "none" || solver == "full" || solver == "sqrt";
  const auto c = chainCase(workload, fixed ? 0 : 0.85);
  const auto rec = test::run(c, strategy("checkpointing/" + solver));
  if (rec.status == harness::Status::kUnsupported) {
    EXPECT_NE(rec.message.find("fits a budget"), std::string::npos) << rec.message;
    GTEST_SKIP() << solver << " has no schedule within 85% on " << workload << ": " << rec.message;
  }
  ASSERT_EQ(rec.status, harness::Status::kPass) << rec.message;
  EXPECT_EQ(*rec.maxAbsErr, 0.0);
  EXPECT_EQ(rec.tolerance.rfind("bitwise", 0), 0u) << rec.tolerance;
  const auto& checks = rec.details["tensors"];
  bool sawGrad = false, sawBuffer = false;
  for (const auto& t : checks) {
    const std::string name = t["tensor"];
    sawGrad |= name.rfind("grad/", 0) == 0;
    sawBuffer |= name.rfind("buffer/", 0) == 0;
  }
  EXPECT_TRUE(sawGrad);
  if (workload == "resnet18" || workload == "densenet121") {
    EXPECT_TRUE(sawBuffer);
  }
  // The memory model is exact to the byte (chain.h: rotor's model plus the step's own terms),
  // so the prediction is the tracker's measurement, and the budget a promise the row keeps.
  ASSERT_TRUE(rec.peakMemBytes && rec.predictedMemBytes);
  EXPECT_EQ(*rec.peakMemBytes, *rec.predictedMemBytes) << workload << " " << solver;
  EXPECT_EQ(rec.mispredicted, "");
  EXPECT_EQ(rec.details["prediction"]["memory"]["relative_error"].get<double>(), 0.0);
  if (!fixed) {
    EXPECT_LE(std::stod(param(rec, "model_peak_bytes")), std::stod(param(rec, "budget_bytes")));
    ASSERT_TRUE(rec.details.contains("memory_limit_bytes_per_rank")) << rec.details.dump();
    EXPECT_LE(*rec.peakMemBytes, rec.details["memory_limit_bytes_per_rank"][0].get<int64_t>());
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllWorkloadsAndSolvers, CheckpointExecutor,
    ::testing::Combine(::testing::Values("mlp_chain", "gpt2_stack", "resnet18", "densenet121"),
                       ::testing::Values("none", "full", "sqrt", "greedy", "revolve", "rotor")),
    [](const auto& info) { return std::get<0>(info.param) + "_" + std::get<1>(info.param); });

TEST(CheckpointExecutorBudget, RotorRecomputesUnderATightBudgetAndStillMatches) {
  for (const auto& [workload, shape] : workloads()) {
    // The smallest budget in steps of 5% that rotor can meet.
    harness::Record rec;
    for (double b = 0.3; b <= 1.0; b += 0.05) {
      rec = test::run(chainCase(workload, b), strategy("checkpointing/rotor"));
      if (rec.status != harness::Status::kUnsupported) break;
    }
    ASSERT_EQ(rec.status, harness::Status::kPass) << workload << ": " << rec.message;
    EXPECT_GT(std::stoi(param(rec, "recomputed_forwards")), 0) << workload;
    EXPECT_LT(std::stod(param(rec, "model_peak_bytes")), std::stod(param(rec, "none_peak_bytes")))
        << workload;
  }
}

TEST(CheckpointExecutorBudget, AnInfeasibleBudgetIsAnUnsupportedRowThatSaysSo) {
  const auto rec = test::run(chainCase("mlp_chain", 0.01), strategy("checkpointing/rotor"));
  EXPECT_EQ(rec.status, harness::Status::kUnsupported);
  EXPECT_NE(rec.message.find("no rotor schedule fits a budget of"), std::string::npos)
      << rec.message;
}

// Over optimizer steps: every solver's schedule runs each step's forward and backward, the
// generator runs on across the steps, and LibTorch's optimizer updates the parameters between
// them. Every step's loss and gradient norm, every parameter and optimizer state after the
// last, the buffers and the generator: bitwise with the plain loop; the peak to the byte
// (the optimizer's state alive through every backward after the first).
harness::CaseSpec trainingCase(const std::string& workload, double budget, int steps) {
  harness::CaseSpec c = chainCase(workload, budget);
  c.training.steps = steps;
  c.training.optimizer = reference::OptimizerSpec::fromJson(
      {{"kind", "adamw"}, {"lr", 0.01}, {"clip_grad_norm", 1.0}}, "test");
  return c;
}

TEST(CheckpointExecutorSteps, EverySolverTrainsBitwiseLikeThePlainLoopAndPredictsItsPeak) {
  for (const char* workload : {"mlp_chain", "gpt2_stack"}) {
    for (const char* solver : {"none", "full", "sqrt", "greedy", "revolve", "rotor"}) {
      const std::string s = solver;
      const bool fixed = s == "none" || s == "full" || s == "sqrt";
      const auto c = trainingCase(workload, fixed ? 0 : 0.85, 3);
      const auto rec = test::run(c, strategy("checkpointing/" + s));
      if (rec.status == harness::Status::kUnsupported) continue;
      ASSERT_EQ(rec.status, harness::Status::kPass) << workload << " " << s << ": " << rec.message;
      EXPECT_EQ(rec.mispredicted, "") << workload << " " << s;
      EXPECT_EQ(*rec.peakMemBytes, *rec.predictedMemBytes) << workload << " " << s;
      std::set<std::string> seen;
      for (const auto& t : rec.details["tensors"]) seen.insert(t["tensor"].get<std::string>());
      for (const char* want : {"loss", "grad_norm", "state/step", "rng/cpu"}) {
        EXPECT_TRUE(seen.count(want)) << workload << " " << s << " checks no " << want;
      }
      EXPECT_TRUE(std::any_of(seen.begin(), seen.end(), [](const std::string& n) {
        return n.rfind("state/", 0) == 0 && n.find("/exp_avg_sq") != std::string::npos;
      }));
    }
  }
}

// Leaving the generator where a recomputation left it shows, over steps, as the second step's
// masks: its loss and every later one differ, the first step's is right.
TEST(CheckpointPlantedFault, TheGeneratorLeftBehindBreaksTheNextStepsLoss) {
  const auto faulty = strategy("checkpointing/full").withPlantedFault("rng_left_after_recompute");
  ASSERT_TRUE(faulty);
  const auto rec = test::run(trainingCase("mlp_chain", 0, 3), *faulty);
  ASSERT_EQ(rec.status, harness::Status::kFail) << rec.message;
  bool sawLoss = false;
  for (const auto& t : rec.details["tensors"]) {
    if (t["tensor"] != "loss") continue;
    sawLoss = true;
    EXPECT_EQ(t["mismatches"], 2) << t.dump();  // steps 2 and 3, not step 1
  }
  EXPECT_TRUE(sawLoss);
}

// Planted faults: each must be reported as `fail`, not pass and not error.
TEST(CheckpointPlantedFault, RecomputingWithoutRestoringTheGeneratorFails) {
  const auto faulty = strategy("checkpointing/full").withPlantedFault("no_rng_restore");
  ASSERT_TRUE(faulty);
  const auto rec = test::run(chainCase("mlp_chain", 0), *faulty);
  EXPECT_EQ(rec.status, harness::Status::kFail) << rec.message;
  EXPECT_GT(*rec.mismatches, 0);
  // The same strategy without the fault passes: the dropout masks are what differ.
  EXPECT_EQ(test::run(chainCase("mlp_chain", 0), strategy("checkpointing/full")).status,
            harness::Status::kPass);
}

TEST(CheckpointPlantedFault, ARecomputedStageReadingAStaleInputFails) {
  const auto faulty = strategy("checkpointing/full").withPlantedFault("stale_input");
  ASSERT_TRUE(faulty);
  for (const char* w : {"mlp_chain", "gpt2_stack"}) {
    const auto rec = test::run(chainCase(w, 0), *faulty);
    EXPECT_EQ(rec.status, harness::Status::kFail) << w << ": " << rec.message;
  }
}

// The state a step leaves for the next one is compared too: a recomputation that does not put
// the generator back computes every number right and still breaks the next step's masks.
TEST(CheckpointPlantedFault, LeavingTheGeneratorWhereARecomputationLeftItFailsOnTheStateAfter) {
  const auto faulty = strategy("checkpointing/full").withPlantedFault("rng_left_after_recompute");
  ASSERT_TRUE(faulty);
  const auto rec = test::run(chainCase("mlp_chain", 0), *faulty);
  EXPECT_EQ(rec.status, harness::Status::kFail) << rec.message;
  EXPECT_EQ(rec.worstTensor, "rng/cpu") << rec.message;
  for (const auto& t : rec.details["tensors"]) {
    if (t["tensor"] != "rng/cpu") {
      EXPECT_EQ(t["mismatches"], 0) << t.dump();
    }
  }
  // Without dropout there is nothing to recompute differently: the fault is dormant.
  EXPECT_EQ(test::run(chainCase("resnet18", 0), *faulty).status, harness::Status::kPass);
}

// The budget is judged on the measured peak: a solver that ignores it computes every number
// right and still fails, on memory alone.
TEST(CheckpointPlantedFault, ASolverThatIgnoresTheBudgetFailsOnTheMeasuredPeak) {
  const auto faulty = strategy("checkpointing/rotor").withPlantedFault("ignore_budget");
  ASSERT_TRUE(faulty);
  const auto c = chainCase("mlp_chain", 0.6);
  const auto rec = test::run(c, *faulty);
  EXPECT_EQ(rec.status, harness::Status::kFail) << rec.message;
  EXPECT_EQ(*rec.mismatches, 0) << "the numbers are right; only the budget is broken";
  EXPECT_NE(rec.message.find("bytes it promised to stay within"), std::string::npos) << rec.message;
  // The prediction is still exact: the schedule is just not the one the budget allows.
  EXPECT_EQ(rec.mispredicted, "");
  const auto honest = test::run(c, strategy("checkpointing/rotor"));
  EXPECT_EQ(honest.status, harness::Status::kPass) << honest.message;
  EXPECT_LT(*honest.peakMemBytes, *rec.peakMemBytes);
}

// Memory is judged after every operation, not only at the peak: stage inputs kept to the end
// of the step (a leak) leave every number right and, under a budget the kept inputs stay
// within, the peak too; what is held after the backward that should have freed them is over
// the simulation's, and the row is mispredicted there.
TEST(CheckpointPlantedFault, AnInputKeptPastItsBackwardIsFlaggedWhereItShouldHaveGone) {
  const auto faulty = strategy("checkpointing/sqrt").withPlantedFault("keep_input_to_end");
  ASSERT_TRUE(faulty);
  const auto c = chainCase("mlp_chain", 0);
  const auto rec = test::run(c, *faulty);
  EXPECT_EQ(*rec.mismatches, 0) << "the numbers are right; only memory is held too long";
  const auto& held = rec.details["executor"]["held_after_operations"];
  EXPECT_GT(held["over_the_model"].get<int>(), 0) << held.dump();
  // Named where it starts: the first backward after which an input stays held.
  EXPECT_EQ(held["first_over"]["operation"].get<std::string>().rfind("B_", 0), 0u) << held.dump();
  EXPECT_LE(held["first_over"]["index"].get<int>(), held["most_over"]["index"].get<int>());
  EXPECT_NE(rec.message.find("held_memory (memory held after " +
                             held["first_over"]["operation"].get<std::string>()),
            std::string::npos)
      << rec.message;
  EXPECT_NE(rec.message.find("over what the schedule holds"), std::string::npos) << rec.message;
  EXPECT_FALSE(rec.mispredicted.empty());

  const auto honest = test::run(c, strategy("checkpointing/sqrt"));
  EXPECT_EQ(honest.status, harness::Status::kPass) << honest.message;
  EXPECT_EQ(honest.mispredicted, "") << honest.message;
  const auto& fine = honest.details["executor"]["held_after_operations"];
  EXPECT_EQ(fine["over_the_model"], 0) << fine.dump();
  EXPECT_EQ(fine["operations_measured"], held["operations_measured"]);
  // `none` holds no input on its own past the forward: the fault has nothing to keep.
  const auto none = strategy("checkpointing/none").withPlantedFault("keep_input_to_end");
  const auto dormant = test::run(c, *none);
  EXPECT_EQ(dormant.mispredicted, "") << dormant.message;
  EXPECT_EQ(dormant.details["executor"]["held_after_operations"]["over_the_model"], 0);
}

// rotor's optimum is checked in every row against its reference program (the same recurrence,
// filled by code that shares nothing with the fast table's fill). A fast table that misses
// moves (short_leaf_runs: leaf runs of at most two forwards) gives valid schedules within the
// budget, with every number right, that are slower than the optimum: flagged; where it finds
// none at all, the row errors instead of reading as unsupported.
// Two programs sum the same stage times in different orders: a schedule as fast as the
// optimum can read a few ulps apart (1802.8850000000002 against ...04 on one host), which is
// what solver_optimum's relative tolerance of 1e-12 allows for.
bool sameTime(const nlohmann::json& a, const nlohmann::json& b) {
  if (!a.is_number() || !b.is_number()) return a == b;
  const double x = a.get<double>(), y = b.get<double>();
  return std::abs(x - y) <= 1e-12 * std::max(std::abs(x), std::abs(y));
}

TEST(CheckpointPlantedFault, ASuboptimalRotorIsFlaggedAgainstItsReferenceProgram) {
  const auto faulty = strategy("checkpointing/rotor").withPlantedFault("short_leaf_runs");
  ASSERT_TRUE(faulty);
  EXPECT_FALSE(strategy("checkpointing/sqrt").withPlantedFault("short_leaf_runs"))
      << "only rotor has the fast table";
  int flagged = 0, errored = 0, honestRows = 0;
  // suites/checkpointing.yaml's MLP: twelve stages, where long runs of forwards pay.
  for (const std::string workload : {"mlp_chain"}) {
    for (double budget : {0.3, 0.4, 0.5, 0.6, 0.7, 0.8}) {
      auto c = chainCase(workload, budget);
      c.shape = {{"batch", 32}, {"width", 128}, {"depth", 12}, {"dropout", 0.1}};
      const auto honest = test::run(c, strategy("checkpointing/rotor"));
      if (honest.status == harness::Status::kUnsupported) continue;
      ++honestRows;
      ASSERT_EQ(honest.status, harness::Status::kPass) << honest.message;
      EXPECT_EQ(honest.mispredicted, "") << workload << " " << budget << ": " << honest.message;
      const auto& o = honest.details["executor"]["optimum"];
      ASSERT_TRUE(o["checked"].get<bool>()) << o.dump();
      EXPECT_TRUE(sameTime(o["time_us"], o["reference_time_us"])) << o.dump();

      const auto rec = test::run(c, *faulty);
      if (rec.status == harness::Status::kError) {
        EXPECT_NE(rec.message.find("reference program finds one"), std::string::npos)
            << rec.message;
        ++errored;
        continue;
      }
      ASSERT_EQ(rec.status, harness::Status::kPass) << rec.message;
      EXPECT_EQ(*rec.mismatches, 0);
      const auto& f = rec.details["executor"]["optimum"];
      if (sameTime(f["time_us"], f["reference_time_us"])) {
        EXPECT_EQ(rec.mispredicted, "") << "the fault made no difference here";
        continue;
      }
      EXPECT_GT(f["time_us"].get<double>(), f["reference_time_us"].get<double>()) << f.dump();
      EXPECT_NE(rec.message.find("against the reference program's optimum"), std::string::npos)
          << rec.message;
      ++flagged;
    }
  }
  EXPECT_GT(honestRows, 3);
  EXPECT_GT(flagged + errored, 2) << "few cases where the missed moves mattered";
}

TEST(CheckpointPlantedFault, WithoutRecomputationThereIsNothingForTheFaultsToBreak) {
  // `none` never recomputes: the planted faults are dormant and the row passes, which shows
  // the failures above come from recomputation, not from the fault plumbing.
  const auto faulty = strategy("checkpointing/none").withPlantedFault("no_rng_restore");
  EXPECT_EQ(test::run(chainCase("mlp_chain", 0), *faulty).status, harness::Status::kPass);
}

}  // namespace
}  // namespace sb::strategies

namespace sb::strategies {
namespace {

// A wrapper of a correct strategy (checkpointing/none, whose numbers and memory prediction are
// exact) that changes only what it promises: a memory limit (RankExecutor::memoryLimitBytes),
// a prediction scaled away from the truth, the tolerance it claims for that prediction.
struct Promises {
  std::optional<int64_t> limit;
  double predictionScale = 1.0;
  std::optional<double> memoryTolerance = 0.05;
};

class PromisingExecutor final : public harness::RankExecutor {
 public:
  PromisingExecutor(std::unique_ptr<harness::RankExecutor> inner, Promises p)
      : inner_(std::move(inner)), p_(p) {}
  void prepare(harness::RankContext& ctx, const reference::WorkloadData& d) override {
    inner_->prepare(ctx, d);
  }
  void step(harness::RankContext& ctx) override { inner_->step(ctx); }
  std::map<std::string, at::Tensor> results() const override { return inner_->results(); }
  std::optional<int64_t> memoryLimitBytes() const override { return p_.limit; }
  std::optional<int64_t> predictedPeakBytes() const override {
    return static_cast<int64_t>(static_cast<double>(*inner_->predictedPeakBytes()) *
                                p_.predictionScale);
  }

 private:
  std::unique_ptr<harness::RankExecutor> inner_;
  Promises p_;
};

class PromisingStrategy final : public harness::SingleRankStrategy {
 public:
  PromisingStrategy(const harness::Strategy& inner, Promises p)
      : SingleRankStrategy("test/promising", "promising", harness::Family::kCheckpointing),
        inner_(inner),
        p_(p) {}
  harness::Applicability applies(const harness::CaseSpec& c) const override {
    return inner_.applies(c);
  }
  std::unique_ptr<harness::RankExecutor> makeExecutor(const harness::CaseSpec& c) const override {
    return std::make_unique<PromisingExecutor>(inner_.makeExecutor(c), p_);
  }
  PredictionTolerance predictionTolerance() const override {
    PredictionTolerance t;
    t.memory = p_.memoryTolerance;
    return t;
  }

 private:
  const harness::Strategy& inner_;
  Promises p_;
};

// A prediction is judged against its measurement: off by more than the strategy's stated
// tolerance, the row is flagged `mispredicted` (the gate fails on it); within it, not.
TEST(PredictionVerdict, AMemoryPredictionPastItsToleranceIsFlaggedMispredicted) {
  const auto& none = strategy("checkpointing/none");
  const auto c = chainCase("mlp_chain", 0);
  // 20% under the measurement, against the default claim of 5%.
  const auto off = test::run(c, PromisingStrategy(none, {std::nullopt, 0.8, 0.05}));
  EXPECT_EQ(off.status, harness::Status::kPass) << "the numbers are right";
  EXPECT_EQ(off.mispredicted, "memory");
  EXPECT_NE(off.message.find("mispredicted: memory measured"), std::string::npos) << off.message;
  EXPECT_NEAR(off.details["prediction"]["memory"]["relative_error"].get<double>(), 0.2, 1e-3);
  // 3% off is within the 5% claimed; and a strategy that claims nothing is never flagged.
  EXPECT_EQ(test::run(c, PromisingStrategy(none, {std::nullopt, 0.97, 0.05})).mispredicted, "");
  const auto unclaimed = test::run(c, PromisingStrategy(none, {std::nullopt, 0.5, std::nullopt}));
  EXPECT_EQ(unclaimed.mispredicted, "");
  EXPECT_EQ(unclaimed.details["prediction"]["memory"]["tolerance"], "none");
}

// A strategy that promises a memory limit is judged on it: the same correct executor passes
// under a limit it keeps and fails, on memory alone, under one it breaks.
TEST(MemoryPromise, AMeasuredPeakOverTheLimitAStrategyPromisedFailsTheRow) {
  const auto& none = strategy("checkpointing/none");
  const auto c = chainCase("mlp_chain", 0);
  const auto kept = test::run(c, PromisingStrategy(none, {int64_t{1} << 40}));
  ASSERT_EQ(kept.status, harness::Status::kPass) << kept.message;
  ASSERT_TRUE(kept.peakMemBytes);
  const int64_t half = *kept.peakMemBytes / 2;
  const auto broken = test::run(c, PromisingStrategy(none, {half}));
  EXPECT_EQ(broken.status, harness::Status::kFail);
  EXPECT_EQ(*broken.mismatches, 0) << "the numbers are right; only the promise is broken";
  EXPECT_NE(
      broken.message.find("over the " + std::to_string(half) + " bytes it promised to stay within"),
      std::string::npos)
      << broken.message;
  EXPECT_EQ(broken.details["memory_limit_bytes_per_rank"][0].get<int64_t>(), half);
}

}  // namespace
}  // namespace sb::strategies
