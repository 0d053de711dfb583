// Attention forward by online softmax (kernels/attention.h), FlashAttention's tiling on the CUDA
// cores, in float32 whatever the input dtype.
//
// One thread block takes kTileQ = 64 queries of one (batch, head) and walks that head's keys
// kTileK = 64 at a time. Its 256 threads form a 16 x 16 grid: thread (ty, tx) owns the query rows
// ty + 16 i (i < 4) of the tile; of each score block the key columns tx + 16 j (j < 4); of the
// output the head-dim columns tx + 16 j (j < kD / 16). The 16 threads of one row set are one
// half-warp. Per key tile:
//   1. the block stages K and V in shared memory, as float, zero past tk and past the head dim;
//   2. each thread computes its 4 x 4 scores from Q (staged once, scaled) and K, and sets the
//      masked ones (causal, or keys past tk) to -inf;
//   3. each half-warp reduces its rows' maxima with shuffles, rescales its running sums l and
//      output accumulators by exp(m_old - m_new), and adds the row sums of p = exp(s - m_new);
//      p goes to shared memory over K, which is no longer needed;
//   4. each thread adds p V to its output accumulators, from its rows of p and all of V.
// At the end out = acc / l and lse = m + log l. A causal block stops at the last key its last row
// sees, and the blocks with the most keys to walk are launched first.

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <climits>
#include <cmath>
#include <stdexcept>
#include <string>

#include "kernels/cuda_api.h"
#include "kernels/cuda_check.cuh"

