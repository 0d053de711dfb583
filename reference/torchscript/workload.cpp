// The "torchscript" workload (import.h): a case's keys, the inputs and parameters every rank
// shards from, and the reference: the loaded module's own forward and backward, once or, in
// training, over a case's optimizer steps.

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/python/update_graph_executor_opt.h>
#include <torch/csrc/jit/serialization/import.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "reference/torchscript/export.h"
#include "reference/torchscript/import.h"
#include "reference/training.h"

namespace sb::reference::torchscript {
namespace {

std::vector<int64_t> dimsFrom(const nlohmann::json& v, const std::string& where) {
  if (!v.is_array() || v.empty() || v.size() > 8) {
    throw ImportError(where + ": expected a list of 1 to 8 dimensions, got " + v.dump());
  }
  std::vector<int64_t> d;
  for (const auto& x : v) {
    if (!x.is_number_integer() || x.get<int64_t>() <= 0 || x.get<int64_t>() > (1 << 24)) {
      throw ImportError(where + ": dimensions must be integers in [1, 2^24], got " + v.dump());
    }
    d.push_back(x.get<int64_t>());
  }
  return d;
}

}  // namespace

InputSpec InputSpec::fromJson(const nlohmann::json& j, const std::string& where) {
  InputSpec s;
  if (j.is_array()) {
    s.shape = dimsFrom(j, where);
    return s;
  }
  if (!j.is_object() || !j.contains("shape")) {
    throw ImportError(where +
                      ": expected a list of dimensions or {\"shape\": [...], \"dtype\": "
                      "\"float32\" | \"int64\", \"low\", \"high\"}, got " +
                      j.dump());
  }
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() != "shape" && it.key() != "dtype" && it.key() != "low" && it.key() != "high") {
      throw ImportError(where + ": unknown key '" + it.key() +
                        "' (expected shape, dtype, low, high)");
    }
  }
  s.shape = dimsFrom(j.at("shape"), where + ".shape");
  if (j.contains("dtype") && !j.at("dtype").is_string()) {
    throw ImportError(where + ".dtype: expected float32, float64 or int64, got " +
                      j.at("dtype").dump());
  }
  const std::string dt = j.value("dtype", std::string("float32"));
  if (dt == "float32" || dt == "float" || dt == "float64") {
    s.dtype = "float";
    // Bounds bound drawn ids; a floating input is drawn from the normal distribution (or the
    // case's exact inputs), so low and high on it would be silently ignored.
    for (const char* key : {"low", "high"}) {
      if (j.contains(key)) {
        throw ImportError(where + "." + key +
                          ": a floating input has no bounds (low and high "
                          "bound the ids of an int64 input; its values come from the case's "
                          "inputs mode)");
      }
    }
  } else if (dt == "int64" || dt == "long") {
    s.dtype = "int64";
    const auto bound = [&](const char* key) {
      if (!j.contains(key) || !j.at(key).is_number_integer()) {
        throw ImportError(where + "." + key + ": an int64 input needs integer bounds low and " +
                          "high (ids are drawn in [low, high))");
      }
      return j.at(key).get<int64_t>();
    };
    s.low = bound("low");
    s.high = bound("high");
    if (s.low < 0 || s.high <= s.low || s.high > (int64_t{1} << 40)) {
      throw ImportError(where + ": expected 0 <= low < high <= 2^40, got low " +
                        std::to_string(s.low) + ", high " + std::to_string(s.high));
    }
  } else {
    throw ImportError(
        where + ".dtype: '" + dt +
        "' (expected float32, float64 or int64: a floating input is drawn at the case's dtype)");
  }
  return s;
}

ImportSpec ImportSpec::microbatch() const {
  ImportSpec s = *this;
  for (auto& i : s.inputs) i.shape[0] /= microbatches;
  s.microbatches = 1;
  return s;
}

ImportSpec ImportSpec::rowsOver(int64_t ranks) const {
  ImportSpec s = *this;
  for (size_t i = 0; i < s.inputs.size(); ++i) {
    if (s.inputs[i].shape[0] % ranks != 0) {
      throw ImportError("torchscript: inputs[" + std::to_string(i) + "]'s first dimension (" +
                        std::to_string(s.inputs[i].shape[0]) + ") does not divide over " +
                        std::to_string(ranks) + " data-parallel ranks");
    }
    s.inputs[i].shape[0] /= ranks;
  }
  return s;
}

