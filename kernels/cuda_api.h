#pragma once

// The CUDA kernels' entry points, on raw device pointers: no ATen and no CUDA headers here, so
// that every build (a CPU-only LibTorch included) compiles against them. Where the build found
// no CUDA compiler they exist too, and available() says why they cannot run.

#include <cstdint>
#include <string>

namespace sb::kernels::cuda {

// Whether this build has the kernels and a CUDA device is present; if not, `why` says which.
bool available(std::string* why);

enum class Dtype : int { kFloat32, kFloat64, kFloat16, kBFloat16 };

// errorStatsCpu's numbers (kernels/error_stats.h) for `n` contiguous elements of `dtype` at two
// device pointers, in one pass over both: each block reduces its elements and the block
// partials (a few KiB) come back to the host, never the tensors. `worst` is the flat index.
struct RawErrorStats {
  int64_t mismatches = 0;
  double maxAbsErr = 0;
  double maxRelErr = 0;
  double maxErrRatio = 0;
  int64_t worst = -1;
};
RawErrorStats errorStats(const void* actual, const void* expected, Dtype dtype, int64_t n,
                         double rtol, double atol, bool exact, void* stream = nullptr);

// A box of a strided tensor, in elements, and where it goes in the packed buffer.
constexpr int kMaxDims = 8;
struct BoxView {
  int ndim = 0;
  int64_t sizes[kMaxDims] = {};
  int64_t strides[kMaxDims] = {};  // of the strided tensor
  int64_t offset = 0;              // of the box's first element in the strided tensor
  int64_t packedOffset = 0;        // of the box in the packed buffer
};
// Copies every box of the strided tensor at `strided` into the contiguous buffer `packed`
// (unpack = false), or back (unpack = true), in one launch: what an all-to-all of uneven or
// permuted shards needs on either side.
void packBoxes(void* strided, void* packed, const BoxView* boxes, int count, int64_t elemSize,
               bool unpack, void* stream = nullptr);

// Attention forward by online softmax (kernels/attention.h) on contiguous device arrays of
// `dtype` (kFloat32 or kBFloat16): q and out [batchHeads, tq, headDim], k and v [batchHeads, tk,
// headDim]; lse [batchHeads, tq] is float32 whatever the dtype. One thread block per 64 queries
// of one head walks that head's keys 64 at a time through shared memory, in float32. Causal as
// onlineSoftmaxAttentionCpu: the queries are the last tq positions; a row that sees no key gets
// 0 and lse -inf. Asynchronous on `stream`. Throws std::invalid_argument for another dtype or
// headDim > kMaxAttentionHeadDim.
constexpr int64_t kMaxAttentionHeadDim = 128;
void attentionForward(const void* q, const void* k, const void* v, void* out, float* lse,
                      Dtype dtype, int64_t batchHeads, int64_t tq, int64_t tk, int64_t headDim,
                      bool causal, double scale, void* stream = nullptr);

// Device memory for tests and callers without a tensor library.
void* deviceAlloc(int64_t bytes);
void deviceFree(void* p);
void copyToDevice(void* dst, const void* src, int64_t bytes);
void copyToHost(void* dst, const void* src, int64_t bytes);

}  // namespace sb::kernels::cuda
