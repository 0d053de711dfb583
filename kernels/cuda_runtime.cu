// Device discovery and memory for the CUDA kernels.

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "kernels/cuda_api.h"
#include "kernels/cuda_check.cuh"

namespace sb::kernels::cuda {

bool available(std::string* why) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    if (why) *why = std::string("no CUDA device: ") + cudaGetErrorString(err);
    cudaGetLastError();  // clear it
    return false;
  }
  if (count == 0) {
    if (why) *why = "no CUDA device: the driver reports none";
    return false;
  }
  return true;
}

void* deviceAlloc(int64_t bytes) {
  void* p = nullptr;
  check(cudaMalloc(&p, static_cast<size_t>(bytes > 0 ? bytes : 1)), "cudaMalloc");
  return p;
}
void deviceFree(void* p) { check(cudaFree(p), "cudaFree"); }
void copyToDevice(void* dst, const void* src, int64_t bytes) {
  check(cudaMemcpy(dst, src, static_cast<size_t>(bytes), cudaMemcpyHostToDevice), "cudaMemcpy");
}
void copyToHost(void* dst, const void* src, int64_t bytes) {
  check(cudaMemcpy(dst, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToHost), "cudaMemcpy");
}

}  // namespace sb::kernels::cuda