nlohmann::json ImportSpec::toJson() const {
  nlohmann::json j = {{"file", file}, {"inputs", nlohmann::json::array()}};
  for (const auto& i : inputs) j["inputs"].push_back(i.toJson());
  if (seededParams) j["params"] = "seed";
  if (microbatches > 1) j["microbatches"] = microbatches;
  if (!fault.empty()) j["import_fault"] = fault;
  if (random) j["random"] = true;
  return j;
}

nlohmann::json InputSpec::toJson() const {
  if (dtype == "float") return shape;
  return {{"shape", shape}, {"dtype", "int64"}, {"low", low}, {"high", high}};
}

ImportSpec ImportSpec::fromJson(const nlohmann::json& shape) {
  if (!shape.is_object()) {
    throw ImportError("torchscript: shape must be a mapping with file and inputs, got " +
                      shape.dump());
  }
  for (auto it = shape.begin(); it != shape.end(); ++it) {
    if (it.key() != "file" && it.key() != "inputs" && it.key() != "params" &&
        it.key() != "microbatches" && it.key() != "import_fault" && it.key() != "random") {
      throw ImportError("torchscript: unknown shape key '" + it.key() +
                        "' (expected file, inputs, params, microbatches, random)");
    }
  }
  ImportSpec s;
  if (!shape.contains("file") || !shape.at("file").is_string() ||
      shape.at("file").get<std::string>().empty()) {
    throw ImportError("torchscript: shape key 'file' must name a TorchScript file (.pt)" +
                      std::string(shape.contains("file") && shape.at("file").is_string()
                                      ? ", not be empty"
                                      : ""));
  }
  s.file = shape.at("file").get<std::string>();
  if (!shape.contains("inputs") || !shape.at("inputs").is_array() || shape.at("inputs").empty()) {
    throw ImportError(
        "torchscript: shape key 'inputs' must list the forward's inputs, e.g. "
        "[[2, 16, 64]] or [{\"shape\": [2, 16], \"dtype\": \"int64\", \"low\": 0, "
        "\"high\": 64}]");
  }
  for (size_t i = 0; i < shape.at("inputs").size(); ++i) {
    s.inputs.push_back(InputSpec::fromJson(shape.at("inputs")[i],
                                           "torchscript: inputs[" + std::to_string(i) + "]"));
  }
  if (shape.contains("params") && !shape.at("params").is_string()) {
    throw ImportError("torchscript: shape key 'params' must be module or seed, got " +
                      shape.at("params").dump());
  }
  const std::string params = shape.value("params", std::string("module"));
  if (params != "module" && params != "seed") {
    throw ImportError("torchscript: shape key 'params' is '" + params +
                      "' (expected module: the file's own, or seed: re-initialised)");
  }
  s.seededParams = params == "seed";
  if (shape.contains("microbatches")) {
    const auto& m = shape.at("microbatches");
    if (!m.is_number_integer() || m.get<int64_t>() < 1 || m.get<int64_t>() > 100000) {
      throw ImportError(
          "torchscript: shape key 'microbatches' must be an integer from 1 to "
          "100000, got " +
          m.dump());
    }
    s.microbatches = m.get<int64_t>();
    for (size_t i = 0; i < s.inputs.size(); ++i) {
      if (s.inputs[i].shape[0] % s.microbatches != 0) {
        throw ImportError("torchscript: shape key 'microbatches' (" +
                          std::to_string(s.microbatches) + ") must divide the first dimension " +
                          "of every input; inputs[" + std::to_string(i) + "] has " +
                          std::to_string(s.inputs[i].shape[0]));
      }
    }
  }
  if (shape.contains("random")) {
    if (!shape.at("random").is_boolean()) {
      throw ImportError(
          "torchscript: shape key 'random' must be true or false (whether the "
          "model draws random numbers: dropout in training), got " +
          shape.at("random").dump());
    }
    s.random = shape.at("random").get<bool>();
  }
  if (shape.contains("import_fault")) {
    if (!shape.at("import_fault").is_string()) {
      throw ImportError("torchscript: import_fault must be a name, got " +
                        shape.at("import_fault").dump());
    }
    s.fault = shape.at("import_fault").get<std::string>();
    if (s.fault != "wrong_parameter" && s.fault != "shape_constant_off_by_one" &&
        s.fault != "cut_where_two_cross" && s.fault != "export_wrong_weight") {
      throw ImportError("torchscript: import_fault '" + s.fault +
                        "' (expected wrong_parameter, shape_constant_off_by_one, "
                        "cut_where_two_cross or export_wrong_weight)");
    }
  }
  return s;
}

