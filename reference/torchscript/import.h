#pragma once

// A traced PyTorch model as a stratbench graph (reference/graph.h): the model a user trains,
// not one written here. `torch.jit.trace(model, example).save("m.pt")` in Python; here the
// file is loaded, its forward walked node by node (calls into submodules followed, so every
// node knows its module's qualified name), and every node executed once on example inputs of
// the given shapes, which folds the trace's shape arithmetic (aten::size, prim::NumToTensor,
// aten::Int, floor_divide of constants, prim::ListConstruct) to constants.
//
// What becomes what:
//   - the forward's tensor arguments: the graph's inputs, named as the forward names them;
//   - prim::GetAttr of a parameter: a graph parameter of its qualified name
//     ("h.0.attn.c_attn.weight"); of a buffer (batch norm's running statistics, a causal mask):
//     a graph input holding the buffer, converted to the case's dtype as module.to() converts it;
//   - tensors computed from constants alone (positions from torch.arange, a mask from
//     torch.ones(...).tril()): folded to constant graph inputs, in their own dtype;
//   - every aten operator on the inputs, parameters or buffers: one or more graph nodes of the
//     operators the strategy sets know (aten::linear is a transpose of the weight, views to
//     and from 2-D and an addmm; matmul a bmm or an addmm over views; conv2d, batch_norm,
//     layer_norm, embedding, pooling, relu, gelu, silu, add, mul, softmax, view, reshape,
//     flatten, transpose, permute, split, chunk, sum) where its arguments allow it (the
//     kernel's defaults: eps 1e-5, no dilation, no groups, ...), and otherwise the operator
//     "aten" (reference/torchscript/aten_op.h), run by LibTorch's own kernel, with one
//     replicated strategy. Dropout of p = 0 or outside training is the identity; in-place
//     operators become their functional forms.
// Nodes no path to the output needs (batch norm's num_batches_tracked += 1) are dropped.
// Nodes in a ModuleList's children ("h.0.", "h.1.", ...) get their layer and role when every
// child holds the same operators on the same shapes, so that the integer program shares one
// choice per role, as for the built-in graphs.
//
// Refused with ImportError (exit 2), naming the file and the node, before anything runs: a
// file that is not TorchScript, control flow (prim::If, prim::Loop from torch.jit.script),
// dropout with p > 0 in training (its mask comes from torch's generator), other random
// operators, inputs that do not fit the forward (their count, or a node that fails on them).

#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include "reference/graph.h"

namespace sb::reference {
struct TrainingSpec;
}

