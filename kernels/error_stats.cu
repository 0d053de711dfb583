// Error statistics of two device tensors in one pass, the numbers errorStatsCpu computes.
//
// Every thread walks its elements (a grid-stride loop) and keeps a partial: the mismatch count,
// the maxima of the absolute, relative and tolerance-relative errors, and two candidates for the
// worst element (the mismatch furthest past its tolerance, the largest absolute error). A block
// reduces its threads' partials in shared memory; the host reduces the blocks' (at most 1024 of
// them, a few KiB) and never sees the tensors. The rules are errorStatsCpu's: values compared
// in float64, NaN and Inf never match, a maximum that meets a NaN is NaN (torch.max), and the
// worst element is the first of the largest (torch.argmax, NaN largest).

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/cuda_api.h"
#include "kernels/cuda_check.cuh"

namespace sb::kernels::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 1024;

struct Partial {
  long long mismatches;
  double maxAbs, maxRel, maxRatio;
  double badScore;  // the mismatch furthest past its tolerance
  long long badIndex;
  double absScore;  // the largest absolute error
  long long absIndex;
};

__host__ __device__ inline double nanMax(double a, double b) {
  return (a != a || b != b) ? NAN : (a > b ? a : b);
}

// argmax's order: NaN above everything, then the larger value, then the lower index.
__host__ __device__ inline bool better(double v, long long i, double w, long long j) {
  const bool vn = v != v, wn = w != w;
  if (vn != wn) return vn;
  if (!vn && v != w) return v > w;
  return i < j;
}

__host__ __device__ inline Partial emptyPartial() {
  return {0, 0.0, 0.0, 0.0, -INFINITY, LLONG_MAX, -INFINITY, LLONG_MAX};
}

__host__ __device__ inline void combine(Partial& p, const Partial& q) {
  p.mismatches += q.mismatches;
  p.maxAbs = nanMax(p.maxAbs, q.maxAbs);
  p.maxRel = nanMax(p.maxRel, q.maxRel);
  p.maxRatio = nanMax(p.maxRatio, q.maxRatio);
  if (q.badIndex != LLONG_MAX && better(q.badScore, q.badIndex, p.badScore, p.badIndex)) {
    p.badScore = q.badScore;
    p.badIndex = q.badIndex;
  }
  if (q.absIndex != LLONG_MAX && better(q.absScore, q.absIndex, p.absScore, p.absIndex)) {
    p.absScore = q.absScore;
    p.absIndex = q.absIndex;
  }
}

template <class T>
__device__ inline double toDouble(T x) {
  return static_cast<double>(x);
}
template <>
__device__ inline double toDouble<__half>(__half x) {
  return static_cast<double>(__half2float(x));
}
template <>
__device__ inline double toDouble<__nv_bfloat16>(__nv_bfloat16 x) {
  return static_cast<double>(__bfloat162float(x));
}

// T: the element type; Bits: an unsigned integer of its width, for the bitwise comparison.
template <class T, class Bits>
__global__ void errorStatsKernel(const T* a, const T* e, long long n, double rtol, double atol,
                                 bool exact, Partial* out) {
  __shared__ Partial shared[kThreads];
  Partial p = emptyPartial();
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    const double av = toDouble(a[i]), ev = toDouble(e[i]);
    const double diff = fabs(av - ev);
    const bool finite = isfinite(av) && isfinite(ev);
    // Rounded as the CPU rounds it, a product and then a sum: nvcc would otherwise contract
    // them into one fused multiply-add, and the ratios would differ in the last bit.
    const double allowed = __dadd_rn(atol, __dmul_rn(rtol, fabs(ev)));
    bool bad;
    if (exact) {
      const Bits ab = reinterpret_cast<const Bits*>(a)[i];
      const Bits eb = reinterpret_cast<const Bits*>(e)[i];
      bad = ab != eb || !finite;
    } else {
      bad = diff > allowed || !finite;
    }
    const double absErr = finite ? diff : INFINITY;
    const double relErr = diff == 0 ? 0.0 : absErr / fabs(ev);
    const double ratio = exact ? 0.0 : (absErr == 0 ? 0.0 : absErr / allowed);
    p.mismatches += bad ? 1 : 0;
    p.maxAbs = nanMax(p.maxAbs, absErr);
    p.maxRel = nanMax(p.maxRel, relErr);
    p.maxRatio = nanMax(p.maxRatio, ratio);
    const double excess = exact ? absErr : __dsub_rn(absErr, allowed);
    if (bad && better(excess, i, p.badScore, p.badIndex)) {
      p.badScore = excess;
      p.badIndex = i;
    }
    if (better(absErr, i, p.absScore, p.absIndex)) {
      p.absScore = absErr;
      p.absIndex = i;
    }
  }
  shared[threadIdx.x] = p;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) combine(shared[threadIdx.x], shared[threadIdx.x + stride]);
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = shared[0];
}

template <class T, class Bits>
Partial launch(const void* a, const void* e, long long n, double rtol, double atol, bool exact,
               cudaStream_t stream) {
  const int blocks =
      static_cast<int>(std::min<long long>(kMaxBlocks, (n + kThreads - 1) / kThreads));
  Partial* partials = nullptr;
  check(cudaMalloc(&partials, sizeof(Partial) * blocks), "cudaMalloc");
  errorStatsKernel<T, Bits><<<blocks, kThreads, 0, stream>>>(
      static_cast<const T*>(a), static_cast<const T*>(e), n, rtol, atol, exact, partials);
  check(cudaGetLastError(), "errorStatsKernel launch");
  std::vector<Partial> host(blocks);
  check(cudaMemcpyAsync(host.data(), partials, sizeof(Partial) * blocks, cudaMemcpyDeviceToHost,
                        stream),
        "cudaMemcpyAsync");
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  check(cudaFree(partials), "cudaFree");
  Partial total = emptyPartial();
  for (const auto& p : host) combine(total, p);
  return total;
}

}  // namespace

RawErrorStats errorStats(const void* actual, const void* expected, Dtype dtype, int64_t n,
                         double rtol, double atol, bool exact, void* stream) {
  RawErrorStats s;
  if (n == 0) return s;
  const auto st = static_cast<cudaStream_t>(stream);
  Partial p{};
  switch (dtype) {
    case Dtype::kFloat32:
      p = launch<float, unsigned int>(actual, expected, n, rtol, atol, exact, st);
      break;
    case Dtype::kFloat64:
      p = launch<double, unsigned long long>(actual, expected, n, rtol, atol, exact, st);
      break;
    case Dtype::kFloat16:
      p = launch<__half, unsigned short>(actual, expected, n, rtol, atol, exact, st);
      break;
    case Dtype::kBFloat16:
      p = launch<__nv_bfloat16, unsigned short>(actual, expected, n, rtol, atol, exact, st);
      break;
  }
  s.mismatches = p.mismatches;
  s.maxAbsErr = p.maxAbs;
  s.maxRelErr = p.maxRel;
  s.maxErrRatio = exact ? (p.mismatches > 0 ? INFINITY : 0.0) : p.maxRatio;
  s.worst = p.mismatches > 0 ? p.badIndex : p.absIndex;
  return s;
}

}  // namespace sb::kernels::cuda
