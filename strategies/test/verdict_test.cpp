// The verdicts that no strategy exercised: a time prediction against a stated tolerance, the
// runner's coverage check, and memory models that claim to be exact judged exactly.
//
// Each is proved the way a planted fault proves a strategy's check: a wrapper of a correct
// strategy changes exactly one thing (its prediction, the boxes it declares), the row must be
// flagged or fail for that one thing, and the same wrapper without the change must not be.

#include <gtest/gtest.h>

#include <chrono>
#include <optional>

#include "harness/box.h"
#include "strategies/test/test_util.h"

namespace sb::strategies {
namespace {

using harness::Status;

// What a wrapper changes of the strategy it wraps.
struct Change {
  // Each step also spins for this long, and the executor predicts predictedUs with the stated
  // time tolerance (none: the inner executor's prediction, if any).
  std::optional<double> paceUs, predictedUs, timeTolerance;
  // The memory prediction, scaled.
  double memoryScale = 1.0;
  // Every rank declares (and returns) the tensors without their last index on dimension 0.
  bool dropLastRow = false;
  // Each step keeps this many bytes more, allocated on the rank, until the executor goes.
  int64_t leakBytesPerStep = 0;
};

at::Tensor dropLast(const at::Tensor& t) { return t.dim() > 0 ? t.narrow(0, 0, t.size(0) - 1) : t; }

class ChangedExecutor final : public harness::RankExecutor {
 public:
  ChangedExecutor(std::unique_ptr<harness::RankExecutor> inner, Change ch)
      : inner_(std::move(inner)), ch_(ch) {}
  void prepare(harness::RankContext& ctx, const reference::WorkloadData& d) override {
    inner_->prepare(ctx, d);
  }
  void step(harness::RankContext& ctx) override {
    const auto start = std::chrono::steady_clock::now();
    inner_->step(ctx);
    if (ch_.leakBytesPerStep > 0) leaked_.push_back(at::empty({ch_.leakBytesPerStep}, at::kByte));
    if (ch_.paceUs) {
      const auto until = start + std::chrono::microseconds(static_cast<int64_t>(*ch_.paceUs));
      while (std::chrono::steady_clock::now() < until) {
      }
    }
  }
  void settle(harness::RankContext& ctx) override { inner_->settle(ctx); }
  std::map<std::string, at::Tensor> results() const override {
    auto r = inner_->results();
    if (ch_.dropLastRow) {
      for (auto& [name, t] : r) t = dropLast(t);
    }
    return r;
  }
  std::optional<int64_t> predictedPeakBytes() const override {
    const auto p = inner_->predictedPeakBytes();
    if (!p) return p;
    return static_cast<int64_t>(static_cast<double>(*p) * ch_.memoryScale);
  }
  std::optional<double> predictedTimeUs() const override {
    return ch_.predictedUs ? ch_.predictedUs : inner_->predictedTimeUs();
  }
  std::optional<int64_t> memoryLimitBytes() const override { return inner_->memoryLimitBytes(); }
  std::vector<std::pair<std::string, std::string>> recordParams() const override {
    return inner_->recordParams();
  }

 private:
  std::unique_ptr<harness::RankExecutor> inner_;
  Change ch_;
  std::vector<at::Tensor> leaked_;
};

class ChangedStrategy final : public harness::Strategy {
 public:
  ChangedStrategy(const harness::Strategy& inner, Change ch)
      : Strategy(inner.id(), inner.displayName(), inner.family()), inner_(inner), ch_(ch) {}
  std::vector<std::string> caseParams() const override { return inner_.caseParams(); }
  void checkParams(const harness::CaseSpec& c) const override { inner_.checkParams(c); }
  harness::Applicability applies(const harness::CaseSpec& c) const override {
    return inner_.applies(c);
  }
  std::unique_ptr<harness::RankExecutor> makeExecutor(const harness::CaseSpec& c) const override {
    return std::make_unique<ChangedExecutor>(inner_.makeExecutor(c), ch_);
  }
  harness::Box resultBox(const std::string& t, const harness::CaseSpec& c,
                         int rank) const override {
    return inner_.resultBox(t, c, rank);
  }
  harness::Box resultBoxOf(const std::string& t, const harness::CaseSpec& c, int rank,
                           at::IntArrayRef full) const override {
    harness::Box b = inner_.resultBoxOf(t, c, rank, full);
    if (ch_.dropLastRow && !b.length.empty()) {
      // The inner strategy replicates: every rank holds the whole tensor, and now all but its
      // last row.
      b.length[0] = std::min(b.length[0], full[0] - 1 - b.offset[0]);
    }
    return b;
  }
  harness::CommStats predictComm(const harness::CaseSpec& c, int rank) const override {
    return inner_.predictComm(c, rank);
  }
  std::optional<int64_t> predictPeakMemory(const harness::CaseSpec& c, int rank) const override {
    const auto p = inner_.predictPeakMemory(c, rank);
    if (!p) return p;
    return static_cast<int64_t>(static_cast<double>(*p) * ch_.memoryScale);
  }
  harness::Tolerance tolerance(const std::string& t, const harness::CaseSpec& c,
                               const at::Tensor& expected) const override {
    return inner_.tolerance(t, c, expected);
  }
  PredictionTolerance casePredictionTolerance(const harness::CaseSpec& c) const override {
    PredictionTolerance t = inner_.casePredictionTolerance(c);
    if (ch_.timeTolerance) t.time = ch_.timeTolerance;
    return t;
  }

