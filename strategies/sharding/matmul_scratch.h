#pragma once

// The scratch a product holds while it runs, measured on this CPU. LibTorch 1.13 multiplies
// bfloat16 on a CPU with AVX-512 (avx512bw, vl and dq; torch.backends.mkldnn.enabled switches
// it) through oneDNN, whose scratch pad comes from the tracked CPU allocator and depends on the
// shapes, the operands' layouts, the CPU's ISA and the threads; elsewhere (float32's and
// float64's BLAS, ATen's own bfloat16 gemm) a product allocates nothing there but its result.
// A memory model that is exact on one CPU would lie on the other, so the executors' models
// measure these once, in prepare, on the rank's thread, and replay them as transient blocks
// right after the product's result.

#include <cstdint>

#include <ATen/core/Tensor.h>

namespace sb::strategies {

// The bytes at::mm(a, b) holds beyond its result while it runs, with operands of these sizes,
// a transposed one as the transposed view of a contiguous tensor (as autograd's mm backward
// hands them over). 0 off the CPU, where the models make no claim.
int64_t matmulScratchBytes(at::IntArrayRef aSizes, bool aTransposed, at::IntArrayRef bSizes,
                           bool bTransposed, at::ScalarType dtype);

// The same for at::linear(x, w, bias) on contiguous operands of these sizes (addmm for a 2-D
// or contiguous 3-D input with a bias, matmul otherwise, as LibTorch dispatches it).
int64_t linearScratchBytes(at::IntArrayRef xSizes, at::IntArrayRef wSizes, bool bias,
                           at::ScalarType dtype);

// Whether at::linear(x, w, bias) on a contiguous input of these sizes runs one fused addmm
// (its backward AddmmBackward0: the input's gradient first, then the weight's, then the
// bias's) rather than a product and an add (the bias's gradient first). Asked of this LibTorch,
// whose rule moved: 1.13 fuses a 2-D or 3-D input, 2.x any contiguous one.
bool linearRunsAddmm(at::IntArrayRef xSizes, at::IntArrayRef wSizes, at::ScalarType dtype);

}  // namespace sb::strategies
