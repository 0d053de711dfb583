#include "reference/workload.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

namespace sb::reference {
namespace {

at::Generator generatorFor(uint64_t seed, int stream) {
  // Distinct, well-mixed seeds per tensor (splitmix64 of seed and stream).
  uint64_t z = seed + 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(stream + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return at::make_generator<at::CPUGeneratorImpl>(z ^ (z >> 31));
}

// Integers in [-2, 2]: products and sums of a few thousand of them stay exact in every
// floating dtype down to bf16 for the reductions our workloads do at CI sizes.
at::Tensor exactValues(at::IntArrayRef shape, at::ScalarType dtype, const at::Generator& gen) {
  return at::randint(-2, 3, shape, gen, at::TensorOptions().dtype(at::kLong)).to(dtype);
}

at::Device gCaseDevice{at::kCPU};
thread_local std::optional<at::ScalarType> tRoundedAs;

}  // namespace

at::Device caseDevice() { return gCaseDevice; }
void setCaseDevice(at::Device device) { gCaseDevice = device; }
at::TensorOptions caseOptions(at::ScalarType dtype) {
  return at::TensorOptions().dtype(dtype).device(gCaseDevice);
}

ValuesRoundedAs::ValuesRoundedAs(at::ScalarType of) : was_(tRoundedAs) { tRoundedAs = of; }
ValuesRoundedAs::~ValuesRoundedAs() { tRoundedAs = was_; }

at::Tensor asCaseValues(const at::Tensor& t) {
  if (!tRoundedAs || !t.defined() || !at::isFloatingType(t.scalar_type())) return t;
  return t.to(*tRoundedAs).to(t.scalar_type());
}

at::Tensor scaledAsCase(const at::Tensor& t, double s) {
  if (!tRoundedAs || !at::isFloatingType(t.scalar_type())) return t * s;
  return (t.to(*tRoundedAs) * s).to(t.scalar_type());
}

at::Tensor toCaseDtype(const at::Tensor& t, at::Device device, at::ScalarType dtype) {
  if (tRoundedAs && at::isFloatingType(t.scalar_type()) && at::isFloatingType(dtype)) {
    return t.to(*tRoundedAs).to(device, dtype);
  }
  return t.to(device, dtype);
}

at::Tensor makeNormal(at::IntArrayRef shape, at::ScalarType dtype, uint64_t seed, int stream,
                      InputMode mode) {
  auto gen = generatorFor(seed, stream);
  if (mode == InputMode::kExact) return exactValues(shape, dtype, gen).to(caseDevice());
  return toCaseDtype(at::randn(shape, gen, at::TensorOptions().dtype(at::kFloat)), caseDevice(),
                     dtype);
}

at::Tensor makeUniform(at::IntArrayRef shape, double bound, at::ScalarType dtype, uint64_t seed,
                       int stream, InputMode mode) {
  auto gen = generatorFor(seed, stream);
  if (mode == InputMode::kExact) return exactValues(shape, dtype, gen).to(caseDevice());
  at::Tensor t = at::empty(shape, at::TensorOptions().dtype(at::kFloat));
  t.uniform_(-bound, bound, gen);
  return toCaseDtype(t, caseDevice(), dtype);
}

at::Tensor makeUniformAsDrawn(at::IntArrayRef shape, double bound, uint64_t seed, int stream) {
  auto gen = generatorFor(seed, stream);
  at::Tensor t = at::empty(shape, at::TensorOptions().dtype(at::kFloat));
  t.uniform_(-bound, bound, gen);
  return t.to(caseDevice(), at::kDouble);
}

std::string dimsString(at::IntArrayRef dims) {
  std::string s;
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? "x" : "") + std::to_string(dims[i]);
  return s;
}

void zeroGrads(const std::vector<std::pair<std::string, at::Tensor>>& params) {
  for (const auto& [name, p] : params) {
    if (p.grad().defined()) {
      p.mutable_grad().zero_();
    } else {
      p.mutable_grad() = at::zeros_like(p);
    }
  }
}

}  // namespace sb::reference
