#pragma once

// Packing boxes of a tensor into one contiguous buffer and back: the two sides of an all-to-all
// of uneven or permuted shards (harness/redistribute_exec.h's exchangeBoxes). On CPU, one ATen
// copy per box; on a CUDA tensor (with a CUDA build of LibTorch), one kernel launch for all of
// them (kernels/pack.cu).

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

#include "kernels/cuda_api.h"

namespace sb::kernels {

// A box of a tensor: an offset and a length per dimension.
struct Region {
  std::vector<int64_t> offset;
  std::vector<int64_t> length;
  int64_t numel() const;
};

// The regions of `t`, one after another in row-major order each, in a new flat contiguous
// tensor of their total size.
at::Tensor packRegions(const at::Tensor& t, const std::vector<Region>& regions);
// Writes consecutive pieces of the flat `packed` into the regions of `t` (the inverse).
void unpackRegions(const at::Tensor& packed, at::Tensor& t, const std::vector<Region>& regions);

// The regions of a tensor with `t`'s strides and storage offset as the CUDA kernel's boxes, packed
// one after another. Throws for more than cuda::kMaxDims dimensions.
std::vector<cuda::BoxView> boxViews(const at::Tensor& t, const std::vector<Region>& regions);

// The CPU implementation, also the reference the CUDA kernel is tested against.
void packRegionsCpu(const at::Tensor& t, const std::vector<Region>& regions, at::Tensor& packed);
void unpackRegionsCpu(const at::Tensor& packed, at::Tensor& t, const std::vector<Region>& regions);

}  // namespace sb::kernels
