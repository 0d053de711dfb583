// The redistribution family and ShardedTensor's reshard, run end to end on the threads backend:
// every pair verified and its memory predicted exactly; planted faults reported as failures.

#include <gtest/gtest.h>

#include "harness/registry.h"
#include "strategies/test/test_util.h"

namespace sb::strategies {
namespace {

using harness::Status;

harness::CaseSpec tensorCase(std::vector<int64_t> shape, std::vector<int64_t> mesh, bool exact,
                             nlohmann::json params = nlohmann::json::object()) {
  harness::CaseSpec c;
  c.suite = "test";
  c.name = "test";
  c.workload = "tensor";
  c.shape = {{"tensor", shape}};
  c.mesh = std::move(mesh);
  c.seed = 11;
  c.inputs = exact ? reference::InputMode::kExact : reference::InputMode::kRandom;
  c.repetitions = 1;
  c.minTimeSec = 1e-4;
  c.params = std::move(params);
  c.file = "test";
  return c;
}

// The strategies a case selects from the family, generated for it.
std::vector<const harness::Strategy*> pairsFor(const harness::CaseSpec& c) {
  auto& registry = harness::StrategyRegistry::global();
  registry.expandFor(c);
  std::vector<const harness::Strategy*> out;
  for (const auto* s : registry.matching("sharding/redistribute/.*")) {
    if (s->applies(c).kind == harness::Applicability::Kind::kApplies) out.push_back(s);
  }
  return out;
}

const harness::Strategy& pair(const harness::CaseSpec& c, const std::string& id) {
  harness::StrategyRegistry::global().expandFor(c);
  const auto* s = harness::StrategyRegistry::global().find("sharding/redistribute/" + id);
  EXPECT_NE(s, nullptr) << id;
  return *s;
}

TEST(Redistribution, EveryPairOfAnUnevenTensorOnA2x2MeshIsBitwiseWithItsMemoryPredicted) {
  // 5 over 2x2 nests as 3 (2 + 1) and 2 (1 + 1); 3 leaves a piece of 1 and one of 2.
  const auto c = tensorCase({5, 3}, {2, 2}, /*exact=*/true);
  const auto pairs = pairsFor(c);
  ASSERT_EQ(pairs.size(), 15u * 15u);  // R, P, S0, S1 per axis, less P on both
  for (const auto* s : pairs) {
    const auto rec = test::run(c, *s);
    ASSERT_EQ(rec.status, Status::kPass) << s->id() << ": " << rec.message;
    EXPECT_EQ(*rec.mismatches, 0);
    EXPECT_EQ(rec.commBytes, rec.predictedCommBytes) << s->id();
    ASSERT_TRUE(rec.predictedMemBytes);
    EXPECT_EQ(*rec.predictedMemBytes, *rec.peakMemBytes) << s->id();
  }
}

TEST(Redistribution, RandomInputsMoveBitwiseWhereNoPendingSumsAreAdded) {
  // Neither layout has a replicated or partial axis, so neither the tensor nor its gradient
  // is ever split into pending sums.
  const auto c = tensorCase({6, 4, 2}, {2, 2}, /*exact=*/false);
  for (const std::string id : {"S01RR->RRS01", "S0S1R->S1S0R", "RS0S1->S1RS0"}) {
    const auto& s = pair(c, id);
    EXPECT_TRUE(s.tolerance("output", c, at::zeros({1})).exact) << id;
    EXPECT_TRUE(s.tolerance("grad_input", c, at::zeros({1})).exact) << id;
    const auto rec = test::run(c, s);
    EXPECT_EQ(rec.status, Status::kPass) << id << ": " << rec.message;
    EXPECT_EQ(*rec.maxAbsErr, 0.0) << id;
  }
}

TEST(Redistribution, AReduceScatterOverTheWrongAxisGroupFails) {
  // [R, R] P1 -> [R, S1]: a reduce-scatter over axis 1; the fault sums over axis 0 instead.
  const auto c = tensorCase({8, 4}, {2, 2}, /*exact=*/true);
  const auto& good = pair(c, "RRP1->RS1");
  EXPECT_EQ(test::run(c, good).status, Status::kPass);
  auto bad = good.withPlantedFault("reduce_scatter_wrong_group");
  ASSERT_NE(bad, nullptr);
  const auto rec = test::run(c, *bad);
  EXPECT_EQ(rec.status, Status::kFail) << rec.message;
  EXPECT_GT(*rec.mismatches, 0);
}

TEST(Redistribution, AnAllToAllWithASplitSizeOffByOneFails) {
  const auto c = tensorCase({8, 4, 2}, {2, 2}, /*exact=*/true);
  const auto& good = pair(c, "S0RR->RS0R");
  EXPECT_EQ(test::run(c, good).status, Status::kPass);
  auto bad = good.withPlantedFault("all_to_all_split_off_by_one");
  ASSERT_NE(bad, nullptr);
  const auto rec = test::run(c, *bad);
  EXPECT_EQ(rec.status, Status::kFail) << rec.message;
  EXPECT_GT(*rec.mismatches, 0);
}

TEST(Redistribution, AMalformedLayoutInACaseIsAnInputErrorNamingIt) {
  const auto c = tensorCase({8, 4}, {2, 2}, true, {{"layouts", {"[S0, R]", "[Shard(2), R]"}}});
  try {
    harness::StrategyRegistry::global().expandFor(c);
    FAIL() << "a layout of a dimension the tensor lacks was accepted";
  } catch (const harness::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("Shard(2)"), std::string::npos) << e.what();
  }
}

TEST(ShardedTensorReshard, UnevenReshardsAndReshufflesPassWithTheirMemoryPredicted) {
  const auto c = tensorCase({13, 17}, {4}, /*exact=*/false);
  int n = 0;
  for (const auto* s : harness::StrategyRegistry::global().matching("sharding/sharded_tensor/.*")) {
    const auto rec = test::run(c, *s);
    EXPECT_EQ(rec.status, Status::kPass) << s->id() << ": " << rec.message;
    EXPECT_EQ(*rec.maxAbsErr, 0.0) << s->id();  // pure data movement
    EXPECT_EQ(*rec.predictedMemBytes, *rec.peakMemBytes) << s->id();
    ++n;
  }
  EXPECT_EQ(n, 14);  // 4 dimension pairs x 4 placement pairs, less 2 that move nothing
}

TEST(ShardedTensorReshard, AReshuffleThatIgnoresPlacementsFails) {
  const auto c = tensorCase({13, 17}, {4}, /*exact=*/false);
  const auto* s = harness::StrategyRegistry::global().find(
      "sharding/sharded_tensor/reshuffle/dim=0->0/placements=0,1,2,3->2,0,3,1");
  ASSERT_NE(s, nullptr);
  auto bad = s->withPlantedFault("ignore_placements");
  ASSERT_NE(bad, nullptr);
  const auto rec = test::run(c, *bad);
  EXPECT_EQ(rec.status, Status::kFail) << rec.message;
}

}  // namespace
}  // namespace sb::strategies
