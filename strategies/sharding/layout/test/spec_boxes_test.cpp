// The boxes of sharding specifications as text (spec_boxes.h), against boxes worked out by hand
// from what ColossalAI's sharding sequences and PyTorch's ChunkShardingSpec mean.

#include <gtest/gtest.h>

#include <stdexcept>

#include "strategies/sharding/layout/spec_boxes.h"

namespace sb::harness {
namespace {

Box box(std::vector<int64_t> offset, std::vector<int64_t> length) {
  return Box{std::move(offset), std::move(length)};
}

TEST(ColossalSequence, CompactAndBracketedFormsParseAlike) {
  const DimAxes s0r = {{0}, {}};
  EXPECT_EQ(parseColossalSequence("S0R"), s0r);
  EXPECT_EQ(parseColossalSequence("[S0, R]"), s0r);
  EXPECT_EQ(parseColossalSequence("[\"S0\", \"R\"]"), s0r);
  const DimAxes s01rrr = {{0, 1}, {}, {}, {}};
  EXPECT_EQ(parseColossalSequence("S01RRR"), s01rrr);
  EXPECT_EQ(parseColossalSequence("[S01, R, R, R]"), s01rrr);
  EXPECT_EQ(parseColossalSequence("RS1"), (DimAxes{{}, {1}}));
  EXPECT_EQ(parseColossalSequence("S0S1"), (DimAxes{{0}, {1}}));
  EXPECT_EQ(parseColossalSequence("[S10]"), (DimAxes{{1, 0}}));
}

TEST(ColossalSequence, TextThatIsNoSequenceIsRejected) {
  for (const char* bad : {"", "[]", "S", "S0S0", "[S01, S1]", "X0", "[S0, Q]", "[S0, R", "S0 R"}) {
    EXPECT_FALSE(parseColossalSequence(bad).has_value()) << "accepted `" << bad << "`";
  }
}

TEST(ColossalSequence, S01OnATwoByTwoMeshGivesRankTwoTheThirdQuarter) {
  // Rank 2 is at (1, 0); over axes [0, 1] its shard is 1 * 2 + 0 = 2 of 4: rows 4:6 of 8.
  EXPECT_EQ(colossalSequenceBox("[S01, R]", {8, 4}, {2, 2}, 2), box({4, 0}, {2, 4}));
  EXPECT_EQ(colossalSequenceBox("S01R", {8, 4}, {2, 2}, 1), box({2, 0}, {2, 4}));
  // S10 takes axis 1 first: rank 2's shard is 0 * 2 + 1 = 1, rows 2:4.
  EXPECT_EQ(colossalSequenceBox("[S10, R]", {8, 4}, {2, 2}, 2), box({2, 0}, {2, 4}));
}

TEST(ColossalSequence, TwoDimensionsOnTwoAxesFollowEachRanksCoordinates) {
  // Rank 1 is at (0, 1) on 2x2: rows split by axis 1 -> block 1 (4:8), columns by axis 0 ->
  // block 0 (0:3).
  EXPECT_EQ(colossalSequenceBox("S1S0", {8, 6}, {2, 2}, 1), box({4, 0}, {4, 3}));
  // On a 2x4 mesh rank 6 is at (1, 2): S0 on rows -> 4:8 of 8; S1 on columns -> 4:6 of 8.
  EXPECT_EQ(colossalSequenceBox("[S0, S1]", {8, 8}, {2, 4}, 6), box({4, 4}, {4, 2}));
  EXPECT_EQ(colossalSequenceBox("RR", {3, 5}, {2, 2}, 3), box({0, 0}, {3, 5}));
}

TEST(ColossalSequence, UnevenShardsAreCutAsTorchChunkCutsThem) {
  // 13 over 4: 4, 4, 4, 1; 2 over 4: 1, 1, 0, 0 (the empty ones start at the end).
  EXPECT_EQ(colossalSequenceBox("[S0]", {13}, {4}, 3), box({12}, {1}));
  EXPECT_EQ(colossalSequenceBox("[S0]", {13}, {4}, 2), box({8}, {4}));
  EXPECT_EQ(colossalSequenceBox("[S0]", {2}, {4}, 3), box({2}, {0}));
}

TEST(ColossalSequence, ASequenceThatDoesNotFitTheTensorOrMeshThrowsNamingIt) {
  try {
    colossalSequenceBox("[S0, R]", {8}, {2}, 0);
    FAIL() << "a 2-D sequence boxed a 1-D tensor";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("[S0, R]"), std::string::npos) << e.what();
  }
  EXPECT_THROW(colossalSequenceBox("[S1]", {8}, {4}, 0), std::invalid_argument);
  EXPECT_THROW(colossalSequenceBox("S0S0", {8, 8}, {2, 2}, 0), std::invalid_argument);
  EXPECT_THROW(colossalSequenceBox("[S0]", {8}, {2}, 2), std::invalid_argument);
}

TEST(ColossalLinearName, OperandsMapToPhysicalSequencesAsTheLinearHandlerMapsThem) {
  // Output [M, N] = input [M, K] x other [K, N]; the batch M on input dimension 0, the weight
  // [N, K] the other transposed.
  const auto ss = colossalLinearSequences("S0S1 = S0R x RS1_0", 4);
  EXPECT_EQ(ss.input, "[S0, R, R, R]");
  EXPECT_EQ(ss.output, "[S0, R, R, S1]");
  EXPECT_EQ(ss.weight, "[S1, R]");
  EXPECT_EQ(ss.bias, "[S1]");
  const auto sr = colossalLinearSequences("S1R = S1S0 x S0R_2", 4);
  EXPECT_EQ(sr.input, "[R, R, S1, S0]");
  EXPECT_EQ(sr.output, "[R, R, S1, R]");
  EXPECT_EQ(sr.weight, "[R, S0]");
  EXPECT_EQ(sr.bias, "[R]");
  const auto rr = colossalLinearSequences("RR = RS01 x S01R", 2);
  EXPECT_EQ(rr.input, "[R, S01]");
  EXPECT_EQ(rr.output, "[R, R]");
  EXPECT_EQ(rr.weight, "[R, S01]");
  // A 2-D input has one place for the batch, suffix or not.
  EXPECT_EQ(colossalLinearSequences("S01R = S01R x RR", 2).input, "[S01, R]");
}

TEST(ColossalLinearName, ANameThatIsNoLinearStrategyThrowsNamingIt) {
  for (const char* bad :
       {"S0S1", "S0S1 = S0R", "S0S1 = S0R x RS1_x", "S0S1 = S0Q x RS1_0", "S0S1 = S0RR x RS1_0"}) {
    try {
      colossalLinearSequences(bad, 4);
      ADD_FAILURE() << "accepted `" << bad << "`";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
    }
  }
  // A split batch on a 4-D input needs its dimension; the last one is no batch dimension.
  EXPECT_THROW(colossalLinearSequences("S0R = S0R x RR", 4), std::invalid_argument);
  EXPECT_THROW(colossalLinearSequences("S0R = S0R x RR_3", 4), std::invalid_argument);
}

TEST(ChunkShardingSpecText, EveryWrittenFormParses) {
  const auto full = parseChunkShardingSpec("ChunkShardingSpec(dim=0, placements=[2, 0, 3, 1])");
  ASSERT_TRUE(full.has_value());
  EXPECT_EQ(full->dim, 0);
  EXPECT_EQ(full->placements, (std::vector<int>{2, 0, 3, 1}));
  const auto bare = parseChunkShardingSpec("(dim=1, [2,0,3,1])");
  ASSERT_TRUE(bare.has_value());
  EXPECT_EQ(bare->dim, 1);
  EXPECT_EQ(bare->placements, (std::vector<int>{2, 0, 3, 1}));
  const auto devices = parseChunkShardingSpec(
      "ChunkShardingSpec(dim=1, placements=['rank:1/cuda:1', 'rank:0/cuda:0'])");
  ASSERT_TRUE(devices.has_value());
  EXPECT_EQ(devices->placements, (std::vector<int>{1, 0}));
  for (const char* bad : {"ChunkShardingSpec(dim=x, [0])", "Foo(dim=0, [0])", "(dim=0)",
                          "(dim=0, [0, a])", "(dim=0 [0])"}) {
    EXPECT_FALSE(parseChunkShardingSpec(bad).has_value()) << "accepted `" << bad << "`";
  }
}

TEST(ChunkShardingSpecBox, ChunkIGoesToTheRankOfPlacementI) {
  // 13 rows over 4: chunks 0:4, 4:8, 8:12, 12:13; placements [2, 0, 3, 1] put chunk 0 on rank 2,
  // chunk 1 on rank 0, chunk 2 on rank 3, chunk 3 on rank 1.
  const std::vector<int> p = {2, 0, 3, 1};
  EXPECT_EQ(chunkSpecBox(0, p, {13, 5}, 0), box({4, 0}, {4, 5}));
  EXPECT_EQ(chunkSpecBox(0, p, {13, 5}, 1), box({12, 0}, {1, 5}));
  EXPECT_EQ(chunkSpecBox(0, p, {13, 5}, 2), box({0, 0}, {4, 5}));
  EXPECT_EQ(chunkSpecBox(0, p, {13, 5}, 3), box({8, 0}, {4, 5}));
  // Along dimension 1, 17 columns: 5, 5, 5, 2.
  EXPECT_EQ(chunkSpecBox(1, p, {13, 17}, 1), box({0, 15}, {13, 2}));
  EXPECT_THROW(chunkSpecBox(0, p, {13, 5}, 4), std::invalid_argument);
  EXPECT_THROW(chunkSpecBox(2, p, {13, 5}, 0), std::invalid_argument);
}

}  // namespace
}  // namespace sb::harness
