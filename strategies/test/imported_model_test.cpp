// Imported models (reference/torchscript): the graph the importer builds from a traced model,
// run unsharded, must equal the module's own forward and backward (LibTorch running the file:
// a reference nobody here wrote), in float64 to 1e-10 and in float32 within its rounding; the
// planted importer faults must break that; malformed files and inputs are refused naming the
// file and the node. The models are traced by reference/models/trace_models.py into
// $STRATBENCH_MODELS (the ctest fixture trace_models); without it the tests skip, saying why.

#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <cstdlib>
#include <fstream>
#include <set>

#include "reference/autograd_engine.h"
#include "reference/graph.h"
#include "reference/torchscript/import.h"
#include "reference/torchscript/linearize.h"
#include "reference/training.h"

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

#define SKIP_WITHOUT_MODELS(shape)                                                           \
  if ((shape).is_null()) {                                                                   \
    GTEST_SKIP() << "no traced models: set STRATBENCH_MODELS to the output of "              \
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
  backward({all.at(g.output)}, {ref.inputs.at("grad_output")});
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

namespace sb::reference::torchscript {
namespace {

double worst(const std::map<std::string, double>& err) {
  double w = 0;
  for (const auto& [name, e] : err) w = std::max(w, e);
  return w;
}

// Planted: reads of one parameter bound to another of its shape (gpt2: the first layer norm's
// bias read as its weight). The module computes with the right tensor: the run must differ.
TEST(ImportFault, ParameterBoundToTheWrongTensorIsCaught) {
  auto shape = shapeOf("gpt2");
  SKIP_WITHOUT_MODELS(shape);
  expectWithin(graphVersusModule(shape, at::kDouble), 1e-10);
  shape["import_fault"] = "wrong_parameter";
  EXPECT_GT(worst(graphVersusModule(shape, at::kDouble)), 1e-3);
}

// Planted: the first folded aten::size one larger (gpt2: the sequence length its positions
// are counted to). Either the import fails on it, naming the node, or the run differs.
TEST(ImportFault, ShapeConstantOffByOneIsCaught) {
  for (const std::string model : {"gpt2", "vit"}) {
    auto shape = shapeOf(model);
    SKIP_WITHOUT_MODELS(shape);
    shape["import_fault"] = "shape_constant_off_by_one";
    try {
      EXPECT_GT(worst(graphVersusModule(shape, at::kDouble)), 1e-3) << model;
    } catch (const ImportError& e) {
      EXPECT_NE(std::string(e.what()).find("node aten::"), std::string::npos) << e.what();
    }
  }
}

std::string importError(const nlohmann::json& shape) {
  try {
    buildGraph("torchscript", shape);
  } catch (const ImportError& e) {
    return e.what();
  }
  return "";
}

TEST(ImportRefuses, MalformedFilesAndInputsNamingTheFileAndNode) {
  const auto gpt2 = shapeOf("gpt2");
  SKIP_WITHOUT_MODELS(gpt2);
  const std::string dir = modelsDir();
  std::string e = importError({{"file", dir + "/not_torchscript.pt"}, {"inputs", {{2, 4}}}});
  EXPECT_NE(e.find("not_torchscript.pt: not a TorchScript file"), std::string::npos) << e;
  e = importError({{"file", dir + "/scripted_if.pt"}, {"inputs", {{2, 4}}}});
  EXPECT_NE(e.find("scripted_if.pt: node prim::If"), std::string::npos) << e;
  EXPECT_NE(e.find("control flow"), std::string::npos) << e;
  // Token ids as floats, and ids of the wrong rank: the node that cannot take them is named.
  auto floats = gpt2;
  floats["inputs"] = {{2, 16}};
  e = importError(floats);
  EXPECT_NE(e.find("node aten::embedding (in 'wte'"), std::string::npos) << e;
  auto rank3 = gpt2;
  rank3["inputs"][0]["shape"] = {2, 16, 4};
  e = importError(rank3);
  EXPECT_NE(e.find("gpt2.pt: node aten::"), std::string::npos) << e;
  EXPECT_NE(e.find("fails on the inputs given"), std::string::npos) << e;
  auto two = gpt2;
  two["inputs"].push_back({2, 16});
  EXPECT_NE(importError(two).find("its forward takes 1 inputs, the case gives 2"),
            std::string::npos);
  e = importError({{"file", dir + "/no_such_model.pt"}, {"inputs", {{2, 4}}}});
  EXPECT_NE(e.find("no_such_model.pt"), std::string::npos) << e;
}

TEST(ImportCoverage, OperatorsWithoutStrategiesRunReplicatedAndAreListed) {
  const auto shape = shapeOf("mlp_cumsum");
  SKIP_WITHOUT_MODELS(shape);
  const auto m = importModel(ImportSpec::fromJson(shape));
  std::map<std::string, CoverageRow> rows;
  for (const auto& r : m->coverage) rows[r.aten] = r;
  ASSERT_TRUE(rows.count("aten::cumsum"));
  EXPECT_FALSE(rows.at("aten::cumsum").strategies);
  EXPECT_TRUE(rows.at("aten::linear").strategies);
  EXPECT_EQ(rows.at("aten::linear").count, 2);
  int aten = 0;
  for (const auto& n : m->graph.nodes) aten += n.shape.op == "aten";
  EXPECT_EQ(aten, 2);  // cumsum and tanh
}

// The blocks of a ModuleList share roles, so that plans share one choice per role; parameter
// names are the module's qualified names, a tied weight one parameter.
TEST(ImportBlocks, RepeatedBlocksAndQualifiedNames) {
  const auto shape = shapeOf("gpt2");
  SKIP_WITHOUT_MODELS(shape);
  const Graph g = buildGraph("torchscript", shape);
  EXPECT_EQ(g.shape.layers, 2);
  std::map<std::string, int> perRole;
  for (const auto& n : g.nodes) {
    if (n.layer >= 0) ++perRole[n.role];
  }
  ASSERT_FALSE(perRole.empty());
  for (const auto& [role, count] : perRole) EXPECT_EQ(count, 2) << role;
  std::set<std::string> params;
  for (const auto& [name, dims] : g.parameters) params.insert(name);
  EXPECT_TRUE(params.count("h.1.attn.c_attn.weight"));
  EXPECT_TRUE(params.count("wte.weight"));
  EXPECT_FALSE(params.count("lm_head.weight"));  // tied to wte.weight: read as it
}

}  // namespace
}  // namespace sb::reference::torchscript

// Checkpointing on imported models (reference/torchscript/linearize.h): the graph cut into a
// chain of stages where one activation alone crosses, run, checkpointed and recomputed, must
// compute the module's own output and gradients bitwise.
namespace sb::reference::torchscript {
namespace {

// One plain step of the chain (every stage taped, loss sum(y * grad_output)) against the
// module's reference: whether output and every gradient are bitwise equal.
std::vector<std::string> chainDifferences(const nlohmann::json& shape) {
  const WorkloadData ref = torchscriptWorkload()->build(shape, at::kFloat, 11, InputMode::kRandom);
  const auto net = importedChainNet(shape, ref);
  net->zeroGrad();
  const at::Tensor x = net->input().detach().requires_grad_(true);
  const at::Tensor y = net->forward(x);
  backward({(y * net->target()).sum()}, {});
  std::vector<std::string> differ;
  if (!at::equal(y, ref.expected.at("output"))) differ.push_back("output");
  for (const auto& [name, p] : net->parameters()) {
    if (!at::equal(p.grad(), ref.expected.at("grad/" + name))) differ.push_back("grad/" + name);
  }
  return differ;
}

TEST(ImportedChain, StagesAreCutWhereOneActivationAloneCrosses) {
  const auto resnet = shapeOf("resnet18");
  SKIP_WITHOUT_MODELS(resnet);
  const auto m = importModel(ImportSpec::fromJson(resnet));
  const auto stages = linearizeModel(*m);
  // torchvision's ResNet-18: conv1, bn1, relu, maxpool; each basic block up to its residual
  // add (the skip crosses beside the branch until then), its last ReLU; avgpool; fc (the
  // flatten before it is a view: no cut).
  std::vector<std::string> names;
  for (const auto& s : stages) names.push_back(s.name);
  const std::vector<std::string> want = {"conv1",    "bn1",
                                         "relu",     "maxpool",
                                         "layer1.0", "layer1.0.relu",
                                         "layer1.1", "layer1.1.relu",
                                         "layer2.0", "layer2.0.relu",
                                         "layer2.1", "layer2.1.relu",
                                         "layer3.0", "layer3.0.relu",
                                         "layer3.1", "layer3.1.relu",
                                         "layer4.0", "layer4.0.relu",
                                         "layer4.1", "layer4.1.relu",
                                         "avgpool",  "fc"};
  EXPECT_EQ(names, want);
  for (size_t i = 1; i < stages.size(); ++i) EXPECT_EQ(stages[i].input, stages[i - 1].output);
  EXPECT_EQ(stages.back().output, m->graph.output);

  // DenseNet-121: every earlier feature map of a dense block crosses to its concatenation, so
  // the block is one stage; the transitions' layers are a stage each.
  const auto dense = shapeOf("densenet121");
  const auto dm = importModel(ImportSpec::fromJson(dense));
  std::set<std::string> denseNames;
  for (const auto& s : linearizeModel(*dm)) denseNames.insert(s.name);
  for (const char* block :
       {"features.denseblock1", "features.denseblock2", "features.denseblock3",
        "features.denseblock4", "features.transition1.conv", "features.transition3.pool"}) {
    EXPECT_TRUE(denseNames.count(block)) << block;
  }
  EXPECT_EQ(denseNames.size(), 24u);

  // A model of ids is refused, naming its input.
  const auto gpt2 = importModel(ImportSpec::fromJson(shapeOf("gpt2")));
  try {
    linearizeModel(*gpt2);
    ADD_FAILURE() << "gpt2's ids linearised";
  } catch (const ImportError& e) {
    EXPECT_NE(std::string(e.what()).find("(int64)"), std::string::npos) << e.what();
  }
}

TEST(ImportedChain, TheChainIsTheModuleBitwise) {
  for (const std::string model : {"resnet18", "densenet121", "vit", "mlp_cumsum"}) {
    const auto shape = shapeOf(model);
    SKIP_WITHOUT_MODELS(shape);
    const auto differ = chainDifferences(shape);
    EXPECT_TRUE(differ.empty()) << model << ": " << differ.size() << " differ, first "
                                << differ.front();
  }
}

// Shape key `microbatches` (the pipeline's reference): the module's forward and backward on each
// micro-batch of the rows in turn. The chain of the graph imported on one micro-batch's rows,
// run on the same micro-batches and accumulated in the same order, must give the same output
// rows and gradients to the bit (ViT from an image; GPT-2 from ids, its tied embedding summed
// within each backward as the module sums it); against the whole batch at once (M = 1), within
// a reordered sum's rounding.
TEST(ImportedChain, MicrobatchesAreTheModulesOwnAccumulated) {
  for (const std::string model : {"vit", "gpt2"}) {
    auto shape = shapeOf(model);
    SKIP_WITHOUT_MODELS(shape);
    // Four rows, two micro-batches of two.
    nlohmann::json in = shape["inputs"][0];
    if (in.is_array()) {
      in[0] = 4;
    } else {
      in["shape"][0] = 4;
    }
    shape["inputs"] = nlohmann::json::array({in});
    nlohmann::json whole = shape;
    shape["microbatches"] = 2;
    const WorkloadData ref = torchscriptWorkload()->build(shape, at::kFloat, 5, InputMode::kRandom);
    const auto net = importedChainNet(shape, ref, ChainInput::kFloatingOrIds);
    net->zeroGrad();
    const auto xs = net->input().chunk(2, 0), gs = net->target().chunk(2, 0);
    std::vector<at::Tensor> ys;
    for (int m = 0; m < 2; ++m) {
      at::Tensor x = xs[m].contiguous();
      if (at::isFloatingType(x.scalar_type())) x = x.detach().requires_grad_(true);
      at::Tensor h = x;
      for (int l = 0; l < net->numStages(); ++l) h = net->stage(l, h, true);
      EXPECT_EQ(h.size(0), 2) << model << ": the stages run on one micro-batch's rows";
      backward({h}, {gs[m].contiguous()});
      ys.push_back(h.detach());
    }
    EXPECT_TRUE(at::equal(at::cat(ys, 0), ref.expected.at("output"))) << model;
    const WorkloadData one = torchscriptWorkload()->build(whole, at::kFloat, 5, InputMode::kRandom);
    EXPECT_TRUE(at::allclose(one.expected.at("output"), ref.expected.at("output"), 1e-5, 1e-5))
        << model;
    for (const auto& [name, p] : net->parameters()) {
      const at::Tensor& want = ref.expected.at("grad/" + name);
      EXPECT_TRUE(at::equal(p.grad(), want)) << model << ": grad/" << name;
      EXPECT_TRUE(at::allclose(one.expected.at("grad/" + name), want, 1e-4, 1e-4))
          << model << ": grad/" << name << " against the whole batch";
    }
  }
  // A count that does not divide the rows, or is not a count: refused naming the key.
  auto shape = shapeOf("vit");
  SKIP_WITHOUT_MODELS(shape);
  shape["microbatches"] = 3;
  try {
    ImportSpec::fromJson(shape);
    ADD_FAILURE() << "microbatches 3 of " << shape["inputs"].dump() << " accepted";
  } catch (const ImportError& e) {
    EXPECT_NE(std::string(e.what()).find("'microbatches' (3) must divide the first dimension"),
              std::string::npos)
        << e.what();
  }
  shape["microbatches"] = "2";
  EXPECT_THROW(ImportSpec::fromJson(shape), ImportError);
}

// Training (buildTraining): one SGD step is the module's one-step gradient stepped by
// torch::optim, bitwise, whole or in micro-batches; its loss is sum(output * grad_output) of
// the one-step reference's output, and the target is its grad_output.
TEST(ImportedTraining, OneSgdStepIsTheModulesOwnGradientStepped) {
  for (const std::string model : {"gpt2", "llama", "vit"}) {
    auto shape = shapeOf(model);
    SKIP_WITHOUT_MODELS(shape);
    for (const int64_t M : {1, 2}) {
      if (M > 1) shape["microbatches"] = M;
      TrainingSpec training;
      training.steps = 1;
      training.optimizer.lr = 0.5;
      const WorkloadData one = torchscriptWorkload()->build(shape, at::kFloat, 5, InputMode::kRandom);
      const WorkloadData t = buildTraining(shape, at::kFloat, 5, InputMode::kRandom, training);
      const std::string what = model + " microbatches " + std::to_string(M);
      EXPECT_TRUE(at::equal(t.inputs.at("target"), one.inputs.at("grad_output"))) << what;
      const Graph g = buildGraph("torchscript", shape);
      for (const auto& [name, dims] : g.parameters) {
        // The inputs keep the initial parameters; the step is p - lr * g.
        EXPECT_TRUE(at::equal(t.inputs.at(name), one.inputs.at(name))) << what << ": " << name;
        const at::Tensor want = one.inputs.at(name) - 0.5 * one.expected.at("grad/" + name);
        EXPECT_TRUE(at::allclose(t.expected.at("param/" + name), want, 0, 1e-7))
            << what << ": param/" << name;
      }
      const at::Tensor out = one.expected.at("output");
      const int64_t rows = out.size(0) / M;
      double loss = 0;
      for (int64_t m = 0; m < M; ++m) {
        loss += (out.narrow(0, m * rows, rows) * one.inputs.at("grad_output").narrow(0, m * rows, rows))
                    .sum()
                    .item<double>();
      }
      EXPECT_EQ(t.expected.at("loss").item<double>(), loss) << what;
      EXPECT_EQ(t.checked.front(), "loss") << what;
    }
  }
}

// Planted: cuts also where two activations cross (a residual block split inside, its skip
// passed beside the chain, detached): its gradient is lost, and the run must differ or fail.
TEST(ImportFault, ALinearisationCuttingWhereTwoCrossIsCaught) {
  for (const std::string model : {"resnet18", "densenet121", "vit"}) {
    auto shape = shapeOf(model);
    SKIP_WITHOUT_MODELS(shape);
    shape["import_fault"] = "cut_where_two_cross";
    try {
      EXPECT_FALSE(chainDifferences(shape).empty()) << model;
    } catch (const c10::Error& e) {
      SUCCEED() << model << ": " << e.what();  // a stage whose output ignores its input
    }
  }
}

}  // namespace
}  // namespace sb::reference::torchscript
