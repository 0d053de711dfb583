// Deliberately wrong executors must be reported as `fail` (or `error`), never `pass`; and
// bad requests must be rejected before anything runs.

#include <functional>
#include <optional>

#include <gtest/gtest.h>

#include "harness/box.h"
#include "harness/registry.h"
#include "harness/run/row_checks.h"
#include "strategies/sharding/linear/linear_strategies.h"
#include "strategies/test/test_util.h"

namespace sb::strategies {
namespace {

using harness::Status;

LinearMeshSpec specNamed(const std::string& name) {
  for (const auto& s : linearMeshSpecs()) {
    if (s.name == name) return s;
  }
  ADD_FAILURE() << "no spec " << name;
  return {};
}

TEST(PlantedFault, AMissingForwardAllReduceFails) {
  // SR = SS x SR splits the contraction over axis 1: without the all-reduce each rank's output
  // holds only its partial sum.
  auto bad = makeLinearMeshStrategy(specNamed("S0R = S0S1 x S1R"), 1,
                                    PlantedFault::kSkipForwardAllReduce, "test/");
  const auto rec = test::run(test::linearCase({4, 4, 4, 16}, 32, {2, 2}), *bad);
  EXPECT_EQ(rec.status, Status::kFail) << rec.message;
  EXPECT_GT(*rec.mismatches, 0);
  EXPECT_NE(rec.message.find("output@rank"), std::string::npos) << rec.message;
}

TEST(PlantedFault, AMissingForwardAllReduceFailsOnTheCommunicationCountEvenWhereNumericsCouldHide) {
  // Exact inputs, 1-D row split: the numerics fail, and the communication check would too.
  auto bad = makeLinearMeshStrategy(specNamed("RR = RS0 x S0R"), -1,
                                    PlantedFault::kSkipForwardAllReduce, "test/");
  const auto rec = test::run(test::linearCase({8, 16}, 8, {4}, /*exact=*/true), *bad);
  EXPECT_EQ(rec.status, Status::kFail) << rec.message;
  EXPECT_NE(*rec.commBytes, *rec.predictedCommBytes);
}

TEST(PlantedFault, AWrongShardOffsetFails) {
  for (int dim : {0, 1, 2}) {
    auto bad = makeLinearMeshStrategy(specNamed("S0S1 = S0R x RS1"), dim,
                                      PlantedFault::kShardOffsetOffByOne, "test/");
    const auto rec = test::run(test::linearCase({4, 4, 4, 16}, 32, {2, 2}), *bad);
    EXPECT_EQ(rec.status, Status::kFail) << "batch dim " << dim << ": " << rec.message;
    EXPECT_GT(*rec.mismatches, 0);
  }
}

TEST(PlantedFault, AWrongPlacementOrderFailsForColwiseAndRowwise) {
  const std::vector<int> placements = {2, 0, 3, 1};
  auto col = makeShardedTensorColwise(placements, PlantedFault::kIgnorePlacements, "test/");
  auto row = makeShardedTensorRowwise(placements, PlantedFault::kIgnorePlacements, "test/");
  const auto colRec = test::run(test::linearCase({8, 16}, 13, {4}), *col);
  EXPECT_EQ(colRec.status, Status::kFail) << colRec.message;
  const auto rowRec = test::run(test::linearCase({8, 13}, 16, {4}), *row);
  EXPECT_EQ(rowRec.status, Status::kFail) << rowRec.message;
  // The same faults are harmless, and so must pass, where placements are in rank order.
  auto colOk = makeShardedTensorColwise({0, 1, 2, 3}, PlantedFault::kIgnorePlacements, "test/");
  EXPECT_EQ(test::run(test::linearCase({8, 16}, 13, {4}), *colOk).status, Status::kPass);
}

// An executor that keeps state across steps: its gradients accumulate, so the first step is
// right and every later one is wrong. The check after the timed steps must catch it.
class AccumulatingStrategy final : public harness::Strategy {
 public:
  explicit AccumulatingStrategy(std::unique_ptr<harness::Strategy> inner)
      : Strategy("test/accumulating", "accumulating", harness::Family::kSharding),
        inner_(std::move(inner)) {}
  harness::Applicability applies(const harness::CaseSpec& c) const override {
    return inner_->applies(c);
  }
  harness::Box resultBox(const std::string& t, const harness::CaseSpec& c, int r) const override {
    return inner_->resultBox(t, c, r);
  }
  harness::CommStats predictComm(const harness::CaseSpec& c, int r) const override {
    return inner_->predictComm(c, r);
  }
  std::unique_ptr<harness::RankExecutor> makeExecutor(const harness::CaseSpec& c) const override {
    class Exec final : public harness::RankExecutor {
     public:
      explicit Exec(std::unique_ptr<harness::RankExecutor> e) : e_(std::move(e)) {}
      void prepare(harness::RankContext& ctx, const reference::WorkloadData& d) override {
        e_->prepare(ctx, d);
      }
      void step(harness::RankContext& ctx) override {
        e_->step(ctx);
        auto r = e_->results();
        if (steps_++ > 1) r["grad_weight"] = r["grad_weight"] * 2;  // leaks after step 2
        results_ = r;
      }
      std::map<std::string, at::Tensor> results() const override { return results_; }

     private:
      std::unique_ptr<harness::RankExecutor> e_;
      std::map<std::string, at::Tensor> results_;
      int steps_ = 0;
    };
    return std::make_unique<Exec>(inner_->makeExecutor(c));
  }

