// An imported model cut into a chain of stages (linearize.h).

#include "reference/torchscript/linearize.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <map>
#include <set>

#include "reference/ops.h"
#include "reference/torchscript/import.h"

namespace sb::reference::torchscript {
namespace {

enum class Kind { kConstant, kParameterDerived, kActivation };

bool isView(const GraphNode& n) {
  const std::string& op = n.shape.op;
  if (op == "view" || op == "reshape" || op == "transpose" || op == "permute" || op == "split" ||
      op == "getitem") {
    return true;
  }
  return op == "aten" && n.shape.attrs.value("view", false);
}

// A `contiguous` node the importer put before a convolution only (for the sharding strategies'
// im2col kernel, which needs one) is not the module's: the module's conv2d reads a
// channels-last input (ConvNeXt's downsampling after LayerNorm2d) as it is, and takes oneDNN's
// channels-last path, which rounds otherwise. The chain runs the module's arithmetic: such a
// node hands its input on as it is, a view for the cuts.
bool handsOnItsInput(const Graph& g, const GraphNode& n) {
  if (n.shape.op != "contiguous") return false;
  bool read = false;
  for (const GraphNode& r : g.nodes) {
    if (std::find(r.args.begin(), r.args.end(), n.name) == r.args.end()) continue;
    if (r.shape.op != "conv2d" || r.args.at(0) != n.name) return false;
    read = true;
  }
  return read;
}

// What the chain hands on as its input's storage: a view, or such a `contiguous`. No cut is
// made after one, so that a stage's output is never its input's storage.
bool aliasesItsInput(const Graph& g, const GraphNode& n) {
  return isView(n) || handsOnItsInput(g, n);
}

// The module a node belongs to: its name up to the last dot ("layer1.0.conv1" of
// "layer1.0.conv1._convolution"); "" for a node of the top-level forward.
std::string modulePath(const std::string& node) {
  const auto dot = node.rfind('.');
  return dot == std::string::npos ? "" : node.substr(0, dot);
}

std::string stageName(const Graph& g, const std::vector<int>& nodes) {
  std::vector<std::string> paths;
  for (int k : nodes) {
    std::string p = modulePath(g.nodes[k].name);
    if (!p.empty()) paths.push_back(p);
  }
  if (paths.empty()) return g.nodes[nodes.front()].name;
  // The longest common prefix of whole components.
  std::string common = paths.front();
  for (const auto& p : paths) {
    while (!common.empty() && !(p == common || p.rfind(common + ".", 0) == 0)) {
      const auto dot = common.rfind('.');
      common = dot == std::string::npos ? "" : common.substr(0, dot);
    }
  }
  if (!common.empty()) return common;
  return paths.front() == paths.back() ? paths.front() : paths.front() + ".." + paths.back();
}

struct Classified {
  std::vector<Kind> kind;                 // per node
  std::map<std::string, Kind> valueKind;  // per value: inputs, parameters, node outputs
};

Classified classify(const Graph& g, const std::string& input,
                    const std::vector<std::string>& constants) {
  Classified c;
  for (const auto& name : constants) c.valueKind[name] = Kind::kConstant;
  for (const auto& [name, dims] : g.parameters) c.valueKind[name] = Kind::kParameterDerived;
  c.valueKind[input] = Kind::kActivation;
  for (const auto& n : g.nodes) {
    Kind k = Kind::kConstant;
    for (const auto& a : n.args) {
      const auto it = c.valueKind.find(a);
      if (it == c.valueKind.end()) {
        throw ImportError("linearize: node '" + n.name + "' reads '" + a +
                          "', which is neither the chain's input '" + input +
                          "', a parameter, a constant nor an earlier node's output");
      }
      k = std::max(k, it->second);
    }
    c.kind.push_back(k);
    for (const auto& o : n.outputs()) c.valueKind[o] = k;
  }
  return c;
}

}  // namespace

std::vector<ChainStage> linearize(const Graph& g, const std::string& input,
                                  const std::vector<std::string>& constants,
                                  bool cutWhereTwoCross) {
  const Classified c = classify(g, input, constants);
  if (c.valueKind.at(g.output) != Kind::kActivation) {
    throw ImportError("linearize: the output '" + g.output + "' does not depend on the input '" +
                      input + "'");
  }
  // The activation nodes in graph order: the chain's positions.
  std::vector<int> act;
  for (int k = 0; k < static_cast<int>(g.nodes.size()); ++k) {
    if (c.kind[k] == Kind::kActivation) act.push_back(k);
  }
  const int m = static_cast<int>(act.size());
  // Per activation value: the position producing it (-1: the input) and the last position
  // reading it (m: the output, read after the last node).
  std::map<std::string, int> producedAt, lastUse;
  producedAt[input] = -1;
  lastUse[input] = -1;
  for (int p = 0; p < m; ++p) {
    const GraphNode& n = g.nodes[act[p]];
    for (const auto& a : n.args) {
      if (c.valueKind.at(a) == Kind::kActivation) lastUse[a] = p;
    }
    for (const auto& o : n.outputs()) {
      producedAt[o] = p;
      lastUse.emplace(o, p);
    }
  }
  lastUse[g.output] = m;

  // Cuts after position p, with the value the chain carries across and, under the fault, the
  // one it does not.
  struct Cut {
    int after;
    std::string carried;
  };
  std::vector<Cut> cuts;
  for (int p = 0; p + 1 < m; ++p) {
    std::vector<std::string> crossing;
    for (const auto& [v, at] : producedAt) {
      if (at <= p && lastUse.at(v) > p) crossing.push_back(v);
    }
    if (crossing.empty() || crossing.size() > (cutWhereTwoCross ? 2u : 1u)) continue;
    // Carry the value this node produced; the other (the fault's) crosses beside the chain.
    std::string carried;
    for (const auto& v : crossing) {
      if (producedAt.at(v) == p) carried = v;
    }
    if (carried.empty() || aliasesItsInput(g, g.nodes[act[p]])) continue;
    cuts.push_back({p, carried});
  }
  // Nor a stage of views alone (GPT-2's logits, the head's [B*T, V] product viewed as [B, T, V]:
  // no cut is made after a view, so only the last stage can be one): its output would be its
  // input's storage, which the chain model counts twice. It joins the stage before.
  while (!cuts.empty()) {
    bool viewsOnly = true;
    for (int p = cuts.back().after + 1; p < m; ++p)
      viewsOnly = viewsOnly && aliasesItsInput(g, g.nodes[act[p]]);
    if (!viewsOnly) break;
    cuts.pop_back();
  }

  // The stages: positions between cuts, plus the parameter-derived nodes they read (a tied
  // weight's transpose), computed in every stage that reads them.
  std::vector<ChainStage> stages;
  std::map<std::string, int> producerNode;
  for (int k = 0; k < static_cast<int>(g.nodes.size()); ++k) {
    for (const auto& o : g.nodes[k].outputs()) producerNode[o] = k;
  }
  int first = 0;
  std::string in = input;
  std::map<std::string, int> stageOf;  // activation value -> the stage producing it
  stageOf[input] = -1;
  for (size_t s = 0; s <= cuts.size(); ++s) {
    const int last = s < cuts.size() ? cuts[s].after : m - 1;
    ChainStage st;
    st.input = in;
    st.output = s < cuts.size() ? cuts[s].carried : g.output;
    std::set<int> nodes;
    std::vector<int> pending;
    for (int p = first; p <= last; ++p) {
      nodes.insert(act[p]);
      pending.push_back(act[p]);
    }
    while (!pending.empty()) {
      const int k = pending.back();
      pending.pop_back();
      for (const auto& a : g.nodes[k].args) {
        const auto it = producerNode.find(a);
        if (it == producerNode.end() || c.kind[it->second] != Kind::kParameterDerived) continue;
        if (nodes.insert(it->second).second) pending.push_back(it->second);
      }
    }
    st.nodes.assign(nodes.begin(), nodes.end());
    st.name = stageName(g, st.nodes);
    for (int p = first; p <= last; ++p) {
      for (const auto& a : g.nodes[act[p]].args) {
        const auto it = stageOf.find(a);
        if (it != stageOf.end() && it->second != static_cast<int>(s) && a != st.input &&
            std::find(st.sideInputs.begin(), st.sideInputs.end(), a) == st.sideInputs.end()) {
          st.sideInputs.push_back(a);
        }
      }
      for (const auto& o : g.nodes[act[p]].outputs()) stageOf[o] = static_cast<int>(s);
    }
    stages.push_back(std::move(st));
    first = last + 1;
    if (s < cuts.size()) in = cuts[s].carried;
  }
  return stages;
}

std::vector<ChainStage> linearizeModel(const ImportedModel& m, bool cutWhereTwoCross,
                                       ChainInput in) {
  // The chain runs from the first data input; any other is ids or a mask (no gradient), which
  // every stage reads as it reads a buffer. A second floating input would be an activation the
  // chain does not carry.
  bool others = true;
  for (size_t i = 1; i < m.dataInputs.size(); ++i)
    others = others && m.inputSpecs.at(i).dtype != "float";
  if (m.dataInputs.empty() || !others ||
      (in == ChainInput::kFloating && m.inputSpecs.at(0).dtype != "float")) {
    std::string names;
    for (size_t i = 0; i < m.dataInputs.size(); ++i) {
      names += (i ? ", " : "") + m.dataInputs[i] + " (" + m.inputSpecs[i].dtype + ")";
    }
    throw ImportError(std::string(in == ChainInput::kFloating
                                      ? "linearize: a chain runs from its first input, floating, "
                                        "which it differentiates, beside inputs of ids or masks "
                                        "every stage reads; the forward takes "
                                      : "linearize: a chain runs from its first input, beside "
                                        "inputs of ids or masks every stage reads; the forward "
                                        "takes ") +
                      names);
  }
  std::vector<std::string> constants;
  for (const auto& [name, dims] : m.graph.inputs) {
    if (name != m.dataInputs[0]) constants.push_back(name);
  }
  return linearize(m.graph, m.dataInputs[0], constants, cutWhereTwoCross);
}

void refuseSecondInputOverMicrobatches(const ImportSpec& spec, const ImportedModel& m) {
  // The stages read a second input whole (a constant of the chain); micro-batches would need
  // each its rows of it, which nothing hands a stage.
  if (spec.microbatches > 1 && m.dataInputs.size() > 1) {
    throw ImportError("linearize: " + spec.file + ": the chain's stages read " + m.dataInputs[1] +
                      " whole, beside the input they run on, and a micro-batch would need its "
                      "rows of it; with shape key microbatches " +
                      std::to_string(spec.microbatches) +
                      " the chain takes a model of one input only");
  }
}

namespace {

// What the stages of one chain share: the model, the values every stage reads (parameters,
// constants, values of constants alone), and under the fault the values crossing beside it.
struct ChainState {
  std::shared_ptr<const ImportedModel> model;
  std::map<std::string, at::Tensor> fixed;
  std::map<std::string, at::Tensor> side;
  std::vector<int> constantNodes;
};

// One stage's program: the nodes it runs in order, and after each the values it frees.
struct StageProgram {
  ChainStage stage;
  std::vector<std::vector<std::string>> freeAfter;  // per node of stage.nodes
  std::vector<std::string> sideOutputs;
  std::set<size_t> asIs;  // nodes (of stage.nodes) that hand their input on as it is
};

}  // namespace

std::unique_ptr<ChainNet> importedChainNet(const nlohmann::json& shape, const WorkloadData& data,
                                           ChainInput in) {
  const ImportSpec spec = ImportSpec::fromJson(shape);
  auto state = std::make_shared<ChainState>();
  state->model = importModel(spec.microbatch());
  const ImportedModel& m = *state->model;
  const Graph& g = m.graph;
  const std::vector<ChainStage> stages = linearizeModel(m, spec.fault == "cut_where_two_cross", in);
  const std::string input = m.dataInputs.at(0);
  refuseSecondInputOverMicrobatches(spec, m);
  std::vector<std::string> constants;
  for (const auto& [name, dims] : g.inputs) {
    if (name != input) constants.push_back(name);
  }

  const Classified c = classify(g, input, constants);
  auto net = std::make_unique<ChainNet>();
  for (const auto& [name, dims] : g.parameters) {
    state->fixed[name] = net->param(name, data.inputs.at(name));
  }
  // The constants of the graph the stages run: a folded tensor of one micro-batch's size is
  // not the whole batch's (the data's).
  {
    // The case's floating dtype, as the module's output gradient has it.
    const at::ScalarType dtype = data.inputs.at("grad_output").scalar_type();
    for (const auto& name : constants) {
      const auto it = m.constants.find(name);
      state->fixed[name] = spec.microbatches == 1 || it == m.constants.end()
                               ? data.inputs.at(name)
                               : importedConstant(it->second, dtype);
    }
  }
  // Values of constants alone, once: no stage recomputes them, no gradient reaches them.
  // (Imported nodes carry no seed offset: nothing they run draws from the case's seed.)
  {
    c10::NoGradGuard noGrad;
    for (int k = 0; k < static_cast<int>(g.nodes.size()); ++k) {
      if (c.kind[k] != Kind::kConstant) continue;
      const GraphNode& n = g.nodes[k];
      const auto ys = runNode(n, [&](const std::string& a) { return state->fixed.at(a); }, 0);
      const auto names = n.outputs();
      for (size_t i = 0; i < ys.size(); ++i) state->fixed[names[i]] = ys[i];
    }
  }

  // Which later stages read each value (the fault's side outputs).
  std::map<std::string, int> lastStageReading;
  for (size_t s = 0; s < stages.size(); ++s) {
    for (const auto& v : stages[s].sideInputs) lastStageReading[v] = static_cast<int>(s);
  }
  for (size_t s = 0; s < stages.size(); ++s) {
    StageProgram prog;
    prog.stage = stages[s];
    // Free each value the stage computes or receives after its last read here, but not what it
    // hands on (its output, the fault's side outputs).
    std::set<std::string> keep = {prog.stage.output};
    for (int k : prog.stage.nodes) {
      for (const auto& o : g.nodes[k].outputs()) {
        const auto it = lastStageReading.find(o);
        if (it != lastStageReading.end() && it->second > static_cast<int>(s)) {
          prog.sideOutputs.push_back(o);
          keep.insert(o);
        }
      }
    }
    std::map<std::string, size_t> lastRead;
    for (size_t i = 0; i < prog.stage.nodes.size(); ++i) {
      for (const auto& a : g.nodes[prog.stage.nodes[i]].args) {
        if (!state->fixed.count(a)) lastRead[a] = i;
      }
    }
    prog.freeAfter.resize(prog.stage.nodes.size());
    for (const auto& [v, i] : lastRead) {
      if (!keep.count(v)) prog.freeAfter[i].push_back(v);
    }
    // What the module does not copy runs as it is (handsOnItsInput); the stage's memory is
    // measured as it runs.
    for (size_t i = 0; i < prog.stage.nodes.size(); ++i) {
      if (handsOnItsInput(g, g.nodes[prog.stage.nodes[i]])) prog.asIs.insert(i);
    }
    auto program = std::make_shared<const StageProgram>(std::move(prog));
    net->addStage(program->stage.name, [state, program](const at::Tensor& x, bool) {
      const Graph& graph = state->model->graph;
      std::map<std::string, at::Tensor> local;
      local[program->stage.input] = x;
      for (const auto& v : program->stage.sideInputs) local[v] = state->side.at(v);
      for (size_t i = 0; i < program->stage.nodes.size(); ++i) {
        const GraphNode& n = graph.nodes[program->stage.nodes[i]];
        const auto arg = [&](const std::string& a) {
          const auto it = local.find(a);
          return it != local.end() ? it->second : state->fixed.at(a);
        };
        auto ys = program->asIs.count(i) ? std::vector<at::Tensor>{arg(n.args.at(0))}
                                         : runNode(n, arg, 0);
        const auto names = n.outputs();
        for (size_t j = 0; j < ys.size(); ++j) local[names[j]] = std::move(ys[j]);
        for (const auto& v : program->freeAfter[i]) local.erase(v);
      }
      for (const auto& v : program->sideOutputs) state->side[v] = local.at(v).detach();
      return local.at(program->stage.output);
    });
  }
  net->setData(data.inputs.at(input), data.inputs.at("grad_output"));
  return net;
}

}  // namespace sb::reference::torchscript
