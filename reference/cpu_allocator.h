#pragma once

#include <cstddef>

#include <c10/core/Allocator.h>

#ifndef SB_TORCH_VERSION_NUM
#error \
    "SB_TORCH_VERSION_NUM (LibTorch's version, as 113 or 213) is set by CMakeLists.txt's sb_torch"
#endif

namespace sb::reference {

// A CPU allocator that hands out memory its subclass obtains (from the allocator it wraps),
// over LibTorch's two signatures of c10::Allocator: 2.3 made allocate() non-const and added
// copy_data(). The subclass says what one allocation is (allocateBytes) and how its memory is
// freed (raw_deleter); the memory tracker and the model loader's recorder are the two.
class WrappingCpuAllocator : public c10::Allocator {
 public:
#if SB_TORCH_VERSION_NUM >= 203
  c10::DataPtr allocate(size_t n) final { return allocateBytes(n); }
  void copy_data(void* dest, const void* src, std::size_t count) const final {
    default_copy_data(dest, src, count);
  }
#else
  c10::DataPtr allocate(size_t n) const final { return allocateBytes(n); }
#endif

 protected:
  virtual c10::DataPtr allocateBytes(size_t n) const = 0;
};

}  // namespace sb::reference
