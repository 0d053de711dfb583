#pragma once

// The stream the kernels launch on: the one LibTorch queues a tensor's work on for the calling
// thread (a rank's own stream on a GPU), so that a kernel runs after the work that made its
// inputs and before the work that reads its outputs. LibTorch's pool streams do not wait for
// the default stream; a kernel launched there could read a rank's tensor before it is written.

#include <ATen/core/Tensor.h>

#if SB_TORCH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

namespace sb::kernels {

// nullptr (the default stream) where LibTorch has no CUDA: there no CUDA tensor exists.
inline void* currentStream(const at::Tensor& t) {
#if SB_TORCH_CUDA
  return c10::cuda::getCurrentCUDAStream(t.device().index()).stream();
#else
  (void)t;
  return nullptr;
#endif
}

}  // namespace sb::kernels