 private:
  std::unique_ptr<harness::Strategy> inner_;
};

TEST(PlantedFault, StateLeakingIntoTheTimedStepsFails) {
  AccumulatingStrategy bad(makeLinearMeshStrategy(specNamed("RR = RR x RR"), -1));
  auto c = test::linearCase({8, 16}, 8, {2});
  const auto rec = test::run(c, bad);
  EXPECT_EQ(rec.status, Status::kFail) << rec.message;
  EXPECT_NE(rec.message.find("changed during the timed steps"), std::string::npos) << rec.message;
}

TEST(PlantedFault, AnExecutorThatThrowsIsAnErrorNamingTheRank) {
  class Throwing final : public harness::Strategy {
   public:
    Throwing() : Strategy("test/throws", "throws", harness::Family::kSharding) {}
    harness::Applicability applies(const harness::CaseSpec&) const override {
      return harness::Applicability::yes();
    }
    harness::Box resultBox(const std::string&, const harness::CaseSpec&, int) const override {
      return {};
    }
    harness::CommStats predictComm(const harness::CaseSpec&, int) const override { return {}; }
    std::unique_ptr<harness::RankExecutor> makeExecutor(const harness::CaseSpec&) const override {
      class Exec final : public harness::RankExecutor {
        void prepare(harness::RankContext& ctx, const reference::WorkloadData&) override {
          TORCH_CHECK(ctx.rank() != 1, "cannot shard on purpose");
          at::Tensor t = at::ones({1});
          ctx.world().allReduce(t);
        }
        void step(harness::RankContext&) override {}
        std::map<std::string, at::Tensor> results() const override { return {}; }
      };
      return std::make_unique<Exec>();
    }
  } bad;
  const auto rec = test::run(test::linearCase({8, 16}, 8, {4}), bad);
  EXPECT_EQ(rec.status, Status::kError);
  EXPECT_NE(rec.message.find("rank 1"), std::string::npos) << rec.message;
  EXPECT_NE(rec.message.find("cannot shard on purpose"), std::string::npos) << rec.message;
}

// planSuite: bad requests are rejected before any result is written.
harness::Suite suiteWith(std::vector<std::string> strategies, std::vector<int64_t> input = {4, 16},
                         std::vector<int64_t> mesh = {2, 2}) {
  harness::Suite s;
  s.name = "t";
  s.file = "t.yaml";
  auto c = test::linearCase(std::move(input), 8, std::move(mesh));
  c.strategies = std::move(strategies);
  c.line = 3;
  c.file = "t.yaml";
  s.cases.push_back(c);
  return s;
}

std::string planError(const harness::Suite& s, const harness::RunOptions& o = {}) {
  try {
    harness::planSuite(s, o);
  } catch (const harness::InputError& e) {
    return e.what();
  }
  return "";
}

// FSDP's declared layouts against the layout its name claims (FSDP2's Shard(0), ZeRO's sharded
// state, HSDP's (Replicate(), Shard(0))), derived apart from the executor (issue 59): every
// kind agrees on uneven shapes, and a layout that is wrong in the declaration (as it would be
// in an executor that shares it: HSDP sharded over the replica axis) is named by the check.
reference::WorkloadData fsdpLikeData() {
  reference::WorkloadData d;
  // Rows that 4 ranks cut unevenly (5: 2, 2, 1, 0) or leave empty (2), a vector, a scalar.
  for (const auto& [name, shape] :
       std::vector<std::pair<std::string, std::vector<int64_t>>>{{"param/w", {5, 3}},
                                                                 {"param/b", {2}},
                                                                 {"state/w/exp_avg", {5, 3}},
                                                                 {"state/step", {}},
                                                                 {"loss", {}}}) {
    d.expected[name] = at::zeros(shape);
    d.checked.push_back(name);
  }
  return d;
}

TEST(SpecCheck, FsdpsDeclaredLayoutsAreTheOnesItsNamesClaim) {
  const auto data = fsdpLikeData();
  for (const std::string kind : {"ddp", "zero1", "zero2", "zero3", "hsdp"}) {
    const auto& s = test::strategy("sharding/fsdp/" + kind);
    harness::CaseSpec c = test::linearCase(
        {4, 4}, 4, kind == "hsdp" ? std::vector<int64_t>{2, 2} : std::vector<int64_t>{4});
    const auto check = harness::specCheck(c, data, s, 4);
    EXPECT_TRUE(check.problems.empty()) << kind << ": " << check.problems.front();
    // param/w, param/b and state/w/exp_avg on every rank; state/step and the loss state none.
    EXPECT_EQ(check.checked, 3 * 4) << kind;
  }
}

// A strategy as it is but for the layout it declares for some tensors (`declare` returns
// nullopt for the others): a layout wrong in the declaration, as it would be in an executor that
// shares it.
class DeclaredLayout final : public test::Delegating {
 public:
  using Declare = std::function<std::optional<harness::Box>(
      const std::string&, const harness::CaseSpec&, int, at::IntArrayRef)>;
  DeclaredLayout(const harness::Strategy& inner, Declare declare)
      : Delegating(inner, inner.id(), inner.displayName()), declare_(std::move(declare)) {}
  harness::Box resultBoxOf(const std::string& t, const harness::CaseSpec& c, int r,
                           at::IntArrayRef shape) const override {
    if (auto b = declare_(t, c, r, shape)) return *b;
    return inner_.resultBoxOf(t, c, r, shape);
  }

