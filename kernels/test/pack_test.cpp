// Packing regions of a tensor into one buffer and back, on CPU, against plain slicing.

#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include "kernels/pack.h"

namespace sb::kernels {
namespace {

// Uneven boxes of a 7x5x3 tensor, an empty one among them, not in storage order.
std::vector<Region> someRegions() {
  return {{{4, 0, 0}, {3, 5, 3}},
          {{0, 2, 1}, {4, 3, 2}},
          {{1, 1, 0}, {0, 2, 3}},
          {{0, 0, 0}, {2, 2, 1}}};
}

at::Tensor slice(const at::Tensor& t, const Region& r) {
  at::Tensor v = t;
  for (size_t d = 0; d < r.offset.size(); ++d) v = v.narrow(d, r.offset[d], r.length[d]);
  return v;
}

TEST(Pack, RegionsArePackedOneAfterAnotherInRowMajorOrder) {
  const at::Tensor t = at::arange(7 * 5 * 3, at::kFloat).view({7, 5, 3});
  const auto regions = someRegions();
  const at::Tensor packed = packRegions(t, regions);
  std::vector<at::Tensor> parts;
  for (const auto& r : regions) parts.push_back(slice(t, r).reshape({-1}));
  EXPECT_TRUE(at::equal(packed, at::cat(parts)));
  EXPECT_EQ(packed.numel(), 3 * 5 * 3 + 4 * 3 * 2 + 0 + 2 * 2 * 1);
}

TEST(Pack, UnpackWritesTheRegionsBackAndNothingElse) {
  const at::Tensor t = at::randn({7, 5, 3}, at::kDouble);
  const auto regions = someRegions();
  const at::Tensor packed = packRegions(t, regions);
  at::Tensor back = at::zeros_like(t);
  unpackRegions(packed, back, regions);
  at::Tensor mask = at::zeros({7, 5, 3}, at::kBool);
  for (const auto& r : regions) {
    EXPECT_TRUE(at::equal(slice(back, r), slice(t, r)));
    slice(mask, r).fill_(true);
  }
  EXPECT_TRUE(at::equal(back.masked_select(mask.logical_not()),
                        at::zeros({mask.logical_not().sum().item<int64_t>()}, at::kDouble)));
}

TEST(Pack, AStridedViewPacksItsOwnElements) {
  const at::Tensor base = at::arange(5 * 7 * 3, at::kFloat).view({5, 7, 3});
  const at::Tensor t = base.transpose(0, 1);  // 7x5x3, not contiguous
  const auto regions = someRegions();
  std::vector<at::Tensor> parts;
  for (const auto& r : regions) parts.push_back(slice(t, r).reshape({-1}));
  EXPECT_TRUE(at::equal(packRegions(t, regions), at::cat(parts)));
}

TEST(Pack, TheKernelsBoxViewsAddressTheElementsTheCpuPacks) {
  // A strided view with a storage offset: transposed, then narrowed.
  const at::Tensor base = at::arange(5 * 7 * 3, at::kFloat).view({5, 7, 3});
  const at::Tensor t = base.transpose(0, 1).narrow(1, 1, 4);  // 7x4x3
  const std::vector<Region> regions = {
      {{4, 0, 0}, {3, 4, 3}}, {{0, 1, 1}, {4, 3, 2}}, {{1, 1, 0}, {0, 2, 3}}};
  const auto views = boxViews(t, regions);
  // Walk each box as the kernel does: from the storage, by its sizes and strides.
  const float* storage = base.data_ptr<float>();
  std::vector<float> walked;
  for (const auto& v : views) {
    int64_t numel = 1;
    for (int d = 0; d < v.ndim; ++d) numel *= v.sizes[d];
    for (int64_t k = 0; k < numel; ++k) {
      int64_t rest = k, at = v.offset;
      for (int d = v.ndim - 1; d >= 0; --d) {
        at += (rest % v.sizes[d]) * v.strides[d];
        rest /= v.sizes[d];
      }
      EXPECT_EQ(v.packedOffset + k, static_cast<int64_t>(walked.size()));
      walked.push_back(storage[at]);
    }
  }
  const at::Tensor packed = packRegions(t, regions);
  ASSERT_EQ(packed.numel(), static_cast<int64_t>(walked.size()));
  EXPECT_TRUE(at::equal(packed, at::tensor(walked)));
}

TEST(Pack, AWrongSizedBufferIsRefused) {
  at::Tensor t = at::zeros({7, 5, 3});
  EXPECT_THROW(unpackRegions(at::zeros({3}), t, someRegions()), c10::Error);
}

}  // namespace
}  // namespace sb::kernels