namespace sb::kernels::cuda {
namespace {

constexpr int kTileQ = 64;
constexpr int kTileK = 64;
constexpr int kSide = 16;  // the thread grid is kSide x kSide
constexpr int kThreads = kSide * kSide;
constexpr int kRowsPerThread = kTileQ / kSide;
constexpr int kKeysPerThread = kTileK / kSide;

__device__ inline float toFloat(float x) { return x; }
__device__ inline float toFloat(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ inline void store(float* p, float x) { *p = x; }
__device__ inline void store(__nv_bfloat16* p, float x) { *p = __float2bfloat16(x); }

// Over the 16 lanes of a half-warp: xor with offsets below 16 never leaves it.
__device__ inline float halfWarpMax(float x) {
  for (int offset = kSide / 2; offset > 0; offset /= 2) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  }
  return x;
}
__device__ inline float halfWarpSum(float x) {
  for (int offset = kSide / 2; offset > 0; offset /= 2) {
    x += __shfl_xor_sync(0xffffffffu, x, offset);
  }
  return x;
}

// Shared memory, in floats, for head-dim capacity kD. Q and K rows are padded by one float so
// that threads reading one column of different rows hit different banks; p [kTileQ][kTileK + 1]
// reuses K's space.
template <int kD>
struct Smem {
  static constexpr int kQ = kTileQ * (kD + 1);
  static constexpr int kKeys = kTileK * (kD + 1);
  static constexpr int kP = kTileQ * (kTileK + 1);
  static constexpr int kK = kKeys > kP ? kKeys : kP;  // K, and p over it
  static constexpr int kV = kTileK * kD;
  static constexpr size_t kBytes = sizeof(float) * (kQ + kK + kV);
};

template <class T, int kD>
__global__ void __launch_bounds__(kThreads, 2)
    attentionKernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                    T* __restrict__ out, float* __restrict__ lse, int tq, int tk, int d, int qTiles,
                    bool causal, float scale) {
  extern __shared__ float smem[];
  float* qs = smem;
  float* ks = qs + Smem<kD>::kQ;
  float* ps = ks;
  float* vs = ks + Smem<kD>::kK;

  int tile = static_cast<int>(blockIdx.x % qTiles);
  if (causal) tile = qTiles - 1 - tile;
  const long long head = blockIdx.x / qTiles;
  q += head * tq * d;
  out += head * tq * d;
  lse += head * tq;
  k += head * tk * d;
  v += head * tk * d;
  const int q0 = tile * kTileQ;
  const int tx = threadIdx.x % kSide, ty = threadIdx.x / kSide;

  for (int i = threadIdx.x; i < kTileQ * kD; i += kThreads) {
    const int r = i / kD, c = i % kD;
    qs[r * (kD + 1) + c] =
        (q0 + r < tq && c < d) ? toFloat(q[static_cast<long long>(q0 + r) * d + c]) * scale : 0.f;
  }

  float m[kRowsPerThread], l[kRowsPerThread], acc[kRowsPerThread][kD / kSide];
#pragma unroll
  for (int i = 0; i < kRowsPerThread; ++i) {
    m[i] = -INFINITY;
    l[i] = 0.f;
#pragma unroll
    for (int j = 0; j < kD / kSide; ++j) acc[i][j] = 0.f;
  }

  // Query row r is position r + offset of the keys' sequence.
  const int offset = tk - tq;
  const int lastRow = min(q0 + kTileQ, tq) - 1;
  const int keyEnd = causal ? max(0, min(tk, lastRow + offset + 1)) : tk;
  for (int k0 = 0; k0 < keyEnd; k0 += kTileK) {
    __syncthreads();  // the previous tile's p and V are read (the first time: Q is written)
    for (int i = threadIdx.x; i < kTileK * kD; i += kThreads) {
      const int r = i / kD, c = i % kD;
      const bool inside = k0 + r < tk && c < d;
      const long long at = static_cast<long long>(k0 + r) * d + c;
      ks[r * (kD + 1) + c] = inside ? toFloat(k[at]) : 0.f;
      vs[r * kD + c] = inside ? toFloat(v[at]) : 0.f;
    }
    __syncthreads();

    float s[kRowsPerThread][kKeysPerThread] = {};
#pragma unroll 4
    for (int c = 0; c < kD; ++c) {
      float qv[kRowsPerThread], kv[kKeysPerThread];
#pragma unroll
      for (int i = 0; i < kRowsPerThread; ++i) qv[i] = qs[(ty + kSide * i) * (kD + 1) + c];
#pragma unroll
      for (int j = 0; j < kKeysPerThread; ++j) kv[j] = ks[(tx + kSide * j) * (kD + 1) + c];
#pragma unroll
      for (int i = 0; i < kRowsPerThread; ++i) {
#pragma unroll
        for (int j = 0; j < kKeysPerThread; ++j) s[i][j] = fmaf(qv[i], kv[j], s[i][j]);
      }
    }
    __syncthreads();  // every warp is done with K before p overwrites it

#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) {
      const int row = q0 + ty + kSide * i;
      float rowMax = -INFINITY;
#pragma unroll
      for (int j = 0; j < kKeysPerThread; ++j) {
        const int key = k0 + tx + kSide * j;
        if (key >= tk || (causal && key > row + offset)) s[i][j] = -INFINITY;
        rowMax = fmaxf(rowMax, s[i][j]);
      }
      const float mNew = fmaxf(m[i], halfWarpMax(rowMax));
      // A row that has seen no key yet subtracts 0, not -inf: exp(-inf - -inf) would be NaN.
      const float shift = mNew == -INFINITY ? 0.f : mNew;
      const float rescale = expf(m[i] - shift);  // exp(m_old - m_new)
      float rowSum = 0.f;
#pragma unroll
      for (int j = 0; j < kKeysPerThread; ++j) {
        const float p = expf(s[i][j] - shift);
        ps[(ty + kSide * i) * (kTileK + 1) + tx + kSide * j] = p;
        rowSum += p;
      }
      l[i] = l[i] * rescale + halfWarpSum(rowSum);
      m[i] = mNew;
#pragma unroll
      for (int j = 0; j < kD / kSide; ++j) acc[i][j] *= rescale;
    }
    __syncwarp();  // a row's p is written and read by its own half-warp

#pragma unroll 4
    for (int c = 0; c < kTileK; ++c) {
      float pv[kRowsPerThread];
#pragma unroll
      for (int i = 0; i < kRowsPerThread; ++i) pv[i] = ps[(ty + kSide * i) * (kTileK + 1) + c];
#pragma unroll
      for (int j = 0; j < kD / kSide; ++j) {
        const float vv = vs[c * kD + tx + kSide * j];
#pragma unroll
        for (int i = 0; i < kRowsPerThread; ++i) acc[i][j] = fmaf(pv[i], vv, acc[i][j]);
      }
    }
  }

