// The runner's check of a strategy's declared layout against the specification it claims
// (Strategy::specifiedBox): a layout that is wrong, and computed exactly as that wrong layout
// says, passes every tensor check, because each compares a rank's tensors with the slice the
// strategy itself declares. The planted `consistent_wrong_layout` is that bug; it must pass the
// numerics and fail the row on its layout, and every right strategy must pass the check with
// something checked.

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "harness/registry.h"
#include "harness/run/rank_outcome.h"
#include "strategies/test/test_util.h"

namespace sb::strategies {
namespace {

using harness::Status;

harness::CaseSpec tensorCase(std::vector<int64_t> shape, std::vector<int64_t> mesh) {
  harness::CaseSpec c = test::linearCase({}, 0, std::move(mesh));
  c.workload = "tensor";
  c.shape = {{"tensor", shape}};
  c.seed = 11;
  return c;
}

std::unique_ptr<harness::Strategy> faulty(const harness::Strategy& s) {
  return s.withPlantedFault("consistent_wrong_layout");
}

// The row's every tensor check passed and every byte was predicted: the fault is the
// consistent kind, invisible to the numerics.
void expectNumericsPass(const harness::Record& rec, const std::string& what) {
  ASSERT_TRUE(rec.details.contains("tensors")) << what << ": " << rec.message;
  ASSERT_FALSE(rec.details["tensors"].empty()) << what;
  for (const auto& j : rec.details["tensors"]) {
    EXPECT_TRUE(harness::checkFromJson(j).passed()) << what << ": " << j.dump();
  }
  EXPECT_EQ(*rec.mismatches, 0) << what;
  EXPECT_EQ(*rec.commBytes, *rec.predictedCommBytes) << what;
}

// The row failed on its layout, naming the specification.
void expectLayoutFailure(const harness::Record& rec, const std::string& what,
                         const std::string& spec) {
  EXPECT_EQ(rec.status, Status::kFail) << what << ": " << rec.message;
  EXPECT_EQ(rec.message.rfind("layout: ", 0), 0u) << what << ": " << rec.message;
  EXPECT_NE(rec.message.find(spec), std::string::npos) << what << ": " << rec.message;
  ASSERT_TRUE(rec.details.contains("spec_check")) << what;
  EXPECT_FALSE(rec.details["spec_check"]["problems"].empty()) << what;
}

TEST(SpecCheck, SwappedMeshAxesPassTheNumericsAndFailOnTheNamedLayout) {
  const auto& s = test::strategy("sharding/linear/S0S1=S0R.RS1/0");
  const auto bad = faulty(s);
  ASSERT_NE(bad, nullptr) << "S0S1 = S0R x RS1_0 cannot plant consistent_wrong_layout";
  const auto rec = test::run(test::linearCase({4, 4, 4, 16}, 32, {2, 2}), *bad);
  expectNumericsPass(rec, s.id());
  // By the name, the output [S0, R, R, S1] puts rows 0:2 and columns 16:32 on rank 1, at (0, 1);
  // the axes swapped put rows 2:4 and columns 0:16 there. Rank 2, at (1, 0), differs too; ranks
  // 0 and 3 are on the diagonal, where swapping changes nothing.
  const std::string expected =
      "layout: output on rank 1 is declared [2:4, 0:4, 0:4, 0:16] but the strategy's "
      "specification ColossalAI `S0S1 = S0R x RS1_0` (output: the output's [S0, R, R, S1]) puts "
      "[0:2, 0:4, 0:4, 16:32] there (and on 1 more rank)";
  EXPECT_EQ(rec.status, Status::kFail);
  EXPECT_EQ(rec.message.substr(0, expected.size()), expected) << rec.message;
}

TEST(SpecCheck, EveryLinearMeshStrategyWithAxesToSwapFailsOnItsLayoutAlone) {
  int planted = 0;
  for (const auto* s : harness::StrategyRegistry::global().matching("sharding/linear/[^s].*")) {
    const auto bad = faulty(*s);
    if (!bad) continue;
    for (const auto& [input, out] : std::vector<std::pair<std::vector<int64_t>, int64_t>>{
             {{4, 4, 4, 16}, 32}, {{64, 16}, 32}}) {
      const auto c = test::linearCase(input, out, {2, 2});
      if (bad->applies(c).kind != harness::Applicability::Kind::kApplies) continue;
      const auto rec = test::run(c, *bad);
      const std::string what = s->id() + " on input " + c.shape.at("input").dump();
      expectNumericsPass(rec, what);
      expectLayoutFailure(rec, what, "ColossalAI `" + s->displayName() + "`");
      ++planted;
    }
  }
  // Every 2-D strategy that splits something, on at least one shape.
  EXPECT_GE(planted, 20);
}

TEST(SpecCheck, RotatedShardedTensorPlacementsPassTheNumericsAndFailOnTheWeightsLayout) {
  const auto& s = test::strategy("sharding/linear/sharded_tensor/colwise/placements=2,0,3,1");
  const auto bad = faulty(s);
  ASSERT_NE(bad, nullptr);
  const auto rec = test::run(test::linearCase({8, 16}, 13, {4}), *bad);
  expectNumericsPass(rec, s.id());
  // 13 weight rows over 4: chunks 0:4, 4:8, 8:12, 12:13. Placements [2, 0, 3, 1] put chunk 1 on
  // rank 0; rotated to [0, 3, 1, 2] they put chunk 0 there. Every rank holds another chunk.
  const std::string expected =
      "layout: grad_weight on rank 0 is declared [0:4, 0:16] but the strategy's specification "
      "ShardedTensor colwise (the weight's ChunkShardingSpec(dim=0, placements=[2, 0, 3, 1])) "
      "puts [4:8, 0:16] there (and on 3 more ranks)";
  EXPECT_EQ(rec.status, Status::kFail);
  EXPECT_EQ(rec.message.substr(0, expected.size()), expected) << rec.message;
}

TEST(SpecCheck, EveryShardedTensorStrategyFailsOnItsLayoutAloneWithRotatedPlacements) {
  int planted = 0;
  for (const auto* s :
       harness::StrategyRegistry::global().matching("sharding/linear/sharded_tensor/.*")) {
    const auto bad = faulty(*s);
    ASSERT_NE(bad, nullptr) << s->id();
    for (const auto& [input, out] :
         std::vector<std::pair<std::vector<int64_t>, int64_t>>{{{8, 16}, 13}, {{8, 13}, 16}}) {
      const auto c = test::linearCase(input, out, {4});
      const auto rec = test::run(c, *bad);
      const std::string what = s->id() + " on input " + c.shape.at("input").dump();
      expectNumericsPass(rec, what);
      expectLayoutFailure(rec, what, "layout: grad_weight on rank 0");
      ++planted;
    }
  }
  const auto c = tensorCase({13, 17}, {4});
  for (const auto* s : harness::StrategyRegistry::global().matching("sharding/sharded_tensor/.*")) {
    const auto bad = faulty(*s);
    ASSERT_NE(bad, nullptr) << s->id();
    const auto rec = test::run(c, *bad);
    expectNumericsPass(rec, s->id());
    // The target spec's placements were rotated; the source's were not.
    expectLayoutFailure(rec, s->id(), "layout: output on rank ");
    EXPECT_EQ(rec.message.find("grad_input"), std::string::npos) << s->id() << ": " << rec.message;
    ++planted;
  }
  EXPECT_EQ(planted, 4 * 2 + 14);  // colwise, rowwise (rank order, reordered) x 2; 14 reshards
}

// The right strategies' declared layouts are their specifications', and the check ran: each
// checked tensor on each rank compared. The Linear strategies are checked so on every shape in
// linear_sharding_test.cpp; the reshards here.
TEST(SpecCheck, EveryShardedTensorReshardDeclaresItsSpecsLayout) {
  const auto c = tensorCase({13, 17}, {4});
  int n = 0;
  for (const auto* s : harness::StrategyRegistry::global().matching("sharding/sharded_tensor/.*")) {
    const auto rec = test::run(c, *s);
    EXPECT_EQ(rec.status, Status::kPass) << s->id() << ": " << rec.message;
    ASSERT_TRUE(rec.details.contains("spec_check")) << s->id();
    EXPECT_EQ(rec.details["spec_check"]["checked"], 2 * 4) << s->id();  // output, grad_input
    EXPECT_TRUE(rec.details["spec_check"]["problems"].empty()) << s->id();
    ++n;
  }
  EXPECT_EQ(n, 14);
}

// A strategy whose specification cannot be read fails the row (a check that silently did not
// run would pass it); one that states none is not checked, and says nothing of it.
class SpecifiedAs final : public test::Delegating {
 public:
  SpecifiedAs(const harness::Strategy& inner, bool throws)
      : Delegating(inner, "test/specified", "specified"), throws_(throws) {}
  std::optional<SpecifiedBox> specifiedBox(const std::string&, const harness::CaseSpec&, int,
                                           at::IntArrayRef) const override {
    if (throws_) throw std::invalid_argument("`S0Q` is not a ColossalAI sharding sequence");
    return std::nullopt;
  }

 private:
  bool throws_;
};

TEST(SpecCheck, AnUnreadableSpecificationFailsTheRowAndNoneIsNotChecked) {
  const auto& inner = test::strategy("sharding/linear/S0S1=S0R.RS1/0");
  const auto c = test::linearCase({4, 4, 4, 16}, 32, {2, 2});
  const auto unreadable = test::run(c, SpecifiedAs(inner, true));
  EXPECT_EQ(unreadable.status, Status::kFail) << unreadable.message;
  EXPECT_NE(unreadable.message.find(
                "layout: the specification of output on rank 0 could not be read: `S0Q`"),
            std::string::npos)
      << unreadable.message;
  const auto none = test::run(c, SpecifiedAs(inner, false));
  EXPECT_EQ(none.status, Status::kPass) << none.message;
  EXPECT_FALSE(none.details.contains("spec_check"));
}

}  // namespace
}  // namespace sb::strategies
