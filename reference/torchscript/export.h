#pragma once

// torch.export archives (.pt2) as models the importer walks (import.h), beside TorchScript.
//
// `torch.export.save(torch.export.export(model, args), "m.pt2")` writes a zip whose records are
// (names from torch/csrc/export/pt2_archive_constants.h, read here with LibTorch's own zip
// reader, caffe2::serialize::PyTorchStreamReader):
//   models/<name>.json                       the ExportedProgram: its graph of ATen operators,
//                                            its signature, tensor metadata, schema_version
//   data/weights/<name>_weights_config.json  per parameter and buffer: the record holding its
//                                            storage's bytes and its tensor_meta
//   data/weights/<record>                    the raw bytes (byteorder: little)
//   data/constants/<name>_constants_config.json and data/constants/<record>: lifted tensor
//                                            constants, the same way
// The JSON is torch/_export/serde/schema.py's: unions are one-key objects
// ({"as_tensor": {"name": "x"}}), dtypes use the schema's numbering (FLOAT 7, BFLOAT16 13).
// Schema versions read: major 8 (kSchemaMajor; PyTorch 2.13 writes 8.20), any minor; another
// major is refused naming it. The 2.7-era layout (serialized_exported_program.json) is refused
// saying so.
//
// What it becomes: a torch::jit::Module built in memory, its submodules, parameters and buffers
// at the signature's qualified names, its forward a JIT graph holding every export node as the
// ATen operator its target names, called through the dispatcher (the JIT's operator registry) by
// its schema's arguments (NativeRT's idea of an interpreter over the serialized graph); so the
// TorchScript walk (import.cpp) and the module's own forward and backward (workload.cpp) take it
// unchanged, autograd included. The exported graph is PyTorch's training IR (torch.export.export
// as is: aten::linear, aten::batch_norm with its running statistics updated in place); a graph
// decomposed to core ATen (ep.run_decompositions()) reads too, its operators kept opaque where
// no strategy knows them, and its buffer mutations stored back into the module (prim::SetAttr).
// Symbolic sizes (a Dim in dynamic_shapes) become aten::size of the input and int arithmetic,
// so the walk folds them at the case's shapes: export with a dynamic batch dimension for a
// case run at other batch sizes (data-parallel ranks, a pipeline's micro-batches).
//
// Refused with ImportError (exit 2) naming the record or the node: a file that is not a zip, a
// missing record, a schema major other than 8, a weight whose record is shorter than its
// tensor_meta says, a dtype or layout it does not know, a higher-order operator (cond,
// while_loop, wrap_with_set_grad_enabled, ...), an operator this LibTorch does not have or
// whose arguments match none of its schemas, custom objects, effect tokens, user-input and
// parameter mutations.

#include <map>
#include <string>
#include <utility>
#include <vector>

#include <torch/csrc/jit/api/module.h>

namespace sb::reference::torchscript {

constexpr int kSchemaMajor = 8;

// A model file as the importer reads it: a TorchScript module, or an export built into one.
struct ModelFile {
  torch::jit::Module module;
  bool exported = false;
  // Exports: per node of the forward, the innermost module of its nn_module_stack ("layers.0.attn")
  // and the export's own name of it ("linear_3").
  std::map<const torch::jit::Node*, std::string> modulePath, nodeName;
  // Exports: tied weights, one tensor under several names (first name -> the others).
  std::map<std::string, std::vector<std::string>> aliases;
  std::string torchVersion;             // exports: the PyTorch that wrote it
  std::pair<int, int> schemaVersion{0, 0};
};

// Whether `file` is a torch.export archive (a zip with a models/ or archive_format record), not
// TorchScript. False for anything unreadable (the loader then says why).
bool isExportArchive(const std::string& file);

// The import checked against PyTorch's own numbers: the archive's program run here (the module
// loadModelFile builds, by the JIT interpreter with autograd) on the inputs PyTorch ran it on at
// export, against what PyTorch computed (trace_models.py --export writes them beside the
// archive, FILE.expected.safetensors: input/<k>, grad_output, output, grad/<parameter>, and
// `losses` of `steps` steps of plain SGD at `lr` on sum(output * grad_output)). Every tensor
// within kVerifyRtol of its largest magnitude (the same kernels on the same inputs; the
// interpreter may order a reduction differently from Python's eager dispatch, not more).
struct ExportCheck {
  bool checked = false;  // false: no FILE.expected.safetensors
  bool pass = true;
  int tensors = 0;        // output, gradients and losses compared
  double worst = 0;       // the largest |difference| / max |PyTorch's|, over them
  std::string worstName;  // where it is
  std::string text;       // one line for the record and `stratbench graph`
  double seconds = 0;     // reading the numbers and running the program on them
};
constexpr double kVerifyRtol = 1e-5;
ExportCheck verifyExport(const std::string& file, const std::string& fault = "");

// A model file as it must be before any reader opens it: a regular file, and, where it is a
// zip, no record that inflates out of all proportion (a zip bomb). Throws ImportError naming
// the file. loadModelFile runs it first.
void checkModelFile(const std::string& file);

// `file` loaded: torch::jit::load for TorchScript, the export reader for a .pt2 (by content).
// `fault` "export_wrong_weight" (planted, tests) reads the first weight's bytes one element
// shifted. Throws ImportError naming the file and the record or node.
ModelFile loadModelFile(const std::string& file, const std::string& fault = "");

}  // namespace sb::reference::torchscript