std::map<std::string, at::Tensor> importedInputs(const ImportedModel& m, at::ScalarType dtype,
                                                 uint64_t seed, InputMode mode) {
  std::map<std::string, at::Tensor> out;
  for (size_t i = 0; i < m.dataInputs.size(); ++i) {
    const InputSpec& s = m.inputSpecs[i];
    const int stream = static_cast<int>(i);
    if (s.dtype == "int64") {
      const at::Tensor u = makeUniformAsDrawn(s.shape, 1.0, seed, stream);
      const double span = static_cast<double>(s.high - s.low);
      out[m.dataInputs[i]] = u.add(1)
                                 .mul(0.5 * span)
                                 .floor()
                                 .clamp(0, span - 1)
                                 .add(static_cast<double>(s.low))
                                 .to(at::kLong);
    } else {
      out[m.dataInputs[i]] = makeNormal(s.shape, dtype, seed, stream, mode);
    }
  }
  for (const auto& [name, c] : m.constants) out[name] = importedConstant(c, dtype);
  return out;
}

at::Tensor importedConstant(const ImportedModel::Constant& c, at::ScalarType dtype) {
  return c.followsDtype && at::isFloatingType(c.value.scalar_type())
             ? toCaseDtype(c.value, caseDevice(), dtype)
             : c.value.to(caseDevice());
}

std::map<std::string, at::Tensor> importedParameters(const ImportedModel& m, const ImportSpec& s,
                                                     at::ScalarType dtype, uint64_t seed) {
  std::map<std::string, at::Tensor> out;
  int stream = 1000;
  for (const auto& [name, dims] : m.graph.parameters) {
    const at::Tensor own = toCaseDtype(m.parameters.at(name).detach(), caseDevice(), dtype);
    if (!s.seededParams) {
      out[name] = own.clone();
      continue;
    }
    // Re-initialised as nn layers draw them: matrices and kernels uniform over +-1/sqrt(fan
    // in); vectors (biases, norms' scales) the file's values moved by up to 0.1, so that
    // norms stay near their identity.
    if (dims.size() >= 2) {
      const double fanIn = static_cast<double>(own.numel() / dims[0]);
      out[name] =
          makeUniform(dims, 1.0 / std::sqrt(fanIn), dtype, seed, stream++, InputMode::kRandom);
    } else {
      out[name] =
          asCaseValues(own + makeUniform(dims, 0.1, dtype, seed, stream++, InputMode::kRandom));
    }
  }
  return out;
}

