#pragma once

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace sb::kernels::cuda {

// Throws with the call and CUDA's message.
inline void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    throw std::runtime_error(std::string(what) + " failed: " + cudaGetErrorString(err));
  }
}

}  // namespace sb::kernels::cuda
