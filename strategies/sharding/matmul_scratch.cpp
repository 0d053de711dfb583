// Measuring a product's scratch (matmul_scratch.h): the tracker's peak over the call, less
// what was live before and the result.

#include "strategies/sharding/matmul_scratch.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/function.h>

#include <algorithm>
#include <functional>

#include "harness/measure/memory.h"
#include "reference/workload.h"

namespace sb::strategies {
namespace {

// What `op` holds beyond its result at its peak, on the calling thread's allocator bucket.
int64_t heldBeyondResult(const std::function<at::Tensor()>& op) {
  at::Tensor out;
  const int64_t held = harness::MemoryTracker::instance().heldDuring(
      harness::MemoryTracker::threadBucket(), [&] { out = op(); });
  return std::max<int64_t>(held - static_cast<int64_t>(out.nbytes()), 0);
}

}  // namespace

int64_t matmulScratchBytes(at::IntArrayRef aSizes, bool aTransposed, at::IntArrayRef bSizes,
                           bool bTransposed, at::ScalarType dtype) {
  const auto opts = at::TensorOptions().dtype(dtype).device(reference::caseDevice());
  if (!opts.device().is_cpu()) return 0;
  const auto make = [&](at::IntArrayRef sizes, bool transposed) {
    return transposed ? at::zeros({sizes[1], sizes[0]}, opts).t() : at::zeros(sizes, opts);
  };
  const at::Tensor a = make(aSizes, aTransposed), b = make(bSizes, bTransposed);
  return heldBeyondResult([&] { return at::mm(a, b); });
}

int64_t linearScratchBytes(at::IntArrayRef xSizes, at::IntArrayRef wSizes, bool bias,
                           at::ScalarType dtype) {
  const auto opts = at::TensorOptions().dtype(dtype).device(reference::caseDevice());
  if (!opts.device().is_cpu()) return 0;
  const at::Tensor x = at::zeros(xSizes, opts), w = at::zeros(wSizes, opts);
  const at::Tensor b = bias ? at::zeros({wSizes[0]}, opts) : at::Tensor();
  return heldBeyondResult([&] { return at::linear(x, w, b); });
}

bool linearRunsAddmm(at::IntArrayRef xSizes, at::IntArrayRef wSizes, at::ScalarType dtype) {
  const auto opts = at::TensorOptions().dtype(dtype).device(reference::caseDevice());
  const at::AutoGradMode grad(true);
  const at::Tensor x = at::zeros(xSizes, opts).requires_grad_(true);
  const at::Tensor w = at::zeros(wSizes, opts), b = at::zeros({wSizes[0]}, opts);
  const at::Tensor y = at::linear(x, w, b);
  // Through the views that fold the rows back into the input's shape, to the product.
  auto node = y.grad_fn();  // shared_ptr (1.13) or intrusive_ptr (2.x)
  while (node && node->name().find("View") != std::string::npos && !node->next_edges().empty()) {
    node = node->next_edges()[0].function;
  }
  return node && node->name() == "AddmmBackward0";
}

}  // namespace sb::strategies