namespace {

// The module of `spec`, loaded afresh (its forward updates its buffers), in the case's dtype and
// on its device as module.to() puts it, in training mode, holding `inputs`' parameters (the
// graph's, by name) with no gradients yet.
struct LoadedModule {
  torch::jit::Module module;
  std::map<std::string, at::Tensor> own;  // its parameters, by qualified (graph) name
};

LoadedModule loadModule(const ImportSpec& spec, const ImportedModel& m, at::ScalarType dtype,
                        const std::map<std::string, at::Tensor>& inputs) {
  LoadedModule l{loadModelFile(spec.file, spec.fault).module, {}};
  // As nn.Module.to(dtype) does: floating parameters and buffers converted, the rest (a bool
  // mask, num_batches_tracked) moved only. (torch::jit::Module::to converts every buffer.)
  {
    at::NoGradGuard noGrad;
    const auto convert = [&](const at::Tensor& t) {
      t.set_data(at::isFloatingType(t.scalar_type()) ? toCaseDtype(t, caseDevice(), dtype)
                                                     : t.to(caseDevice()));
    };
    for (const auto& p : l.module.named_parameters(true)) convert(p.value);
    for (const auto& b : l.module.named_buffers(true)) convert(b.value);
  }
  l.module.train();
  for (const auto& p : l.module.named_parameters(true)) l.own[p.name] = p.value;
  {
    at::NoGradGuard noGrad;
    for (const auto& [name, dims] : m.graph.parameters) l.own.at(name).copy_(inputs.at(name));
  }
  // The graph's parameters are the trainable ones; a frozen one stays so (module state). A
  // parameter tied to another (b.weight = a.weight: one tensor under two names, of which the
  // graph keeps the first) is trained under either name: deciding by each name would freeze
  // the tensor under the second.
  std::set<const c10::TensorImpl*> trained;
  for (const auto& [name, dims] : m.graph.parameters) {
    if (auto it = l.own.find(name); it != l.own.end()) {
      trained.insert(it->second.unsafeGetTensorImpl());
    }
  }
  for (auto& [name, p] : l.own) {
    p.set_requires_grad(trained.count(p.unsafeGetTensorImpl()) > 0);
    if (p.grad().defined()) p.mutable_grad() = at::Tensor();
  }
  return l;
}

// A trainable parameter that PyTorch's own backward leaves without a gradient (it reaches the
// output only through detach(), an integer operation or a no-grad region) has nothing to
// compare: said as the model's property on every row, not as every strategy missing it.
void refuseUngraded(const ImportSpec& spec, const ImportedModel& m, const LoadedModule& l) {
  std::string names;
  int count = 0;
  for (const auto& [name, dims] : m.graph.parameters) {
    if (l.own.at(name).grad().defined()) continue;
    if (++count <= 8) names += (names.empty() ? "" : ", ") + name;
  }
  if (count == 0) return;
  if (count > 8) names += ", ... (" + std::to_string(count) + " in all)";
  throw std::runtime_error(
      spec.file + ": PyTorch's backward gives no gradient to " + names +
      ", which the forward reads: it reaches the output only through detach(), an integer "
      "operation or a no-grad region, so there is no gradient to verify; freeze it "
      "(requires_grad=False) or let the output depend on it differentiably");
}

// TorchScript's graph executor runs a module as traced the first time and, from PyTorch 2.x's
// profiling executor on, an optimized graph with its own symbolic gradients after that: the
// gradients of a module's second run differ from its first in the last bits (GPT-2 on 2.13;
// never on 1.13). The reference is the module's eager computation on every micro-batch (and,
// training, every step), as the graph replays it: the executor's optimization is off while it
// runs.
struct NoExecutorOptimization {
  const bool was = torch::jit::getGraphExecutorOptimize();
  NoExecutorOptimization() { torch::jit::setGraphExecutorOptimize(false); }
  ~NoExecutorOptimization() { torch::jit::setGraphExecutorOptimize(was); }
};

// The data a case of `spec` starts from: the forward's inputs and constants, the parameters,
// and grad_output (the stream the graph reference draws its target from).
WorkloadData startingData(const ImportSpec& spec, const ImportedModel& m, at::ScalarType dtype,
                          uint64_t seed, InputMode mode) {
  WorkloadData d;
  d.inputs = importedInputs(m, dtype, seed, mode);
  for (auto& [name, t] : importedParameters(m, spec, dtype, seed)) d.inputs[name] = t;
  const std::vector<int64_t> outShape = m.graph.valueShape(m.graph.output);
  d.inputs["grad_output"] = makeNormal(outShape, dtype, seed, 999, mode);
  if (spec.microbatches > 1 && outShape.at(0) % spec.microbatches != 0) {
    throw ImportError("torchscript: shape key 'microbatches' (" +
                      std::to_string(spec.microbatches) +
                      ") must divide the output's first dimension (the batch's rows), " +
                      std::to_string(outShape[0]));
  }
  return d;
}

// The module's forward and backward on each micro-batch of every input's rows in turn (one,
// without `microbatches`), its parameters' gradients accumulated in that order, as a training
// loop accumulating gradients does; the backward of each from grad_output's rows, d sum(output *
// grad_output) / d output. Returns the micro-batches' outputs; adds their losses sum(output *
// grad_output), each in float64, to `loss` where given.
std::vector<at::Tensor> forwardBackward(torch::jit::Module& module, const ImportSpec& spec,
                                        const ImportedModel& m, const WorkloadData& d,
                                        double* loss) {
  const int64_t M = spec.microbatches;
  const at::Tensor& gradOutput = d.inputs.at("grad_output");
  std::vector<at::Tensor> outs;
  for (int64_t k = 0; k < M; ++k) {
    const auto rows = [&](const at::Tensor& t) {
      return M == 1 ? t : t.narrow(0, k * (t.size(0) / M), t.size(0) / M);
    };
    // Copies: a model that writes into its input (x.add_(1)) must not change the inputs every
    // strategy is then given.
    std::vector<c10::IValue> args;
    for (const auto& name : m.dataInputs) args.emplace_back(rows(d.inputs.at(name)).clone());
    c10::IValue r = module.forward(args);
    while (r.isTuple()) r = r.toTupleRef().elements().at(0);
    const at::Tensor out = r.toTensor();
    const at::Tensor g = rows(gradOutput);
    if (!out.sizes().equals(g.sizes())) {
      throw ImportError("torchscript: " + spec.file + " returns " + dimsString(out.sizes()) +
                        " on a micro-batch, not the rows " + dimsString(g.sizes()) +
                        " of its output " + dimsString(gradOutput.sizes()) +
                        " (shape key 'microbatches' needs the batch as every input's and the "
                        "output's first dimension)");
    }
    torch::autograd::backward({out}, {g});
    if (loss) *loss += (out.detach() * g).sum().item<double>();
    outs.push_back(out.detach());
  }
  return outs;
}

// Before step `step`'s forward of a model that draws random numbers: torch's generators set to
// the step's seed, as an executor running the module sets its own (strategies/torch/), so that
// both draw the same masks.
void seedDraws(const ImportSpec& spec, uint64_t seed, int step) {
  if (spec.random) at::manual_seed(drawSeed(seed, step));
}

class TorchscriptWorkload final : public Workload {
 public:
  std::string name() const override { return "torchscript"; }
  std::string description() const override {
    return "a traced PyTorch model (a TorchScript file): its own forward and backward are the "
           "reference; the imported graph is what the strategies run";
  }
  void validate(const nlohmann::json& shape) const override {
    const ImportSpec spec = ImportSpec::fromJson(shape);
    importModel(spec);
    // Micro-batches: the trace must also run on one micro-batch's rows (a batch size the trace
    // folded to a constant is named by the node that fails).
    if (spec.microbatches > 1) importModel(spec.microbatch());
  }
  std::string shapeString(const nlohmann::json& shape) const override {
    const ImportSpec s = ImportSpec::fromJson(shape);
    const auto slash = s.file.rfind('/');
    std::string out = "file=" + (slash == std::string::npos ? s.file : s.file.substr(slash + 1));
    for (const auto& i : s.inputs) {
      out += ";input=" + dimsString(i.shape) + (i.dtype == "int64" ? ":int64" : "");
    }
    if (s.seededParams) out += ";params=seed";
    if (s.microbatches > 1) out += ";microbatches=" + std::to_string(s.microbatches);
    if (s.random) out += ";random";
    return out;
  }

