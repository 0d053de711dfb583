// Single-operator strategies as ColossalAI v0.3.0 writes and declares them: the names `list`
// shows (expected strings written from its generators' f-strings, e.g. normal_pooling_
// generator's "{output} = {input}", not from ours), with the ids unchanged; batch norm's
// running statistics; the strategies added after its generators (reshape, getitem, addmm with
// a full bias, the views that gather their input), each run on 4 ranks and on 2x2 with its
// peak predicted to the byte and each of its planted faults failing; and memory judged
// exactly.

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "harness/registry.h"
#include "strategies/sharding/ops/op_strategies.h"
#include "strategies/test/test_util.h"

namespace sb::strategies {
namespace {

using harness::Applicability;
using harness::CaseSpec;
using harness::Status;
using test::opCase;

// ColossalAI's name of each registered strategy, looked up by its id (which must not change:
// suites, plans and tests name strategies by it). The suffix of a following operator's name
// is the index of its input's layout among the layouts of the rank, 1-D mesh first: for a
// 2-D tensor RR 0, S0R 1, RS0 2, S1R 3, RS1 4, S01R 5, S0S1 6, S1S0 7, RS01 8.
TEST(OpNames, ListedAsColossalAIsGeneratorsWriteThemUnderTheSameIds) {
  const std::vector<std::pair<std::string, std::string>> expected = {
      // NormalPoolStrategyGenerator: "{output} = {input}".
      {"sharding/op/max_pool2d/S0RRR=S0RRR", "[S0, R, R, R] = [S0, R, R, R]"},
      {"sharding/op/avg_pool2d/S0S1RR=S0S1RR", "[S0, S1, R, R] = [S0, S1, R, R]"},
      // BinaryElementwiseStrategyGenerator: the output's (logical) sequence three times.
      {"sharding/op/add/S0S1=S0S1.S1", "[S0, S1] = [S0, S1] <binary-elementwise-op> [S0, S1]"},
      {"sharding/op/mul/RR=RR.RR", "[R, R] = [R, R] <binary-elementwise-op> [R, R]"},
      // LayerNormGenerator: "{output} = {input} x {weight}", its unsplit one by hand.
      {"sharding/op/layer_norm/S0R=S0R.R.R", "[S0, R] = [S0, R] x [R]"},
      {"sharding/op/layer_norm/RR=RR.R.R", "RR = RR x R"},
      // UnaryElementwiseGenerator (relu, gelu, dropout), SoftmaxGenerator, PermuteGenerator,
      // TransposeGenerator, SumGenerator: "{input} -> {output}_{index}".
      {"sharding/op/relu/S0R=S0R", "[S0, R] -> [S0, R]_1"},
      {"sharding/op/gelu/RS0=RS0", "[R, S0] -> [R, S0]_2"},
      {"sharding/op/dropout/RR=RR", "[R, R] -> [R, R]_0"},
      {"sharding/op/softmax/S1R=S1R", "[S1, R] -> [S1, R]_3"},
      {"sharding/op/permute/S0RR=S0RR", "[S0, R, R] -> [R, S0, R]_1"},
      {"sharding/op/transpose/S0R=S0R", "[S0, R] -> [R, S0]_1"},
      {"sharding/op/sum/RP0=S0R", "[S0, R] -> [R]_1"},
      // SplitGenerator: "{input}_{index}".
      {"sharding/op/split/S01R=S01R", "[S01, R]_5"},
      // ViewGenerator: the shards kept, or the input gathered ("FULLY REPLICATED").
      {"sharding/op/view/view(S0R)", "[S0, R] -> [S0]_1"},
      {"sharding/op/view/gather(RS0)", "[R, S0] -> FULLY REPLICATED_2"},
      // Ours beside it: the shards mapped by the case's shapes where they stay contiguous.
      {"sharding/op/view/view(RS0)", "[R, S0] -> VIEWED SHARDS_2"},
      // DefaultReshapeGenerator: always gathered.
      {"sharding/op/reshape/reshape(S0R)", "[S0, R] -> FULLY REPLICATED_1"},
      // TensorStrategyGenerator (getitem): "{output} = {input}_{index}"; input [4, 8, 16],
      // index 1: RRR 0, S0RR 1, RS0R 2.
      {"sharding/op/getitem/S0R=RS0R", "[S0, R] = [R, S0, R]_2"},
      // DotProductStrategyGenerator and MatVecStrategyGenerator.
      {"sharding/op/matmul/R=S0.S0", "R = S0 dot S0"},
      {"sharding/op/matmul/R=RR.R", "R = R x R"},
      {"sharding/op/matmul/S0=S0R.R", "S0R = S0R x R"},
      // Generators whose names ColossalAI spells by hand, as ours already were.
      {"sharding/op/conv2d/S0R=S0S1.S1R", "S0R = S0S1 x S1R"},
      {"sharding/op/bmm/Sb0Si1=Sb0Si1.Sb0", "Sb0Si1 = Sb0Si1 x Sb0"},
      {"sharding/op/embedding/S0R=S0.RR_1", "S0R = S0 x RR_1"},
      {"sharding/op/batch_norm/RS0=RS0.S0", "RS0 = RS0 x S0"},
      // addmm with a bias [M, N]: the generator's name; the id says the bias.
      {"sharding/op/addmm/S0S1=S0R.RS1+biasS0S1", "S0S1 = S0R x RS1"},
  };
  for (const auto& [id, name] : expected) {
    const auto* s = harness::StrategyRegistry::global().find(id);
    ASSERT_NE(s, nullptr) << "no strategy " << id;
    EXPECT_EQ(s->displayName(), name) << id;
  }
}

// A strategy's record carries ColossalAI's name for the case's own shapes, which for a view
// may differ from the name of the shape it was registered for.
TEST(OpNames, ACaseGetsColossalAIsNameForItsOwnShapes) {
  const auto c = opCase({{"op", "view"}, {"input", {4, 8, 16}}, {"size", {4, 128}}}, {2, 2});
  harness::StrategyRegistry::global().expandFor(c);
  // (4, 8, 16) -> (4, 128): dimension 1 is the first of the merged group (8, 16).
  EXPECT_EQ(
      test::strategy("sharding/op/view/view(RS0R)").caseDetails(c).value("colossalai_name", ""),
      "[R, S0, R] -> [R, S0]_2");
  // Dimension 2 is not: ColossalAI gathers.
  EXPECT_EQ(
      test::strategy("sharding/op/view/gather(RRS0)").caseDetails(c).value("colossalai_name", ""),
      "[R, R, S0] -> FULLY REPLICATED_3");
}

// BatchNormStrategyGenerator declares running_mean and running_var laid out as the weight:
// split with the channels, replicated over a split batch (SYNC_BN).
TEST(OpNames, BatchNormListsItsRunningStatisticsAsColossalAIDeclaresThem) {
  const std::vector<std::pair<std::string, std::string>> expected = {
      {"RS0 = RS0 x S0", "[S0]"},
      {"RS01 = RS01 x S01", "[S01]"},
      {"RR = RR x R", "[R]"},
      {"S0R = S0R x R WITH SYNC_BN", "[R]"},
      {"S1S0 = S1S0 x S0 WITH SYNC_BN", "[S0]"},
  };
  for (const auto& [name, seq] : expected) {
    const harness::Strategy* found = nullptr;
    for (const auto* s :
         harness::StrategyRegistry::global().matching("sharding/op/batch_norm/.*")) {
      if (s->displayName() == name) found = s;
    }
    ASSERT_NE(found, nullptr) << "no batch_norm strategy named " << name;
    const auto seqs = found->describe().at("sharding_sequences");
    EXPECT_EQ(seqs.value("running_mean", ""), seq) << name;
    EXPECT_EQ(seqs.value("running_var", ""), seq) << name;
  }
}

// The op rules replay every allocation of the step, so a strategy's memory is judged exactly:
// a model 0.5% off must be flagged, which the default 5% would not.
TEST(OpPredictionTolerance, MemoryIsJudgedExactlyAndTimeIsNot) {
  const auto tol = test::strategy("sharding/op/relu/RR=RR").predictionTolerance();
  ASSERT_TRUE(tol.memory.has_value());
  EXPECT_EQ(*tol.memory, 0.0);
  EXPECT_FALSE(tol.time.has_value());
}

// Every strategy of the operators added after ColossalAI's generators were mirrored, on 4
// ranks and on 2x2: it passes with its peak predicted to the byte, and each fault plantable in
// it fails. The view shapes make ColossalAI keep some shards and gather others.
TEST(OpNewStrategies, EachPassesOnMeshes4And2x2WithItsPeakToTheByteAndItsFaultsFail) {
  const std::vector<nlohmann::json> shapes = {
      {{"op", "reshape"}, {"input", {8, 16}}, {"size", {4, 32}}},
      {{"op", "view"}, {"input", {8, 16}}, {"size", {128}}},
      {{"op", "view"}, {"input", {4, 8, 16}}, {"size", {32, 16}}},
      {{"op", "getitem"}, {"input", {4, 8, 16}}, {"index", 1}},
      {{"op", "getitem"}, {"input", {8, 16}}, {"index", {2, 6}}},
      {{"op", "addmm"}, {"input", {16, 32}}, {"other", {32, 16}}, {"bias", {16, 16}}},
  };
  int runs = 0, gathers = 0, faults = 0;
  for (const auto& shape : shapes) {
    for (const auto& mesh : std::vector<std::vector<int64_t>>{{4}, {2, 2}}) {
      const CaseSpec c = opCase(shape, mesh);
      auto& reg = harness::StrategyRegistry::global();
      reg.expandFor(c);
      for (const auto* s : reg.matching("sharding/op/.*")) {
        if (s->applies(c).kind != Applicability::Kind::kApplies) continue;
        const auto rec = test::run(c, *s);
        ASSERT_EQ(rec.status, Status::kPass) << s->id() << " on " << shape.dump() << ", mesh "
                                             << mesh.size() << "-D: " << rec.message;
        ASSERT_TRUE(rec.predictedMemBytes.has_value()) << s->id();
        EXPECT_EQ(*rec.predictedMemBytes, rec.peakMemBytes) << s->id() << " on " << shape.dump();
        ++runs;
        gathers +=
            s->caseDetails(c).at("colossalai_name").get<std::string>().find("FULLY REPLICATED") !=
            std::string::npos;
        for (const auto& fault : s->plantableFaults()) {
          const auto bad = s->withPlantedFault(fault);
          ASSERT_NE(bad, nullptr) << s->id() << " " << fault;
          EXPECT_EQ(test::run(c, *bad).status, Status::kFail)
              << s->id() << " with " << fault << " on " << shape.dump() << " passed";
          ++faults;
        }
      }
    }
  }
  EXPECT_GT(runs, 60);
  EXPECT_GT(gathers, 20);
  EXPECT_GT(faults, 30);
}

// A gathered view's input really is gathered: its all-gathers are counted and predicted, and
// its gradient is this rank's box (the planted fault hands every rank the first box).
TEST(OpNewStrategies, AGatheredViewCountsItsAllGatherAndKeepsItsOwnGradientBox) {
  const CaseSpec c = opCase({{"op", "view"}, {"input", {8, 16}}, {"size", {128}}}, {2, 2});
  const auto& s = test::strategy("sharding/op/view/gather(RS0)");
  ASSERT_EQ(s.displayName(), "[R, S0] -> FULLY REPLICATED_2");
  const auto rec = test::run(c, s);
  ASSERT_EQ(rec.status, Status::kPass) << rec.message;
  ASSERT_TRUE(rec.commBytes.has_value());
  EXPECT_GT(*rec.commBytes, 0) << "the input is gathered";
  EXPECT_EQ(*rec.commBytes, *rec.predictedCommBytes);
  const auto bad = s.withPlantedFault("gather_first_box");
  ASSERT_NE(bad, nullptr);
  const auto planted = test::run(c, *bad);
  EXPECT_EQ(planted.status, Status::kFail) << planted.message;
}

// getitem keeps the indexed dimension whole (ColossalAI replicates it): no strategy shards it.
TEST(OpNewStrategies, GetitemNeverShardsTheIndexedDimension) {
  const CaseSpec c = opCase({{"op", "getitem"}, {"input", {8, 16}}, {"index", {2, 6}}}, {2, 2});
  auto& reg = harness::StrategyRegistry::global();
  reg.expandFor(c);
  int n = 0;
  for (const auto* s : reg.matching("sharding/op/getitem/.*")) {
    if (s->applies(c).kind == Applicability::Kind::kNotApplicable) continue;
    const std::string input = s->describe().at("sharding_sequences").at("input");
    EXPECT_EQ(input.rfind("[R,", 0), 0u) << s->id() << ": " << input;
    ++n;
  }
  // The layouts of a 2-D tensor on a 2x2 mesh that leave its first dimension whole: R, S0, S1,
  // S01 on the second.
  EXPECT_EQ(n, 4);
}

}  // namespace
}  // namespace sb::strategies
