#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include "harness/box.h"
#include "strategies/sharding/layout/sharding_spec.h"

namespace sb::harness {
namespace {

TEST(ShardSpec, S01SplitsDimensionZeroFourWaysInAxisOrder) {
  const DeviceMesh mesh({2, 2});
  const ShardingSpec spec{{{0, 1}, {}, {}, {}}};
  EXPECT_EQ(spec.sequence(), (std::vector<std::string>{"S01", "R", "R", "R"}));
  for (int r = 0; r < 4; ++r) {
    const Box b = spec.box("input", {4, 4, 4, 16}, mesh, r);
    EXPECT_EQ(b.offset, (std::vector<int64_t>{r, 0, 0, 0})) << "rank " << r;
    EXPECT_EQ(b.length, (std::vector<int64_t>{1, 4, 4, 16}));
  }
}

TEST(ShardSpec, TwoDimensionsOnTwoAxesGiveATwoByTwoGrid) {
  const DeviceMesh mesh({2, 2});
  const ShardingSpec spec{{{1}, {0}}};  // S1S0
  // Rank 1 has coordinates (0, 1): row block 1 (axis 1), column block 0 (axis 0).
  const Box b = spec.box("w", {8, 6}, mesh, 1);
  EXPECT_EQ(b.offset, (std::vector<int64_t>{4, 0}));
  EXPECT_EQ(b.length, (std::vector<int64_t>{4, 3}));
  EXPECT_EQ(b.toString(), "[4:8, 0:3]");
}

TEST(ShardSpec, AShapeThatDoesNotDivideNamesTheDimension) {
  const DeviceMesh mesh({2, 2});
  const ShardingSpec spec{{{0}, {}, {}, {}}};
  auto why = spec.cannotShard("input", {1, 4, 4, 16}, mesh);
  ASSERT_TRUE(why.has_value());
  EXPECT_NE(why->find("input dimension 0 has size 1"), std::string::npos) << *why;
  EXPECT_THROW(spec.box("input", {1, 4, 4, 16}, mesh, 0), c10::Error);
  EXPECT_FALSE(spec.cannotShard("input", {2, 4, 4, 16}, mesh).has_value());
  EXPECT_TRUE(ShardingSpec{{{1}}}.cannotShard("b", {4}, DeviceMesh({4})).has_value());
}

TEST(ChunkSizes, UnevenDimGivesSmallerLastShard) {
  EXPECT_EQ(chunkSizes(13, 4), (std::vector<int64_t>{4, 4, 4, 1}));
  EXPECT_EQ(chunkOffsets(13, 4), (std::vector<int64_t>{0, 4, 8, 12}));
  EXPECT_EQ(chunkSizes(16, 4), (std::vector<int64_t>{4, 4, 4, 4}));
  EXPECT_EQ(chunkSizes(2, 4), (std::vector<int64_t>{1, 1, 0, 0}));
  EXPECT_EQ(chunkSizes(9, 4), (std::vector<int64_t>{3, 3, 3, 0}));
}

TEST(ChunkSizes, MatchTorchChunk) {
  for (int64_t n : {1, 2, 5, 13, 17}) {
    for (int64_t parts : {1, 2, 3, 4, 8}) {
      auto pieces = at::arange(n).chunk(parts);
      auto sizes = chunkSizes(n, parts);
      for (size_t i = 0; i < sizes.size(); ++i) {
        const int64_t expected = i < pieces.size() ? pieces[i].numel() : 0;
        EXPECT_EQ(sizes[i], expected) << n << " over " << parts << " chunk " << i;
      }
    }
  }
}

TEST(Placements, ChunkOfRankInvertsThePlacementList) {
  const std::vector<int> p = {2, 0, 3, 1};
  EXPECT_EQ(chunkOfRank(p, 2), 0);
  EXPECT_EQ(chunkOfRank(p, 0), 1);
  EXPECT_EQ(chunkOfRank(p, 3), 2);
  EXPECT_EQ(chunkOfRank(p, 1), 3);
  EXPECT_NO_THROW(checkPlacements(p, 4));
  EXPECT_THROW(checkPlacements({0, 0, 1, 2}, 4), c10::Error);
  EXPECT_THROW(checkPlacements({0, 1}, 4), c10::Error);
  const Box b = chunkBox({13, 16}, 0, 4, chunkOfRank(p, 1));
  EXPECT_EQ(b.offset, (std::vector<int64_t>{12, 0}));
  EXPECT_EQ(b.length, (std::vector<int64_t>{1, 16}));
}

TEST(SliceBox, ReturnsTheViewOfTheBox) {
  const at::Tensor full = at::arange(24).reshape({4, 6});
  const Box b{{1, 2}, {2, 3}};
  EXPECT_TRUE(at::equal(sliceBox(full, b), full.narrow(0, 1, 2).narrow(1, 2, 3)));
}

// DTensor's _StridedShard(0, split_factor=3) of GPT-2's fused qkv weight [3D, D] over 2 ranks:
// rank 1 holds rows D/2..D of q, of k and of v, one box of the view [3, D, D]; its local
// tensor is those rows stacked, [3 x D/2, D]. Written out here from the q, k, v blocks.
TEST(SliceBox, AViewBoxHoldsRowsOfEveryFactor) {
  const int64_t D = 4;
  const at::Tensor full = at::arange(3 * D * D).reshape({3 * D, D});
  const Box b{{0, 2, 0}, {3, 2, D}, {3, D, D}};
  const at::Tensor q = full.narrow(0, 2, 2), k = full.narrow(0, D + 2, 2),
                   v = full.narrow(0, 2 * D + 2, 2);
  EXPECT_TRUE(at::equal(sliceBox(full, b).reshape({6, D}), at::cat({q, k, v})));
  EXPECT_EQ(b.heldShape(full.sizes()), (std::vector<int64_t>{6, D}));
  EXPECT_EQ(b.toString(), "[0:3, 2:4, 0:4] of [3, 4, 4]");
  // Covering through the view marks the full tensor's elements (a view, not a copy).
  at::Tensor covered = at::zeros({3 * D, D}, at::kBool);
  sliceBox(covered, b).fill_(true);
  EXPECT_EQ(covered.sum().item<int64_t>(), 6 * D);
  EXPECT_TRUE(covered.narrow(0, D + 2, 2).all().item<bool>());
  EXPECT_FALSE(covered.narrow(0, D, 2).any().item<bool>());
  // Another view is another box: replicas are not matched across them.
  EXPECT_FALSE(b == (Box{{0, 2, 0}, {3, 2, D}}));
}

TEST(SliceBox, AViewThatDoesNotFactorTheShapeIsRefusedNamingBoth) {
  const at::Tensor full = at::zeros({12, 4});
  for (const std::vector<int64_t>& view :
       {std::vector<int64_t>{4, 12}, {5, 3, 4}, {3, 4, 2}, {12, 4, 1, 2}}) {
    const Box b{std::vector<int64_t>(view.size(), 0), view, view};
    try {
      sliceBox(full, b);
      ADD_FAILURE() << "view " << b.toString() << " accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("does not split the dimensions of a tensor of shape "
                                           "[12, 4]"),
                std::string::npos)
          << e.what();
    }
  }
  // A size-one factor is a factor.
  const Box ones{{0, 0, 0, 0}, {3, 4, 1, 4}, {3, 4, 1, 4}};
  EXPECT_EQ(ones.heldShape(full.sizes()), (std::vector<int64_t>{12, 4}));
}

}  // namespace
}  // namespace sb::harness