  WorkloadData build(const nlohmann::json& shape, at::ScalarType dtype, uint64_t seed,
                     InputMode mode) const override {
    const ImportSpec spec = ImportSpec::fromJson(shape);
    const auto m = importModel(spec);
    WorkloadData d = startingData(spec, *m, dtype, seed, mode);
    LoadedModule l = loadModule(spec, *m, dtype, d.inputs);
    const NoExecutorOptimization noOptimization;
    seedDraws(spec, seed, 0);
    const auto outs = forwardBackward(l.module, spec, *m, d, nullptr);
    refuseUngraded(spec, *m, l);
    d.expected["output"] = outs.size() == 1 ? outs[0] : at::cat(outs, 0);
    d.checked.push_back("output");
    for (const auto& [name, dims] : m->graph.parameters) {
      const at::Tensor& p = l.own.at(name);
      d.expected["grad/" + name] = p.grad().defined() ? p.grad() : at::zeros_like(p);
      d.checked.push_back("grad/" + name);
    }
    return d;
  }
};

}  // namespace

uint64_t drawSeed(uint64_t seed, int step) {
  // A seed per step, apart from the case's input streams' (a fixed odd multiplier mixes the
  // step in); below 2^53 so that it crosses JSON to Python exactly.
  return (seed * 1000003ull + 7919ull * static_cast<uint64_t>(step + 1)) & ((1ull << 53) - 1);
}

WorkloadData buildTraining(const nlohmann::json& shape, at::ScalarType dtype, uint64_t seed,
                           InputMode mode, const TrainingSpec& training) {
  const ImportSpec spec = ImportSpec::fromJson(shape);
  const auto m = importModel(spec);
  WorkloadData d = startingData(spec, *m, dtype, seed, mode);
  // The target is grad_output (d loss / d output), which a pipeline's chain and the one-step
  // executors read under either name.
  d.inputs["target"] = d.inputs.at("grad_output");
  LoadedModule l = loadModule(spec, *m, dtype, d.inputs);
  // The graph's parameters are what every executor holds and steps; a parameter of the module
  // that no path to the output reads is neither.
  std::vector<std::pair<std::string, at::Tensor>> params;
  for (const auto& [name, dims] : m->graph.parameters) params.emplace_back(name, l.own.at(name));
  TrainingLoop loop(training, params);
  const NoExecutorOptimization noOptimization;
  for (int k = 0; k < training.steps; ++k) {
    for (auto& [name, p] : params) p.mutable_grad() = at::Tensor();
    double loss = 0;
    seedDraws(spec, seed, k);
    forwardBackward(l.module, spec, *m, d, &loss);
    if (k == 0) refuseUngraded(spec, *m, l);
    loop.update(loss);
  }
  loop.write(d.expected, &d.checked);
  return d;
}

const Workload* torchscriptWorkload() {
  static const TorchscriptWorkload w;
  return &w;
}

}  // namespace sb::reference::torchscript
