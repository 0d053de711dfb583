#pragma once

// Inside the importer (import.h): what a walked value is, and the mapper that turns the
// model's operators into graph nodes, registers the parameters, buffers and constants they
// read, and finishes the graph (unused nodes dropped, blocks found, coverage counted).

#include <map>
#include <set>
#include <string>
#include <vector>

#include <ATen/core/ivalue.h>
#include <torch/csrc/jit/ir/ir.h>

#include "reference/torchscript/import.h"

namespace sb::reference::torchscript {

// A TorchScript value as the walk knows it: its value on the example inputs, and where it is
// computed from the model's inputs, parameters or buffers, its graph value.
struct Entry {
  c10::IValue v;
  bool dynamic = false;
  std::string name;                // a dynamic tensor's graph value
  std::vector<std::string> names;  // a list's or tuple's elements' ("" for a constant one)
  std::string first;               // a tuple's first tensor, through nested tuples (the output)
  std::string module;              // a submodule's qualified name
};
using Env = std::map<const torch::jit::Value*, Entry>;

class GraphMapper {
 public:
  explicit GraphMapper(ImportedModel& out) : out_(out), g_(out.graph) {}

  // The graph name reads of this parameter use (its own; with `wrong`, the planted fault, the
  // first time another parameter of its shape has been read already: that one's).
  std::string parameter(const std::string& qualified, const at::Tensor& t, bool wrong);
  std::string buffer(const std::string& qualified, const at::Tensor& t);
  // Graph nodes for `n`, whose outputs it names in `env`. Throws ImportError.
  void emit(const torch::jit::Node* n, Env& env, const std::string& path);
  // Drops what `output` does not need, finds the repeated blocks, indexes the graph.
  void finish(const std::string& output);
  std::vector<CoverageRow> coverage() const;

 private:
  std::string add(const std::string& name, const nlohmann::json& shape,
                  std::vector<std::string> args);
  std::string unique(const std::string& base);
  std::string ref(const std::string& name, const at::Tensor& t);  // registers what it reads
  std::string ref(const Entry& e);
  std::string zeros(const std::vector<int64_t>& dims);
  bool mapped(const torch::jit::Node* n, Env& env, const std::string& fk, const std::string& base,
              std::string& as);
  void opaque(const torch::jit::Node* n, Env& env, const std::string& base);
  void findBlocks();

  ImportedModel& out_;
  Graph& g_;
  std::map<std::string, at::Tensor> pendingParams_, pendingBuffers_;
  std::vector<std::string> seenParams_;
  bool faulted_ = false;
  std::map<const c10::TensorImpl*, std::string> constantName_;
  std::map<std::vector<int64_t>, std::string> zerosName_;
  std::set<std::string> used_;
  struct Emission {
    std::string aten, mapped;
    bool strategies = false;
    std::vector<std::string> nodes;  // empty: an identity
  };
  std::vector<Emission> emissions_;
};

}  // namespace sb::reference::torchscript
