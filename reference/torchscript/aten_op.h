#pragma once

// The graph operator "aten" (reference/ops.h): one operator of an imported TorchScript model
// that no strategy set knows, kept as data (its schema, how each argument is given, its
// operands' and outputs' shapes) and run by LibTorch's own kernel through the JIT's operator
// registry. Autograd records it as it records the module's own run, so a graph of such nodes
// has the module's gradients.
//
// Its shape keys:
//   schema    "aten::cumsum" or "aten::masked_fill.Scalar": the operator and its overload
//   operands  the tensor operands' shapes, in the order the arguments read them (input, other,
//             arg2, ... by OpShape::operands())
//   dtypes    each operand's dtype class: "float" (the case's dtype), "long", "bool", "int"
//   args      one per schema argument: {"tensor": k} (operand k), {"tensors": [k, ...]} (a list
//             of operands; -1 for an absent optional one), or a constant: {"int": 3},
//             {"double": 0.5 or "-inf"}, {"bool": true}, {"none": true}, {"ints": [...]},
//             {"doubles": [...]}, {"bools": [...]}, {"str": "none"}, {"device": "cpu"},
//             {"scalar_tensor": 2.0, "dtype": "float"} (a 0-dimensional constant)
//   outputs   the shapes of the tensors it returns, flattened (a list's, a tuple's) in order
//   view      optional, true: it returns a view of its first operand (its schema says so:
//             aten::slice, aten::expand, ...), which allocates nothing

#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

namespace sb::reference {

struct OpShape;

// Checks the keys of an "aten" shape and fills its operand shapes (input, other, extra).
// Throws (c10::Error) naming the key on a malformed one.
void parseAtenOp(OpShape& s);
// Its outputs' shapes.
std::vector<std::vector<int64_t>> atenOutputs(const OpShape& s);
// Whether operand `index` is of a floating dtype (differentiable).
bool atenOperandFloating(const OpShape& s, size_t index);
// Runs it: `operands` in OpShape::operands() order; returns every tensor it returns.
std::vector<at::Tensor> atenForward(const OpShape& s, const std::vector<at::Tensor>& operands);

// What the autograd node of an "aten" operator keeps until its backward: per operand (in
// OpShape::operands() order) whether it is saved, and whether its first output is. Learned by
// running the operator once on the CPU (zeros of the operands' shapes, dtypes and `strides`,
// where given: a non-contiguous operand may be copied and the copy saved; those with
// `requiresGrad` made by an autograd operator of their own, as a graph's values are) and
// counting the references the node took, once per shape, layout and pattern: what a node saves
// is LibTorch's choice and differs by version (1.13's MeanBackward1 saves its whole input,
// 2.x's only its element count). `known` is false where the operator could not be run so
// (an operand whose zeros it refuses): nothing is learned then. An operator returning a view
// saves nothing that lives beyond its operand.
//
// With `measure` (a function that runs its argument and returns the most bytes held above the
// start while it ran and the bytes held at its end less those at its start, on the calling
// thread's allocations: harness::MemoryTracker's, which reference/ does not link), the run is
// also measured, so that the allocations an operator makes inside itself are learned rather
// than assumed away: an LSTM's gates and cell states of every step, saved for its backward;
// a kernel's scratch; its backward's transients (the recurrent weight's gradient summed over
// the steps). `outputGrads` says which outputs a gradient reaches (all where empty).
struct AtenSaved {
  bool known = false;
  std::vector<bool> operands;
  bool output = false;
  // Measured (with `measure`):
  bool measured = false;
  int64_t forwardPeak = 0;   // most bytes above the start while the forward runs
  int64_t internal = 0;      // bytes the forward leaves beyond its outputs' new storage: what
                             // its node saved that is neither an operand nor an output
  int64_t backwardPeak = 0;  // most bytes above the start while its backward runs
  // Per output: the operand whose storage it views (-1: storage of its own), and its strides.
  std::vector<int> aliasOf;
  std::vector<std::vector<int64_t>> outStrides;
  bool passThrough = false;  // its one output is operand aliasOf[0] itself (aten::to of the
                             // dtype it has, type_as): no node, the gradient passes on
};
using AllocationMeasure =
    std::function<std::pair<int64_t, int64_t>(const std::function<void()>& run)>;
AtenSaved atenSavedTensors(const OpShape& s, at::ScalarType dtype,
                           const std::vector<bool>& requiresGrad,
                           const std::vector<std::vector<int64_t>>& strides = {},
                           const std::vector<bool>& outputGrads = {},
                           const AllocationMeasure& measure = {});

}  // namespace sb::reference
