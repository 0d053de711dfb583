// Packing and unpacking boxes of a strided tensor in one launch: each thread takes elements of
// the packed buffer, finds their box by binary search over the boxes' packed offsets, and
// copies the element from (or to) its place in the strided tensor. Uneven and permuted shards
// are just boxes of other sizes in another order.

#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "kernels/cuda_api.h"
#include "kernels/cuda_check.cuh"

namespace sb::kernels::cuda {
namespace {

__global__ void packKernel(char* strided, char* packed, const BoxView* boxes, int count,
                           long long total, long long elemSize, bool unpack) {
  for (long long k = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; k < total;
       k += static_cast<long long>(gridDim.x) * blockDim.x) {
    int lo = 0, hi = count - 1;
    while (lo < hi) {  // the last box that starts at or before k
      const int mid = (lo + hi + 1) / 2;
      if (boxes[mid].packedOffset <= k) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    const BoxView& b = boxes[lo];
    long long rest = k - b.packedOffset;
    long long at = b.offset;
    for (int d = b.ndim - 1; d >= 0; --d) {
      at += (rest % b.sizes[d]) * b.strides[d];
      rest /= b.sizes[d];
    }
    char* s = strided + at * elemSize;
    char* p = packed + k * elemSize;
    for (long long c = 0; c < elemSize; ++c) {
      if (unpack) {
        s[c] = p[c];
      } else {
        p[c] = s[c];
      }
    }
  }
}

}  // namespace

void packBoxes(void* strided, void* packed, const BoxView* boxes, int count, int64_t elemSize,
               bool unpack, void* stream) {
  // Empty boxes hold nothing; the rest must be laid out in the packed buffer in order.
  std::vector<BoxView> live;
  long long total = 0;
  for (int i = 0; i < count; ++i) {
    long long numel = 1;
    for (int d = 0; d < boxes[i].ndim; ++d) numel *= boxes[i].sizes[d];
    if (numel == 0) continue;
    live.push_back(boxes[i]);
    total = std::max(total, boxes[i].packedOffset + numel);
  }
  if (live.empty()) return;
  std::sort(live.begin(), live.end(),
            [](const BoxView& x, const BoxView& y) { return x.packedOffset < y.packedOffset; });
  const auto st = static_cast<cudaStream_t>(stream);
  BoxView* device = nullptr;
  check(cudaMalloc(&device, sizeof(BoxView) * live.size()), "cudaMalloc");
  check(cudaMemcpyAsync(device, live.data(), sizeof(BoxView) * live.size(), cudaMemcpyHostToDevice,
                        st),
        "cudaMemcpyAsync");
  const int threads = 256;
  const int blocks = static_cast<int>(std::min<long long>(4096, (total + threads - 1) / threads));
  packKernel<<<blocks, threads, 0, st>>>(static_cast<char*>(strided), static_cast<char*>(packed),
                                         device, static_cast<int>(live.size()), total, elemSize,
                                         unpack);
  check(cudaGetLastError(), "packKernel launch");
  check(cudaStreamSynchronize(st), "cudaStreamSynchronize");
  check(cudaFree(device), "cudaFree");
}

}  // namespace sb::kernels::cuda