  // A row that saw no key (causal, tq > tk) has l = 0: output 0, lse -inf.
#pragma unroll
  for (int i = 0; i < kRowsPerThread; ++i) {
    const int row = q0 + ty + kSide * i;
    if (row >= tq) continue;
#pragma unroll
    for (int j = 0; j < kD / kSide; ++j) {
      const int col = tx + kSide * j;
      if (col < d) {
        store(out + static_cast<long long>(row) * d + col, l[i] > 0.f ? acc[i][j] / l[i] : 0.f);
      }
    }
    if (tx == 0) lse[row] = m[i] + logf(l[i]);
  }
}

template <class T, int kD>
void launch(const void* q, const void* k, const void* v, void* out, float* lse,
            long long batchHeads, int tq, int tk, int d, bool causal, float scale,
            cudaStream_t stream) {
  const int qTiles = (tq + kTileQ - 1) / kTileQ;
  const long long blocks = batchHeads * qTiles;
  if (blocks > INT_MAX) {
    throw std::invalid_argument("attentionForward: " + std::to_string(blocks) +
                                " query tiles are more than one launch takes (" +
                                std::to_string(INT_MAX) + ")");
  }
  constexpr size_t bytes = Smem<kD>::kBytes;
  check(cudaFuncSetAttribute(attentionKernel<T, kD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(bytes)),
        "cudaFuncSetAttribute");
  attentionKernel<T, kD><<<static_cast<unsigned>(blocks), kThreads, bytes, stream>>>(
      static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v),
      static_cast<T*>(out), lse, tq, tk, d, qTiles, causal, scale);
  check(cudaGetLastError(), "attentionKernel launch");
}

// The smallest head-dim capacity that holds d: the padding columns are zeros, but they are
// multiplied all the same.
template <class T>
void launchForHeadDim(const void* q, const void* k, const void* v, void* out, float* lse,
                      long long batchHeads, int tq, int tk, int d, bool causal, float scale,
                      cudaStream_t stream) {
  if (d <= 32) {
    launch<T, 32>(q, k, v, out, lse, batchHeads, tq, tk, d, causal, scale, stream);
  } else if (d <= 64) {
    launch<T, 64>(q, k, v, out, lse, batchHeads, tq, tk, d, causal, scale, stream);
  } else {
    launch<T, 128>(q, k, v, out, lse, batchHeads, tq, tk, d, causal, scale, stream);
  }
}

}  // namespace

void attentionForward(const void* q, const void* k, const void* v, void* out, float* lse,
                      Dtype dtype, int64_t batchHeads, int64_t tq, int64_t tk, int64_t headDim,
                      bool causal, double scale, void* stream) {
  static_assert(kMaxAttentionHeadDim == 128, "launchForHeadDim's largest capacity is 128");
  if (dtype != Dtype::kFloat32 && dtype != Dtype::kBFloat16) {
    throw std::invalid_argument("attentionForward: the kernel takes float32 or bfloat16");
  }
  if (headDim < 0 || headDim > kMaxAttentionHeadDim) {
    throw std::invalid_argument("attentionForward: head dim " + std::to_string(headDim) +
                                " is outside the kernel's 0.." +
                                std::to_string(kMaxAttentionHeadDim) +
                                " (its shared tiles and per-thread accumulators are sized for it)");
  }
  if (tq > INT_MAX || tk > INT_MAX) {
    throw std::invalid_argument("attentionForward: sequence lengths " + std::to_string(tq) +
                                " and " + std::to_string(tk) + " must fit in 32 bits");
  }
  if (batchHeads == 0 || tq == 0) return;
  const auto st = static_cast<cudaStream_t>(stream);
  const int n = static_cast<int>(tq), m = static_cast<int>(tk), d = static_cast<int>(headDim);
  const float s = static_cast<float>(scale);
  if (dtype == Dtype::kFloat32) {
    launchForHeadDim<float>(q, k, v, out, lse, batchHeads, n, m, d, causal, s, st);
  } else {
    launchForHeadDim<__nv_bfloat16>(q, k, v, out, lse, batchHeads, n, m, d, causal, s, st);
  }
}

}  // namespace sb::kernels::cuda