 private:
  const harness::Strategy& inner_;
  Change ch_;
};

harness::Record runChanged(const harness::CaseSpec& c, const std::string& id, Change ch) {
  return test::run(c, ChangedStrategy(test::strategy(id), ch));
}

// --- Time: a prediction off by 2x against a stated tolerance is flagged. -----------------------

// Each step spins for 50 ms (the wrapped step takes well under one), so the measured median is
// 50 ms plus scheduling; a strategy that states 50% is right at 50 ms and wrong at 100 ms.
TEST(TimeVerdict, APredictionOffByTwoTimesPastItsStatedToleranceIsFlaggedMispredicted) {
  const auto c = test::linearCase({8, 16}, 8, {2});
  const std::string id = "sharding/linear/RR=RR.RR";
  const auto honest = runChanged(c, id, {50'000, 50'000, 0.5});
  ASSERT_EQ(honest.status, Status::kPass) << honest.message;
  ASSERT_TRUE(honest.timing);
  EXPECT_GE(honest.timing->medianUs, 50'000);
  EXPECT_EQ(honest.mispredicted, "") << honest.message;
  EXPECT_EQ(honest.details["prediction"]["time"]["tolerance"].get<double>(), 0.5);

  const auto twice = runChanged(c, id, {50'000, 100'000, 0.5});
  EXPECT_EQ(twice.status, Status::kPass) << "the numbers are right; only the time is wrong";
  EXPECT_EQ(twice.mispredicted, "time");
  EXPECT_NE(twice.message.find("mispredicted: time measured"), std::string::npos) << twice.message;
  EXPECT_GT(twice.details["prediction"]["time"]["relative_error"].get<double>(), 0.5);

  // No stated tolerance: shown, never judged.
  const auto unclaimed = runChanged(c, id, {50'000, 100'000, std::nullopt});
  EXPECT_EQ(unclaimed.mispredicted, "");
  EXPECT_EQ(unclaimed.details["prediction"]["time"]["tolerance"], "none");
}

// --- Coverage: every element must be held by some rank. -----------------------------------------

// A replicated strategy whose every rank declares and returns all but the last row: each rank's
// numbers match the reference's slice it declares, and one row of every tensor is held by none.
TEST(CoverageVerdict, PlantedARankSetThatLeavesARowUnheldFailsNamingTheElements) {
  const auto c = test::linearCase({8, 16}, 8, {2});
  const std::string id = "sharding/linear/RR=RR.RR";
  const auto whole = runChanged(c, id, {});
  ASSERT_EQ(whole.status, Status::kPass) << whole.message;

  Change drop;
  drop.dropLastRow = true;
  const auto rec = runChanged(c, id, drop);
  EXPECT_EQ(rec.status, Status::kFail);
  EXPECT_EQ(*rec.mismatches, 0) << "every declared element is right";
  // output [8, 8]: its last row of 8; grad_input [8, 16]: 16; grad_weight [8, 16]: 16.
  EXPECT_NE(rec.message.find("output: 8 elements are held by no rank's declared layout"),
            std::string::npos)
      << rec.message;
  EXPECT_NE(rec.message.find("grad_input: 16 elements are held by no rank"), std::string::npos)
      << rec.message;
}

// --- Memory: a model that claims to be exact is judged exactly. ----------------------------------

struct ExactCase {
  const char* what;
  harness::CaseSpec c;
  std::string id;
};

harness::CaseSpec caseOf(const std::string& workload, nlohmann::json shape,
                         std::vector<int64_t> mesh, nlohmann::json params = nullptr) {
  harness::CaseSpec c = test::linearCase({}, 0, std::move(mesh));
  c.workload = workload;
  c.shape = std::move(shape);
  if (!params.is_null()) c.params = std::move(params);
  return c;
}

std::vector<ExactCase> exactModels() {
  return {
      {"a mesh Linear strategy", test::linearCase({8, 4, 16}, 32, {2, 2}),
       "sharding/linear/S0S1=S0R.RS1/0"},
      {"ShardedTensor", test::linearCase({8, 16}, 13, {4}),
       "sharding/linear/sharded_tensor/colwise"},
      {"an operator set", test::opCase({{"op", "layer_norm"}, {"input", {8, 32}}}, {2, 2}),
       "sharding/op/layer_norm/S0R=S0R.R.R"},
      {"Megatron",
       caseOf("transformer_block", {{"batch", 2}, {"seq", 8}, {"d_model", 32}, {"heads", 4}}, {2}),
       "sharding/megatron/tp"},
      {"checkpointing",
       caseOf("mlp_chain", {{"batch", 8}, {"width", 32}, {"depth", 6}, {"dropout", 0.1}}, {1},
              {{"budget", 0.8}}),
       "checkpointing/rotor"},
      {"a redistribution", caseOf("tensor", {{"tensor", {8, 4}}}, {2, 2}),
       "sharding/redistribute/S0R->RS1"},
      {"online attention",
       caseOf("gpt2_prefill",
              {{"batch", 1},
               {"seq", 64},
               {"d_model", 32},
               {"heads", 2},
               {"layers", 1},
               {"mode", "training"}},
              {1}, {{"chunk", 16}}),
       "chunking/attention/online"},
  };
}

// A 0.5% error in a model that is exact is a bug of the model, and is flagged; the same
// strategy unchanged is predicted to the byte.
TEST(MemoryVerdict, PlantedAHalfPercentErrorInAnExactModelIsFlaggedMispredicted) {
  for (const auto& e : exactModels()) {
    SCOPED_TRACE(e.what);
    harness::StrategyRegistry::global().expandFor(e.c);  // the per-case strategies
    const auto honest = runChanged(e.c, e.id, {});
    ASSERT_EQ(honest.status, Status::kPass) << honest.message;
    ASSERT_TRUE(honest.predictedMemBytes && honest.peakMemBytes);
    EXPECT_EQ(*honest.predictedMemBytes, *honest.peakMemBytes);
    EXPECT_EQ(honest.mispredicted, "");
    EXPECT_EQ(honest.details["prediction"]["memory"]["tolerance"].get<double>(), 0.0);

    Change off;
    off.memoryScale = 1.005;
    const auto rec = runChanged(e.c, e.id, off);
    EXPECT_EQ(rec.status, Status::kPass) << "the numbers are right";
    EXPECT_EQ(rec.mispredicted, "memory") << rec.message;
  }
}

// --- Leaks: what a step leaves live is the same every step. -------------------------------------

// A step that keeps 64 bytes more each time it runs, on exact models and on one without a memory
// model: the row fails naming the rank and the growth, whatever its peak and prediction say.
TEST(LeakVerdict, AStepThatKeepsBytesEveryTimeItRunsFailsTheRow) {
  std::vector<ExactCase> cases = exactModels();
  cases.push_back(
      {"no memory model", test::linearCase({8, 16}, 8, {2}), "sharding/linear/RR=RR.RR"});
  for (const auto& e : cases) {
    SCOPED_TRACE(e.what);
    harness::StrategyRegistry::global().expandFor(e.c);
    const auto honest = runChanged(e.c, e.id, {});
    ASSERT_EQ(honest.status, Status::kPass) << honest.message;
    ASSERT_TRUE(honest.details.contains("live_after_steps")) << honest.details.dump();
    for (const auto& r : honest.details["live_after_steps"]) {
      EXPECT_EQ(r["after_warm_up"], r["after_measured"]);
    }

    Change leak;
    leak.leakBytesPerStep = 64;
    const auto rec = runChanged(e.c, e.id, leak);
    EXPECT_EQ(rec.status, Status::kFail) << rec.message;
    EXPECT_NE(rec.message.find("rank 0 held 64 bytes more after the measured step than after "
                               "the warm-up step"),
              std::string::npos)
        << rec.message;
    for (const auto& r : rec.details["live_after_steps"]) {
      EXPECT_EQ(r["after_measured"].get<int64_t>() - r["after_warm_up"].get<int64_t>(), 64);
      if (r.contains("timed_steps")) {
        EXPECT_EQ(r["after_last_timed"].get<int64_t>() - r["after_first_timed"].get<int64_t>(),
                  64 * (r["timed_steps"].get<int64_t>() - 1));
      }
    }
  }
}

}  // namespace
}  // namespace sb::strategies
