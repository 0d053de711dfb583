// What a pipeline cuts into stages (pipeline_executor.h: ChainModel): the chain workloads
// (reference/chain_nets.h) and imported models (reference/torchscript/linearize.h).

#include <ATen/ATen.h>
#include <c10/core/ScalarType.h>

#include <map>
#include <mutex>
#include <set>

#include "reference/torchscript/import.h"
#include "reference/torchscript/linearize.h"
#include "strategies/pipeline/pipeline_executor.h"

namespace sb::strategies::pipeline {

namespace ts = reference::torchscript;

namespace {

int64_t shapeInt(const CaseSpec& c, const char* key, int64_t def) {
  return c.shape.is_object() ? c.shape.value(key, def) : def;
}

// mlp_chain and gpt2_stack keep the input's shape from layer to layer: [rows, width] and
// [rows, seq, d_model].
ChainModel builtInModel(const CaseSpec& c) {
  ChainModel m;
  const int64_t total = shapeInt(c, "microbatches", 1);
  const int64_t es = static_cast<int64_t>(c10::elementSize(c.dtype));
  int64_t bytes = 0;
  if (c.workload == "mlp_chain") {
    m.layers = static_cast<int>(shapeInt(c, "depth", 8));
    bytes = shapeInt(c, "batch", 16) / std::max<int64_t>(1, total) * shapeInt(c, "width", 64) * es;
  } else {
    m.layers = static_cast<int>(shapeInt(c, "layers", 4)) + 1;  // and ln_f
    bytes = shapeInt(c, "batch", 2) / std::max<int64_t>(1, total) * shapeInt(c, "seq", 64) *
            shapeInt(c, "d_model", 64) * es;
  }
  m.boundaryBytes.assign(static_cast<size_t>(m.layers) + 1, bytes);
  m.layerCost.assign(static_cast<size_t>(m.layers), 1.0);
  if (c.workload == "gpt2_stack") m.layerCost.back() = 0.01;  // ln_f: a layer norm
  return m;
}

// An imported model: its graph on one micro-batch's rows, linearised from its first input.
ChainModel importedModel(const CaseSpec& c) {
  const ts::ImportSpec spec = ts::ImportSpec::fromJson(c.shape);
  const auto model = ts::importModel(spec.microbatch());
  const reference::Graph& g = model->graph;
  const auto stages = ts::linearizeModel(*model, false, ts::ChainInput::kFloatingOrIds);
  ts::refuseSecondInputOverMicrobatches(spec, *model);
  ChainModel m;
  m.imported = true;
  m.layers = static_cast<int>(stages.size());
  const int64_t es = static_cast<int64_t>(c10::elementSize(c.dtype));
  const auto bytesOf = [&](const std::string& value, bool ids) {
    int64_t n = 1;
    for (int64_t d : g.valueShape(value)) n *= d;
    return n * (ids ? int64_t{8} : es);
  };
  m.idsInput = model->inputSpecs.at(0).dtype == "int64";
  for (const auto& s : stages) {
    m.boundaryBytes.push_back(bytesOf(s.input, m.boundaryBytes.empty() && m.idsInput));
  }
  m.boundaryBytes.push_back(bytesOf(stages.back().output, false));
  // A layer's cost for params.cut: balanced: its nodes (a block's tens, a norm's one).
  for (size_t s = 0; s < stages.size(); ++s) {
    m.layerCost.push_back(static_cast<double>(stages[s].nodes.size()));
    for (int k : stages[s].nodes) {
      for (const auto& a : g.nodes[k].args) {
        const auto it = g.isParameterName.find(a);
        if (it == g.isParameterName.end() || !it->second) continue;
        auto& layers = m.readers[a];
        if (layers.empty() || layers.back() != static_cast<int>(s)) {
          layers.push_back(static_cast<int>(s));
        }
      }
    }
  }
  for (const auto& [name, dims] : g.parameters) {
    m.paramShapes[name] = dims;
    TORCH_CHECK(m.readers.count(name), "pipeline: parameter ", name,
                " is read by no stage of the chain");
  }
  return m;
}

}  // namespace

bool cutsIntoStages(const std::string& workload) {
  return workload == "mlp_chain" || workload == "gpt2_stack" || workload == "torchscript";
}

std::shared_ptr<const ChainModel> chainModel(const CaseSpec& c) {
  if (!cutsIntoStages(c.workload)) return nullptr;
  static std::mutex mu;
  static std::map<std::string, std::shared_ptr<const ChainModel>> cache;
  const std::string key =
      c.workload + "\n" + c.shape.dump() + "\n" + std::string(c10::toString(c.dtype));
  {
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = cache.find(key); it != cache.end()) return it->second;
  }
  auto m = std::make_shared<const ChainModel>(c.workload == "torchscript" ? importedModel(c)
                                                                          : builtInModel(c));
  std::lock_guard<std::mutex> lock(mu);
  cache.emplace(key, m);
  return m;
}

std::vector<int> layersOf(const CaseSpec& c, const std::string& name) {
  const auto m = chainModel(c);
  TORCH_CHECK(m, "pipeline: ", c.workload, " is not a chain");
  if (m->imported) {
    const auto it = m->readers.find(name);
    TORCH_CHECK(it != m->readers.end(), "pipeline: no parameter ", name);
    return it->second;
  }
  // The built-in chains: the parameter's name's first component is its layer's name
  // (mlp_chain's layer<i>, gpt2_stack's h<l> and ln_f).
  const std::string head = name.substr(0, name.find('.'));
  if (head == "ln_f") return {m->layers - 1};
  const size_t digits = head.find_first_of("0123456789");
  TORCH_CHECK(digits != std::string::npos, "pipeline: parameter ", name, " names no layer");
  return {std::stoi(head.substr(digits))};
}

std::vector<std::pair<std::string, std::vector<int64_t>>> parameterShapes(const CaseSpec& c) {
  const auto m = chainModel(c);
  TORCH_CHECK(m, "pipeline: ", c.workload, " is not a chain");
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  if (m->imported) {
    for (const auto& [name, dims] : m->paramShapes) out.emplace_back(name, dims);
    return out;
  }
  const auto net = reference::findChainWorkload(c.workload)->makeNet(c.shape, c.dtype, 0);
  for (const auto& [name, t] : net->parameters()) out.emplace_back(name, t.sizes().vec());
  return out;
}

std::vector<int> holdersOf(const Plan& p, const std::vector<int>& layers) {
  std::set<int> ranks;
  for (int l : layers) ranks.insert(p.schedule.stageRank.at(p.stageOf(l)));
  return {ranks.begin(), ranks.end()};
}

std::unique_ptr<reference::ChainNet> makeChainNet(const CaseSpec& c,
                                                  const reference::WorkloadData& data) {
  if (c.workload == "torchscript") {
    // The net's own copies: its parameters are the data's tensors detached, which share their
    // version counter (and storage) with every other rank's, so that one rank letting another's
    // stage's parameters go would look to the others like an in-place change of theirs.
    reference::WorkloadData own;
    for (const auto& [name, t] : data.inputs) own.inputs[name] = t.clone();
    return ts::importedChainNet(c.shape, own, ts::ChainInput::kFloatingOrIds);
  }
  return reference::findChainWorkload(c.workload)->makeNet(c.shape, c.dtype, c.seed);
}

}  // namespace sb::strategies::pipeline
