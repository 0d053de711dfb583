#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

namespace sb::reference {

enum class InputMode {
  kRandom,  // normal / uniform values, as a model would see
  kExact,   // small integers, so that any summation order gives bitwise equal results
};

// Everything a case needs from the reference: the full inputs and parameters every rank
// shards from, and the tensors plain LibTorch computed from them.
struct WorkloadData {
  std::map<std::string, at::Tensor> inputs;    // e.g. input, weight, bias, grad_output
  std::map<std::string, at::Tensor> expected;  // e.g. output, grad_input, grad_weight, grad_bias
  // The names of `expected`, in the order records report them.
  std::vector<std::string> checked;
  // The reference's own rounding, per floating tensor of `expected`: max |expected - the same
  // computation in float64 from the same values| (see harness/run/rounding.h). Empty where it
  // was not measured; `roundingNote` then says why (or is empty: bitwise cases, float64 cases).
  std::map<std::string, double> rounding;
  std::string roundingNote;
  // The same, of the reference built in a lower dtype a strategy computes in
  // (Strategy::arithmeticDtype) from the case's values, against the float64 shadow.
  std::map<at::ScalarType, std::map<std::string, double>> roundingIn;
};

// A reference workload: validates a case's shape parameters and builds deterministic data.
class Workload {
 public:
  virtual ~Workload() = default;
  virtual std::string name() const = 0;
  virtual std::string description() const = 0;
  // Throws with the offending key and what was expected if `shape` does not describe an
  // instance of this workload.
  virtual void validate(const nlohmann::json& shape) const = 0;
  // "input=4x4x4x16;out=32;bias=1": the shape column of a record.
  virtual std::string shapeString(const nlohmann::json& shape) const = 0;
  // Builds the inputs from `seed` and runs forward and backward once with plain LibTorch.
  virtual WorkloadData build(const nlohmann::json& shape, at::ScalarType dtype, uint64_t seed,
                             InputMode mode) const = 0;
};

// The workload named `name`, or nullptr.
const Workload* findWorkload(const std::string& name);
std::vector<std::string> workloadNames();

// The device a case's tensors live on (its `device:`), set by the runner before it builds the
// case's reference and runs its strategies; the CPU unless set. Inputs are drawn on the CPU from
// the seeded generators below and then moved, so that every device sees the same values.
at::Device caseDevice();
void setCaseDevice(at::Device device);
// `dtype` on caseDevice(): what a workload's own parameters and index tensors are made with.
at::TensorOptions caseOptions(at::ScalarType dtype);

// While one is alive on a thread, a reference built there in float64 is the float64 shadow of a
// case of dtype `of`: every value a workload draws or computes as an input (makeNormal,
// makeUniform, an imported file's weights, asCaseValues) is rounded to `of` first, so that the
// shadow starts from exactly the values the case's own reference starts from.
class ValuesRoundedAs {
 public:
  explicit ValuesRoundedAs(at::ScalarType of);
  ~ValuesRoundedAs();
  ValuesRoundedAs(const ValuesRoundedAs&) = delete;
  ValuesRoundedAs& operator=(const ValuesRoundedAs&) = delete;

 private:
  std::optional<at::ScalarType> was_;
};
// `t`, a workload's input value computed in the dtype it builds in, as the case's own reference
// holds it: rounded through the shadowed dtype inside a ValuesRoundedAs, unchanged otherwise.
at::Tensor asCaseValues(const at::Tensor& t);
// `t * s` as the case's own reference computes it: in the shadowed dtype (the scalar cast to it,
// as ATen does) inside a ValuesRoundedAs, so a float32 case's `x * 0.02` is its own bits.
at::Tensor scaledAsCase(const at::Tensor& t, double s);
// `t` (drawn or loaded in any dtype) converted to `dtype` on `device`, as a case's input: through
// the shadowed dtype inside a ValuesRoundedAs.
at::Tensor toCaseDtype(const at::Tensor& t, at::Device device, at::ScalarType dtype);

// Deterministic tensor generation shared by the workloads: `stream` separates the tensors of
// one case so that each draws from its own generator.
at::Tensor makeNormal(at::IntArrayRef shape, at::ScalarType dtype, uint64_t seed, int stream,
                      InputMode mode);
at::Tensor makeUniform(at::IntArrayRef shape, double bound, at::ScalarType dtype, uint64_t seed,
                       int stream, InputMode mode);
// makeUniform's float draw as float64, never rounded as a shadow's values (ValuesRoundedAs): what
// token ids are computed from, which must be the case's own in its float64 shadow.
at::Tensor makeUniformAsDrawn(at::IntArrayRef shape, double bound, uint64_t seed, int stream);

// Zeroes every parameter's gradient in place, allocating zeros where there is none yet: a step
// then accumulates into them, as a training loop with zero_grad() does.
void zeroGrads(const std::vector<std::pair<std::string, at::Tensor>>& params);

// "4x4x4x16".
std::string dimsString(at::IntArrayRef dims);

// A Linear case: input [..., in_features], Linear(in_features, out_features, bias).
struct LinearShape {
  std::vector<int64_t> input;
  int64_t inFeatures = 0;
  int64_t outFeatures = 0;
  bool bias = true;

  // Throws naming the key on a malformed shape.
  static LinearShape parse(const nlohmann::json& shape);
  std::vector<int64_t> output() const;
  std::vector<int64_t> weight() const { return {outFeatures, inFeatures}; }
  int64_t rows() const;  // product of the leading dims of the input
};

// A tensor case (workload "tensor"): the full shape of the one tensor that is redistributed.
struct TensorShape {
  std::vector<int64_t> dims;
  // Throws naming the key on a malformed shape.
  static TensorShape parse(const nlohmann::json& shape);
};
const Workload* tensorWorkload();

}  // namespace sb::reference
