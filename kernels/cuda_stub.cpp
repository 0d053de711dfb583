// The CUDA entry points of a build without a CUDA compiler: they say so.

#include <stdexcept>

#include "kernels/cuda_api.h"

namespace sb::kernels::cuda {
namespace {
[[noreturn]] void none() {
  throw std::runtime_error(
      "this build has no CUDA kernels: no CUDA compiler was found at configure time");
}
}  // namespace

bool available(std::string* why) {
  if (why) *why = "this build has no CUDA kernels: no CUDA compiler was found at configure time";
  return false;
}
RawErrorStats errorStats(const void*, const void*, Dtype, int64_t, double, double, bool, void*) {
  none();
}
void packBoxes(void*, void*, const BoxView*, int, int64_t, bool, void*) { none(); }
void attentionForward(const void*, const void*, const void*, void*, float*, Dtype, int64_t, int64_t,
                      int64_t, int64_t, bool, double, void*) {
  none();
}
void* deviceAlloc(int64_t) { none(); }
void deviceFree(void*) { none(); }
void copyToDevice(void*, const void*, int64_t) { none(); }
void copyToHost(void*, const void*, int64_t) { none(); }

}  // namespace sb::kernels::cuda