 private:
  Declare declare_;
};

TEST(SpecCheck, AnHsdpLayoutShardedOverTheReplicaAxisIsNamed) {
  // Sharded over mesh axis 0 and replicated over axis 1: ranks 1 and 2 of the 2 x 2 mesh hold
  // the other shard.
  const DeclaredLayout swapped(
      test::strategy("sharding/fsdp/hsdp"),
      [](const std::string& t, const harness::CaseSpec& c, int r,
         at::IntArrayRef shape) -> std::optional<harness::Box> {
        if (t.rfind("param/", 0) != 0 && (t.rfind("state/", 0) != 0 || t == "state/step")) {
          return std::nullopt;
        }
        return harness::chunkBox(shape, 0, c.mesh.at(0), r / static_cast<int>(c.mesh.at(1)));
      });
  const auto check =
      harness::specCheck(test::linearCase({4, 4}, 4, {2, 2}), fsdpLikeData(), swapped, 4);
  ASSERT_EQ(check.problems.size(), 3u);  // param/w, param/b, state/w/exp_avg
  EXPECT_NE(check.problems[0].find("layout: param/w on rank 1 is declared [0:3, 0:3] but the "
                                   "strategy's specification hsdp: the parameter as "
                                   "(Replicate(), Shard(0))"),
            std::string::npos)
      << check.problems[0];
  EXPECT_NE(check.problems[0].find("puts [3:5, 0:3] there (and on 1 more rank)"), std::string::npos)
      << check.problems[0];
}

// Megatron's block: every parameter's, gradient's and optimizer state's declared piece is
// Megatron-LM's (column- and row-parallel linears, whole layer norms) on 1-D and [dp, tp]
// meshes; an output projection declared column-parallel (an executor that splits it so would
// agree with itself) is named.
TEST(SpecCheck, MegatronsDeclaredLayoutsAreMegatronLmsAndAWrongOneIsNamed) {
  for (const std::string id : {"sharding/megatron/tp", "sharding/megatron/tp_sp"}) {
    for (const auto& mesh : std::vector<std::vector<int64_t>>{{4}, {2, 2}}) {
      const auto& s = test::strategy(id);
      harness::CaseSpec c = test::linearCase({4, 4}, 4, mesh);
      c.workload = "block";
      c.shape = {{"batch", 2}, {"seq", 8}, {"d_model", 16}, {"heads", 4}};
      reference::WorkloadData data;
      for (const auto& [name, dims] : std::vector<std::pair<std::string, std::vector<int64_t>>>{
               {"grad/attn.qkv.weight", {48, 16}},
               {"grad/attn.qkv.bias", {48}},
               {"grad/attn.proj.weight", {16, 16}},
               {"grad/attn.proj.bias", {16}},
               {"param/mlp.fc.weight", {64, 16}},
               {"state/mlp.proj.weight/exp_avg", {16, 64}},
               {"grad/ln_2.weight", {16}}}) {
        data.expected[name] = at::zeros(dims);
        data.checked.push_back(name);
      }
      const auto check = harness::specCheck(c, data, s, 4);
      EXPECT_TRUE(check.problems.empty()) << id << ": " << check.problems.front();
      EXPECT_EQ(check.checked, 7 * 4) << id;
      const DeclaredLayout column(s,
                                  [](const std::string& t, const harness::CaseSpec& c, int r,
                                     at::IntArrayRef shape) -> std::optional<harness::Box> {
                                    if (t != "grad/attn.proj.weight") return std::nullopt;
                                    return harness::chunkBox(shape, 0, c.mesh.back(),
                                                             r % c.mesh.back());
                                  });
      const auto wrong = harness::specCheck(c, data, column, 4);
      ASSERT_EQ(wrong.problems.size(), 1u) << id;
      EXPECT_NE(wrong.problems[0].find("layout: grad/attn.proj.weight on rank 0 is declared "
                                       "[0:" +
                                       std::to_string(16 / mesh.back()) + ", 0:16]"),
                std::string::npos)
          << wrong.problems[0];
      EXPECT_NE(wrong.problems[0].find("Megatron-LM attn.proj.weight (RowParallelLinear"),
                std::string::npos)
          << wrong.problems[0];
    }
  }
}

TEST(PlanSuite, AnUnknownStrategyIdIsRejectedWithItsCase) {
  const auto e = planError(suiteWith({"sharding/linear/S9S9"}));
  EXPECT_NE(e.find("t.yaml:3"), std::string::npos) << e;
  EXPECT_NE(e.find("'sharding/linear/S9S9' is neither a strategy id nor a pattern"),
            std::string::npos)
      << e;
}

TEST(PlanSuite, AFilterThatSelectsNothingIsRejected) {
  harness::RunOptions o;
  o.filter = "no-such-strategy";
  EXPECT_NE(planError(suiteWith({"sharding/.*"}), o).find("selects no strategy"),
            std::string::npos);
  o.filter = "([";
  EXPECT_NE(planError(suiteWith({"sharding/.*"}), o).find("not a valid regular expression"),
            std::string::npos);
}

TEST(PlanSuite, AMeshThatIsNotTheWorldSizeIsRejected) {
  harness::RunOptions o;
  o.worldSize = 8;
  const auto e = planError(suiteWith({"sharding/.*"}), o);
  EXPECT_NE(e.find("mesh 2x2 (4 ranks) but the world size is 8"), std::string::npos) << e;
}

TEST(PlanSuite, AStrategyNamedByIdThatCannotShardTheShapeIsAnUnsupportedRowSayingWhichDimension) {
  // The user asked for it by name: a row saying why it did not run, as a pattern would give,
  // never an absent row, and not a refusal of the whole suite.
  const auto plan = harness::planSuite(suiteWith({"sharding/linear/S01R=S01R.RR/0"}, {2, 16}), {});
  ASSERT_EQ(plan.size(), 1u);
  ASSERT_EQ(plan[0].strategies.size(), 1u);
  const auto& a = plan[0].strategies[0].applicability;
  EXPECT_EQ(a.kind, harness::Applicability::Kind::kUnsupported);
  EXPECT_NE(a.reason.find("input dimension 0 has size 2"), std::string::npos) << a.reason;
  EXPECT_NE(a.reason.find("does not split evenly into 4 shards"), std::string::npos) << a.reason;
}

TEST(PlanSuite, AStrategyNamedByIdForAnotherKindOfCaseIsRejected) {
  const auto e = planError(suiteWith({"checkpointing/rotor"}));
  EXPECT_NE(e.find("t.yaml:3"), std::string::npos) << e;
  EXPECT_NE(e.find("strategy 'checkpointing/rotor' cannot run it"), std::string::npos) << e;
}

TEST(PlanSuite, AMalformedParameterIsRejectedNamingTheCaseAndTheKey) {
  // By id or by pattern alike: a value the user must fix is bad input, not a row.
  for (const std::string pattern : {"sharding/fsdp/zero3", "sharding/fsdp/.*"}) {
    harness::Suite s = suiteWith({pattern}, {8, 16}, {2});
    harness::CaseSpec& c = s.cases[0];
    c.workload = "mlp";
    c.shape = {{"batch", 8}, {"d_model", 8}, {"layers", 1}};
    c.training.steps = 2;
    c.params = {{"prefetch", 1.5}};
    const auto e = planError(s);
    EXPECT_NE(e.find("t.yaml:3"), std::string::npos) << pattern << ": " << e;
    EXPECT_NE(e.find("params.prefetch must be a whole number of units, 0 to 8, got 1.5"),
              std::string::npos)
        << pattern << ": " << e;
  }
}

TEST(PlanSuite, APatternRecordsShapesItCannotShardAsUnsupportedRows) {
  const auto plan = harness::planSuite(suiteWith({"sharding/linear/S01R.*"}, {2, 16}), {});
  ASSERT_EQ(plan.size(), 1u);
  ASSERT_EQ(plan[0].strategies.size(), 1u);  // only /0 exists for a 2-D input
  EXPECT_EQ(plan[0].strategies[0].applicability.kind, harness::Applicability::Kind::kUnsupported);
}

TEST(PlanSuite, AnUnknownBackendIsRejected) {
  harness::RunOptions o;
  o.backend = "mpi";
  EXPECT_NE(planError(suiteWith({"sharding/.*"}), o).find("backend 'mpi'"), std::string::npos);
}

}  // namespace
}  // namespace sb::strategies
