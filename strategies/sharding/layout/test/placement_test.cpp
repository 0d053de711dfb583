// Layouts: both spellings, nested and uneven shards, and the errors for impossible ones.

#include <gtest/gtest.h>

#include "strategies/sharding/layout/placement.h"

namespace sb::harness {
namespace {

std::string errorOf(const std::string& text, int ndim, int meshNdim) {
  try {
    Layout::parse(text, ndim, meshNdim);
  } catch (const LayoutError& e) {
    return e.what();
  }
  return "";
}

TEST(Layout, DTensorAndColossalSpellingsNameTheSameLayout) {
  const Layout a = Layout::parse("[Shard(0), Shard(0)]", 3, 2);
  EXPECT_EQ(a, Layout::parse("[S01, R, R]", 3, 2));
  EXPECT_EQ(a, Layout::parse("S01RR", 3, 2));
  EXPECT_EQ(a, Layout::parse("[S(0), S(0)]", 3, 2));
  EXPECT_EQ(a.axesOf(0), (std::vector<int>{0, 1}));

  const Layout p = Layout::parse("[Partial(sum), Shard(1)]", 3, 2);
  EXPECT_EQ(p, Layout::parse("[R, S1, R] P0", 3, 2));
  EXPECT_EQ(p, Layout::parse("RS1RP0", 3, 2));
  EXPECT_EQ(p, Layout::parse("[P, S(1)]", 3, 2));
  EXPECT_TRUE(p.isPartial(0));
  EXPECT_EQ(p.shardDimOf(1), 1);
  EXPECT_EQ(p.sequence(), "[R, S1, R] P0");
  EXPECT_EQ(p.compact(), "RS1RP0");
  EXPECT_EQ(p.dtensor(2), "[Partial(sum), Shard(1)]");
}

TEST(Layout, EveryEnumeratedLayoutRoundTripsThroughEverySpelling) {
  for (int meshNdim : {1, 2, 3}) {
    for (const Layout& l : enumerateLayouts(3, meshNdim, meshNdim)) {
      EXPECT_EQ(Layout::parse(l.sequence(), 3, meshNdim), l) << l.sequence();
      EXPECT_EQ(Layout::parse(l.compact(), 3, meshNdim), l) << l.compact();
      EXPECT_EQ(Layout::parse(l.dtensor(meshNdim), 3, meshNdim), l) << l.dtensor(meshNdim);
    }
  }
}

TEST(Layout, A3DTensorOnA2x2MeshHas24LayoutsWithAtMostOnePartialAxis) {
  // Each of the two axes is R, P, S0, S1 or S2 (5 x 5), less the one with both axes partial.
  EXPECT_EQ(enumerateLayouts(3, 2, 1).size(), 24u);
  EXPECT_EQ(enumerateLayouts(3, 2, 2).size(), 25u);
  EXPECT_EQ(enumerateLayouts(3, 2, 0).size(), 16u);
  EXPECT_EQ(enumerateLayouts(2, 1, 1).size(), 4u);
}

TEST(Layout, AllReplicatedReadsInEitherSpelling) {
  // A 1-D tensor on a 2-D mesh: "[R, R]" is DTensor's (an entry per axis), "[R]" ColossalAI's.
  EXPECT_EQ(Layout::parse("[R, R]", 1, 2), Layout(1));
  EXPECT_EQ(Layout::parse("[R]", 1, 2), Layout(1));
}

TEST(Layout, ImpossibleLayoutsAreRefusedNamingTheProblem) {
  EXPECT_NE(errorOf("[Shard(3), Replicate()]", 3, 2).find("dimension 3"), std::string::npos);
  EXPECT_NE(errorOf("[S0, S0, R]", 3, 2).find("mesh axis 0 is used twice"), std::string::npos);
  EXPECT_NE(errorOf("[S0, R, R] P0", 3, 2).find("used twice"), std::string::npos);
  EXPECT_NE(errorOf("[S2, R, R]", 3, 2).find("mesh axis 2"), std::string::npos);
  EXPECT_NE(errorOf("[R, R]", 3, 3).find("2 entries"), std::string::npos);
  EXPECT_NE(errorOf("[Shard(0)]", 3, 2).find("1 placements"), std::string::npos);
  EXPECT_NE(errorOf("[S0, Q, R]", 3, 2).find("'Q'"), std::string::npos);
  EXPECT_NE(errorOf("nonsense", 3, 2).find("layout 'nonsense'"), std::string::npos);
  EXPECT_NE(errorOf("", 3, 2).find("empty"), std::string::npos);
  EXPECT_NE(errorOf("[Shard(99999999999999), R]", 3, 2).find("3 dimensions"), std::string::npos);
  EXPECT_NE(errorOf("[Shard(-1), R]", 3, 2).find("is not a placement"), std::string::npos);
  for (const char* junk : {"[", "S", "P", "[S0,]", "]", "[]", "[R, R] P", "[R,R]Q1", "S0S", "()"}) {
    EXPECT_NE(errorOf(junk, 2, 2), "") << junk;
  }
  EXPECT_THROW(Layout::parse("[S10, R]", 2, 2).dtensor(2), LayoutError);
}

TEST(Layout, UnevenShardsFollowTorchChunk) {
  const Layout s0 = Layout::parse("[S0]", 1, 1);
  std::vector<int64_t> lengths, offsets;
  for (int64_t r = 0; r < 4; ++r) {
    const Box b = s0.box({13}, {4}, {r});
    lengths.push_back(b.length[0]);
    offsets.push_back(b.offset[0]);
  }
  // torch.chunk(13 elements, 4) gives chunks of ceil(13 / 4) = 4, the last one the rest.
  EXPECT_EQ(lengths, (std::vector<int64_t>{4, 4, 4, 1}));
  EXPECT_EQ(offsets, (std::vector<int64_t>{0, 4, 8, 12}));
  lengths.clear();
  for (int64_t r = 0; r < 4; ++r) lengths.push_back(s0.box({2}, {4}, {r}).length[0]);
  EXPECT_EQ(lengths, (std::vector<int64_t>{1, 1, 0, 0}));
}

TEST(Layout, NestedShardsChunkTheOuterAxisPiece) {
  // 7 on a 2x2 mesh: the outer axis makes 4 and 3, the inner axis 2+2 and 2+1.
  const Layout s01 = Layout::parse("[S01]", 1, 2);
  const Layout s10 = Layout::parse("[S10]", 1, 2);
  std::vector<std::pair<int64_t, int64_t>> got01, got10;
  for (int64_t a0 = 0; a0 < 2; ++a0) {
    for (int64_t a1 = 0; a1 < 2; ++a1) {
      const Box b = s01.box({7}, {2, 2}, {a0, a1});
      got01.emplace_back(b.offset[0], b.length[0]);
      const Box c = s10.box({7}, {2, 2}, {a0, a1});
      got10.emplace_back(c.offset[0], c.length[0]);
    }
  }
  EXPECT_EQ(got01, (std::vector<std::pair<int64_t, int64_t>>{{0, 2}, {2, 2}, {4, 2}, {6, 1}}));
  // S10: axis 1 is outer, so mesh coordinate (a0, a1) holds piece a1 * 2 + a0.
  EXPECT_EQ(got10, (std::vector<std::pair<int64_t, int64_t>>{{0, 2}, {4, 2}, {2, 2}, {6, 1}}));
}

TEST(Layout, DualSwapsReplicateAndPartialAndKeepsShards) {
  const Layout l = Layout::parse("[S0, R, R] P1", 3, 3);
  const Layout d = l.dual(3);
  EXPECT_EQ(d, Layout::parse("[S0, R, R] P2", 3, 3));
  EXPECT_EQ(d.dual(3), l);
}

}  // namespace
}  // namespace sb::harness
