#include "kernels/pack.h"

#include <ATen/ATen.h>

#include "kernels/cuda_api.h"
#include "kernels/stream.h"

namespace sb::kernels {
namespace {

at::Tensor view(at::Tensor t, const Region& r) {
  for (size_t d = 0; d < r.offset.size(); ++d) {
    t = t.narrow(static_cast<int64_t>(d), r.offset[d], r.length[d]);
  }
  return t;
}

int64_t total(const std::vector<Region>& regions) {
  int64_t n = 0;
  for (const auto& r : regions) n += r.numel();
  return n;
}

}  // namespace

std::vector<cuda::BoxView> boxViews(const at::Tensor& t, const std::vector<Region>& regions) {
  TORCH_CHECK(t.dim() <= cuda::kMaxDims, "packing supports up to ", cuda::kMaxDims,
              " dimensions, got ", t.dim());
  std::vector<cuda::BoxView> views;
  int64_t packed = 0;
  for (const auto& r : regions) {
    cuda::BoxView v;
    v.ndim = static_cast<int>(t.dim());
    v.offset = t.storage_offset();
    for (int64_t d = 0; d < t.dim(); ++d) {
      v.sizes[d] = r.length[d];
      v.strides[d] = t.stride(d);
      v.offset += r.offset[d] * t.stride(d);
    }
    v.packedOffset = packed;
    packed += r.numel();
    views.push_back(v);
  }
  return views;
}

int64_t Region::numel() const {
  int64_t n = 1;
  for (int64_t l : length) n *= l;
  return n;
}

void packRegionsCpu(const at::Tensor& t, const std::vector<Region>& regions, at::Tensor& packed) {
  int64_t off = 0;
  for (const auto& r : regions) {
    const int64_t n = r.numel();
    if (n > 0) packed.narrow(0, off, n).view(r.length).copy_(view(t, r));
    off += n;
  }
}

void unpackRegionsCpu(const at::Tensor& packed, at::Tensor& t, const std::vector<Region>& regions) {
  int64_t off = 0;
  for (const auto& r : regions) {
    const int64_t n = r.numel();
    if (n > 0) view(t, r).copy_(packed.narrow(0, off, n).view(r.length));
    off += n;
  }
}

at::Tensor packRegions(const at::Tensor& t, const std::vector<Region>& regions) {
  at::Tensor packed = at::empty({total(regions)}, t.options());
#ifdef SB_HAVE_CUDA_KERNELS
  if (t.is_cuda()) {
    const auto views = boxViews(t, regions);
    // Offsets are in elements from the storage's start.
    void* base = static_cast<char*>(t.data_ptr()) - t.storage_offset() * t.element_size();
    cuda::packBoxes(base, packed.data_ptr(), views.data(), static_cast<int>(views.size()),
                    t.element_size(), /*unpack=*/false, currentStream(t));
    return packed;
  }
#endif
  packRegionsCpu(t, regions, packed);
  return packed;
}

void unpackRegions(const at::Tensor& packed, at::Tensor& t, const std::vector<Region>& regions) {
  TORCH_CHECK(packed.dim() == 1 && packed.numel() == total(regions) && packed.is_contiguous(),
              "unpack: the packed buffer holds ", packed.numel(), " elements, the regions ",
              total(regions));
  TORCH_CHECK(packed.device() == t.device() && packed.scalar_type() == t.scalar_type(),
              "unpack: the packed buffer is ", packed.scalar_type(), " on ", packed.device(),
              ", the tensor ", t.scalar_type(), " on ", t.device());
#ifdef SB_HAVE_CUDA_KERNELS
  if (t.is_cuda()) {
    const auto views = boxViews(t, regions);
    void* base = static_cast<char*>(t.data_ptr()) - t.storage_offset() * t.element_size();
    cuda::packBoxes(base, const_cast<void*>(packed.data_ptr()), views.data(),
                    static_cast<int>(views.size()), t.element_size(), /*unpack=*/true,
                    currentStream(t));
    return;
  }
#endif
  unpackRegionsCpu(packed, t, regions);
}

}  // namespace sb::kernels