namespace sb::reference::torchscript {

class ImportError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// The first line of an error that says something (c10's messages may open with a newline):
// what the importer's errors quote of LibTorch's.
std::string errorFirstLine(const std::string& s);

// One input of the forward: its shape, and its dtype: "float" (the case's floating dtype) or
// "int64" (ids, drawn in [low, high)).
struct InputSpec {
  std::vector<int64_t> shape;
  std::string dtype = "float";
  int64_t low = 0, high = 0;
  // A list of dimensions ([2, 16, 64]: float) or {"shape": [...], "dtype": "int64", "low": 0,
  // "high": 64}; throws ImportError naming `where`.
  static InputSpec fromJson(const nlohmann::json& j, const std::string& where);
  nlohmann::json toJson() const;
};

// The keys of a torchscript case's shape: {"file": "m.pt", "inputs": [...], "params":
// "module" | "seed", "microbatches": M}; throws ImportError naming the key.
struct ImportSpec {
  std::string file;
  std::vector<InputSpec> inputs;
  bool seededParams = false;  // "params": "seed": re-initialised from the case's seed
  // "microbatches": the reference accumulates M micro-batches of every input's rows (dimension
  // 0), each through the module's forward and backward in turn (the pipeline family's
  // reference); M divides every input's first dimension.
  int64_t microbatches = 1;
  // The spec of one micro-batch: every input's first dimension over M, M = 1 (the graph a
  // pipeline's stages run: its shape constants folded at the micro-batch's size).
  ImportSpec microbatch() const;
  // Planted importer faults (tests): "wrong_parameter" binds a parameter's reads to another
  // parameter of its shape; "shape_constant_off_by_one" folds the first aten::size one larger;
  // "cut_where_two_cross" linearises for checkpointing with cuts where two activations cross
  // (linearize.h).
  std::string fault;
  // "random": true: the model draws random numbers in training (dropout), recorded in
  // ImportedModel::draws instead of refused. The reference draws them from the CPU generator
  // seeded per step (drawSeed); only executors that run the module itself on the whole batch
  // draw the same (harness::drawsRandomNumbers).
  bool random = false;
  static ImportSpec fromJson(const nlohmann::json& shape);
  // The shape keys fromJson reads back to this spec (the file, every input, params, microbatches
  // and import_fault where they are not the defaults).
  nlohmann::json toJson() const;
  // The spec of a data-parallel rank's slice of the batch: every input's first dimension over
  // `ranks` (which must divide each); the micro-batches the same.
  ImportSpec rowsOver(int64_t ranks) const;
};

// One aten operator kind of the model: how many nodes, what they became, whether a strategy
// set knows them.
struct CoverageRow {
  std::string aten;    // "aten::linear"
  int count = 0;       // nodes of the model
  std::string mapped;  // "transpose+view+addmm+view", or "aten" (replicated)
  bool strategies = false;
};

struct ImportedModel {
  Graph graph;  // workload "torchscript"
  // Per graph input: its tensor where it is a constant (a buffer, a folded tensor), with
  // whether it follows the case's dtype (buffers, as module.to() converts them).
  struct Constant {
    at::Tensor value;
    bool followsDtype = false;
  };
  std::map<std::string, Constant> constants;
  std::map<std::string, at::Tensor> parameters;  // the module's own, by graph name
  std::vector<std::string> dataInputs;           // the forward's inputs, in order
  std::vector<InputSpec> inputSpecs;
  std::vector<CoverageRow> coverage;
  double loadSeconds = 0, importSeconds = 0;  // torch::jit::load; the walk after it
  // A torch.export archive (export.h): the PyTorch that wrote it, and the import's check
  // against PyTorch's own numbers (a program that differs is refused: ImportError).
  bool exported = false;
  std::string exportedBy, exportCheck;
  double checkSeconds = 0;  // the check's runs (once per file and process: 0 when cached)
  // Where the model draws random numbers (node and module), with ImportSpec::random.
  std::vector<std::string> draws;
};

// The seed the CPU generator is set to before step `step`'s forward of a case seeded `seed`
// whose model draws random numbers: the reference's and the executors' (strategies/torch/
// hands it to its ranks), so that both draw the same masks.
uint64_t drawSeed(uint64_t seed, int step);

// Imports `spec` (cached by file, its modification time and the specs). Throws ImportError.
std::shared_ptr<const ImportedModel> importModel(const ImportSpec& spec);
// The same, loaded and walked afresh (the import benchmark).
std::shared_ptr<const ImportedModel> importModelUncached(const ImportSpec& spec);

// The forward's inputs for `seed` (floats normal in the case's dtype, ids uniform in [low,
// high)), by graph input name; constants included.
std::map<std::string, at::Tensor> importedInputs(const ImportedModel& m, at::ScalarType dtype,
                                                 uint64_t seed, InputMode mode);
// A constant graph input's tensor as a case in `dtype` holds it (a buffer converted as
// module.to() converts it, a folded tensor in its own dtype), on the case's device.
at::Tensor importedConstant(const ImportedModel::Constant& c, at::ScalarType dtype);
// The module's parameters in `dtype` (or re-initialised from `seed`), by graph name.
std::map<std::string, at::Tensor> importedParameters(const ImportedModel& m, const ImportSpec& s,
                                                     at::ScalarType dtype, uint64_t seed);

// The reference workload "torchscript": the module's own forward and backward, by LibTorch.
const Workload* torchscriptWorkload();

// The training reference of a torchscript case (reference/training.h): the module's own forward
// and backward and LibTorch's optimizer over `training`'s steps. Each step clears the gradients,
// runs the shape's `microbatches` M (one without) in order through the module's forward and
// backward, accumulating, its loss the micro-batches' sum(output * target) added in float64, and
// the loop's update. Inputs: the one-step workload's (data, constants, the initial parameters,
// grad_output) and "target", grad_output itself. Expected: loss, grad_norm, param/<name> and
// state/<name>/<key> of every graph parameter, state/step. Throws ImportError as importModel.
WorkloadData buildTraining(const nlohmann::json& shape, at::ScalarType dtype, uint64_t seed,
                           InputMode mode, const TrainingSpec& training);

}  // namespace sb::reference::torchscript
