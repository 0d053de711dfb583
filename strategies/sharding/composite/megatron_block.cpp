// Megatron-LM's tensor parallelism and sequence parallelism on one transformer block
// (workload transformer_block, reference/block.h), alone on a 1-D mesh (the tensor-parallel
// group) and with data parallelism on a 2-D mesh (axis 0 data parallel, axis 1 tensor
// parallel).
//
// Tensor parallel ("tp"): each rank holds heads/t of the attention's heads (a block of rows of
// the fused QKV weight, in its per-head layout, and the matching columns of the output
// projection) and 4d/t of the MLP's hidden units (rows of W1 and b1, columns of W2): column-
// then row-parallel. Per sub-block, the forward all-reduces the row-parallel product (Megatron's
// g) and the backward all-reduces the gradient of the sub-block's input (f). Layer norms,
// dropout, biases after the all-reduce and residuals run replicated.
//
// Sequence parallel ("tp_sp"): between the sub-blocks the activations are split along the
// sequence over the same ranks: layer norms, dropout and residuals run on sequence shards; the
// column-parallel input is all-gathered along the sequence (its gradient reduce-scattered), and
// the row-parallel output is reduce-scattered (its gradient all-gathered) instead of all-
// reduced. The parameters the shards share (layer norms, the two output biases) get partial
// gradients, all-reduced over the tensor-parallel group.
//
// With data parallelism every parameter's gradient is also all-reduced over axis 0.
//
// Memory: the step's recorded allocation sequence, replayed at the case's sizes
// (megatron_memory.h; MegatronExecutor::modelPeak hands it the rank's sizes and what is alive
// when the step starts). Over a case's steps the executor trains (trainSteps).
//
// One strategy and its executor in one file (some 600 lines): forward(), the communication
// prediction and the result boxes are the same layout read three ways, and are checked
// against one another by the suite; the allocation tables, data recorded against forward(),
// live apart in megatron_memory.cpp.
//
// Whole: the executor, the strategy's layout (paramBox, specifiedBox), its communication model
// and its planted faults are one plan of one block, each read against the others; the memory
// replay is already apart (megatron_memory.h). A cut would split the plan, not a seam.

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <cmath>
#include <optional>
#include <string>

#include "harness/capture_tape.h"
#include "harness/comm/autograd_comm.h"
#include "harness/comm/comm_site.h"
#include "harness/measure/update_profile.h"
#include "harness/registry.h"
#include "reference/autograd_engine.h"
#include "reference/block.h"
#include "reference/ops.h"
#include "reference/training.h"
#include "strategies/sharding/composite/megatron_memory.h"
#include "strategies/sharding/layout/spec_boxes.h"
#include "strategies/sharding/sharding_util.h"

namespace sb::strategies {
namespace {

// The module of a block parameter: attention's (ln_1.*, attn.*) or the MLP's (ln_2.*, mlp.*).
std::string blockModuleOf(const std::string& param) {
  return param.rfind("ln_1.", 0) == 0 || param.rfind("attn.", 0) == 0 ? "attn" : "mlp";
}

using harness::Applicability;
using harness::Box;
using harness::CaseSpec;
using harness::Collective;
using harness::CommStats;
using harness::Communicator;
using harness::DeviceMesh;
using harness::RankContext;
using reference::BlockShape;

// Which dimension of each parameter the tensor-parallel ranks split (-1: replicated).
int tpDim(const std::string& name) {
  if (name == "attn.qkv.weight" || name == "attn.qkv.bias" || name == "mlp.fc.weight" ||
      name == "mlp.fc.bias") {
    return 0;
  }
  if (name == "attn.proj.weight" || name == "mlp.proj.weight") return 1;
  return -1;
}

struct Geometry {
  int64_t dp = 1, tp = 1;  // group sizes
  int64_t dpIndex = 0, tpIndex = 0;
  std::vector<int> dpAxes, tpAxes;
};

Geometry geometryOf(const CaseSpec& c, int rank) {
  Geometry g;
  const DeviceMesh mesh(c.mesh);
  const auto coords = mesh.coords(rank);
  if (c.mesh.size() == 1) {
    g.tpAxes = {0};
  } else {
    g.dpAxes = {0};
    g.tpAxes = {1};
  }
  g.tp = mesh.groupSize(g.tpAxes);
  g.dp = mesh.groupSize(g.dpAxes);
  g.tpIndex = mesh.groupIndex(rank, g.tpAxes);
  g.dpIndex = g.dpAxes.empty() ? 0 : mesh.groupIndex(rank, g.dpAxes);
  return g;
}

class MegatronStrategy;

class MegatronExecutor final : public harness::RankExecutor {
 public:
  MegatronExecutor(const MegatronStrategy& s, const CaseSpec& c);
  void prepare(RankContext& ctx, const reference::WorkloadData& data) override;
  void step(RankContext& ctx) override;
  std::map<std::string, at::Tensor> results() const override;
  std::optional<int64_t> predictedPeakBytes() const override { return predicted_; }
  // Locating a failure: the next step (its first optimizer step in training) keeps this rank's
  // pieces of the activations between the block's parts (reference::blockTapNames), of their
  // gradients, the input's and the parameters'.
  bool capturesValues() const override { return true; }
  void setCapture(bool on) override {
    captureOn_ = on;
    if (on) captured_.clear();
    if (!on) tape_.reset();  // what a step that threw left (its hooks removed with it)
  }
  std::vector<harness::TraceValue> captured() const override { return captured_; }
  std::vector<std::pair<std::string, std::string>> recordParams() const override {
    if (!case_.training.enabled()) return {};
    return {{"steps", std::to_string(case_.training.steps)},
            {"optimizer", case_.training.optimizer.toString()},
            {"update_peak_bytes", std::to_string(updatePeak_)}};
  }

 private:
  // The block on the leaves as they are, forward only: this rank's box of the output.
  at::Tensor forward();
  // Training over the case's steps (reference/training.h): every step() from the initial
  // pieces, LibTorch's optimizer over this rank's pieces (a replicated layer norm stepped alike
  // on every tensor-parallel rank), the loss and the norm's squares all-reduced over the mesh
  // with each replicated box counted once. The update is profiled in prepare() on copies.
  void trainSteps(RankContext& ctx);
  std::vector<at::Tensor> initialParams_;
  std::vector<bool> counted_;
  bool outputCounted_ = true;
  std::unique_ptr<reference::TrainingLoop> loop_;
  int64_t updatePeak_ = 0, stateBytes_ = 0;
  at::Tensor dropout(const at::Tensor& t, int site) const;
  at::Tensor gatherSeq(const at::Tensor& t);
  at::Tensor scatterSeq(const at::Tensor& t);
  int64_t modelPeak(RankContext& ctx) const;

  const MegatronStrategy& strategy_;
  const CaseSpec& case_;
  BlockShape s_;
  Geometry g_;
  bool sp_ = false;
  Box actBox_;  // this rank's box of the [batch, seq, d_model] activations at the block's ends
  at::Tensor x_, gradOut_;
  std::vector<std::pair<std::string, at::Tensor>> params_;
  std::map<std::string, Communicator*> paramGroup_;  // gradient all-reduce group, if any
  Communicator* tp_ = nullptr;
  std::map<std::string, at::Tensor> results_;
  std::optional<int64_t> predicted_;
  bool captureOn_ = false;
  std::unique_ptr<harness::CaptureTape> tape_;
  std::vector<harness::TraceValue> captured_;
  // The step's values to the tape (untimed capture only): an activation as made, and its
  // gradient when the backward completes it; the input's and the parameters' gradients.
  at::Tensor tap(int i, const at::Tensor& t) {
    if (!tape_) return t;
    const std::string& name = reference::blockTapNames()[i];
    tape_->keep(name, "forward", name, t, actBox_);
    tape_->hookGradient(name, name, t, actBox_);
    return t;
  }
  void startCapture(int rank);
  void endCapture() {
    if (!tape_) return;
    captured_ = tape_->take();
    tape_.reset();
  }
};

class MegatronStrategy final : public harness::Strategy {
 public:
  MegatronStrategy(bool sequenceParallel, std::string fault)
      : Strategy(
            sequenceParallel ? "sharding/megatron/tp_sp" : "sharding/megatron/tp",
            sequenceParallel ? "Megatron tensor + sequence parallel" : "Megatron tensor parallel",
            harness::Family::kSharding),
        sp_(sequenceParallel),
        fault_(std::move(fault)) {}

  bool sequenceParallel() const { return sp_; }
  const std::string& fault() const { return fault_; }

  // The block's allocation replay predicts every rank's peak to the byte (docs/sharding.md),
  // so it is judged exactly: an error of a few bytes is a bug of the model.
  PredictionTolerance predictionTolerance() const override {
    return PredictionTolerance::exactMemory();
  }

  // The plain block with the same parameters, input and dropout seeds: its activations between
  // the parts (reference::blockTapNames), their gradients, the input's and the parameters'.
  std::vector<harness::TraceValue> referenceTrace(
      const CaseSpec& c, const reference::WorkloadData& data) const override {
    const BlockShape s = BlockShape::parse(c.shape);
    std::map<std::string, at::Tensor> leaves;
    std::vector<std::pair<std::string, at::Tensor>> wrt;
    for (const auto& [name, dims] : reference::blockParameters(s)) {
      leaves[name] = data.inputs.at(name).clone().set_requires_grad(true);
    }
    const at::Tensor x = data.inputs.at("input").clone().set_requires_grad(true);
    std::vector<std::pair<std::string, at::Tensor>> taps;
    const at::Tensor y = reference::blockForward(s, leaves, x, c.seed, &taps);
    std::vector<harness::TraceValue> out;
    std::vector<at::Tensor> ts;
    for (const auto& [name, t] : taps) {
      out.push_back({name, "forward", name, t.detach(), {}});
      wrt.emplace_back(name, t);
    }
    wrt.emplace_back("input", x);
    for (const auto& [name, t] : leaves) wrt.emplace_back(name, t);
    for (const auto& [name, t] : wrt) ts.push_back(t);
    const at::Tensor seed = data.inputs.at(c.training.enabled() ? "target" : "grad_output");
    const auto grads = torch::autograd::grad({y}, ts, {seed}, false, false, true);
    for (size_t i = 0; i < wrt.size(); ++i) {
      if (grads[i].defined()) {
        out.push_back({wrt[i].first, "backward", "grad " + wrt[i].first, grads[i], {}});
      }
    }
    return out;
  }

  std::vector<std::string> plantableFaults() const override {
    if (sp_) return {"all_reduce_instead_of_reduce_scatter", "skip_shared_grad_all_reduce"};
    return {"skip_forward_all_reduce"};
  }
  std::unique_ptr<harness::Strategy> withPlantedFault(const std::string& name) const override {
    const auto f = plantableFaults();
    if (std::find(f.begin(), f.end(), name) == f.end()) return nullptr;
    return std::make_unique<MegatronStrategy>(sp_, name);
  }

  std::vector<std::pair<std::string, std::string>> params() const override {
    return {{"meshes", "1-D (tensor parallel), 2-D (axis 0 data, axis 1 tensor parallel)"},
            {"sequence_parallel", sp_ ? "yes" : "no"}};
  }

  nlohmann::json describe() const override {
    nlohmann::json comm = nlohmann::json::array();
    if (sp_) {
      comm.push_back({{"phase", "forward"},
                      {"collective", "all_gather"},
                      {"operand", "layer norm outputs (sequence)"},
                      {"count_per_block", 2}});
      comm.push_back({{"phase", "forward"},
                      {"collective", "reduce_scatter"},
                      {"operand", "row-parallel outputs (sequence)"},
                      {"count_per_block", 2}});
      comm.push_back({{"phase", "backward"},
                      {"collective", "reduce_scatter"},
                      {"operand", "gradients of the gathered inputs"},
                      {"count_per_block", 2}});
      comm.push_back({{"phase", "backward"},
                      {"collective", "all_gather"},
                      {"operand", "gradients of the scattered outputs"},
                      {"count_per_block", 2}});
      comm.push_back({{"phase", "backward"},
                      {"collective", "all_reduce"},
                      {"operand", "layer norm and output bias gradients (partial over sequence)"}});
    } else {
      comm.push_back({{"phase", "forward"},
                      {"collective", "all_reduce"},
                      {"operand", "row-parallel outputs (g)"},
                      {"count_per_block", 2}});
      comm.push_back({{"phase", "backward"},
                      {"collective", "all_reduce"},
                      {"operand", "gradients of the sub-block inputs (f)"},
                      {"count_per_block", 2}});
    }
    comm.push_back({{"phase", "backward"},
                    {"collective", "all_reduce"},
                    {"operand", "every parameter gradient, over the data-parallel axis"}});
    nlohmann::json seq = nlohmann::json::object();
    seq["input"] = sp_ ? "[R, S0, R]" : "[R, R, R]";
    for (const auto& [name, dims] : reference::blockParameters(BlockShape{})) {
      const int d = tpDim(name);
      seq[name] = d < 0 ? (dims.size() == 1 ? "[R]" : "[R, R]")
                        : (dims.size() == 1 ? "[S0]"
                           : d == 0         ? "[S0, R]"
                                            : "[R, S0]");
    }
    return {{"sharding_sequences", seq},
            {"sharding_sequences_for",
             "a 1-D tensor-parallel mesh; on 2-D, axis 1, with the "
             "batch on axis 0"},
            {"communication", comm}};
  }

  Applicability applies(const CaseSpec& c) const override {
    if (c.workload != "transformer_block") {
      return Applicability::notApplicable("not a transformer_block workload");
    }
    if (c.mesh.size() > 2) return Applicability::notApplicable("for 1-D and 2-D meshes");
    const BlockShape s = BlockShape::parse(c.shape);
    const Geometry g = geometryOf(c, 0);
    const auto need = [&](int64_t n, int64_t parts, const std::string& what) -> std::string {
      return n % parts == 0 ? ""
                            : what + " (" + std::to_string(n) + ") does not divide over " +
                                  std::to_string(parts) + " ranks";
    };
    for (const std::string& why :
         {need(s.heads, g.tp, "heads"), need(4 * s.dModel, g.tp, "the MLP's hidden units"),
          need(s.batch, g.dp, "dimension 0 of the input, the batch,"),
          sp_ ? need(s.seq, g.tp, "dimension 1 of the input, the sequence,") : std::string()}) {
      if (!why.empty()) return Applicability::unsupported(why);
    }
    return Applicability::yes();
  }

  std::unique_ptr<harness::RankExecutor> makeExecutor(const CaseSpec& c) const override {
    return std::make_unique<MegatronExecutor>(*this, c);
  }

  Box activationBox(const CaseSpec& c, int rank) const {
    const BlockShape s = BlockShape::parse(c.shape);
    const Geometry g = geometryOf(c, rank);
    Box b = Box::whole(s.activation());
    b.length[0] = s.batch / g.dp;
    b.offset[0] = g.dpIndex * b.length[0];
    if (sp_) {
      b.length[1] = s.seq / g.tp;
      b.offset[1] = g.tpIndex * b.length[1];
    }
    return b;
  }

  Box paramBox(const std::string& name, const CaseSpec& c, int rank) const {
    const BlockShape s = BlockShape::parse(c.shape);
    const Geometry g = geometryOf(c, rank);
    for (const auto& [n, dims] : reference::blockParameters(s)) {
      if (n != name) continue;
      Box b = Box::whole(dims);
      const int d = tpDim(name);
      if (d >= 0) {
        b.length[d] = dims[d] / g.tp;
        b.offset[d] = g.tpIndex * b.length[d];
      }
      return b;
    }
    TORCH_INTERNAL_ASSERT(false, "no parameter ", name);
  }

  Box resultBox(const std::string& tensor, const CaseSpec& c, int rank) const override {
    if (tensor == "output" || tensor == "grad_input") return activationBox(c, rank);
    // grad/<parameter>, param/<parameter>, state/<parameter>/<key>: the parameter's piece.
    const size_t slash = tensor.find('/');
    TORCH_INTERNAL_ASSERT(slash != std::string::npos, "no layout for ", tensor);
    std::string name = tensor.substr(slash + 1);
    if (tensor.rfind("state/", 0) == 0) name = name.substr(0, name.rfind('/'));
    return paramBox(name, c, rank);
  }
  Box resultBoxOf(const std::string& tensor, const CaseSpec& c, int rank,
                  at::IntArrayRef fullShape) const override {
    // A step's loss and gradient norm, and AdamW's step count: every rank holds them whole.
    if (harness::isWholeTrainingResult(tensor)) return Box::whole(fullShape);
    return resultBox(tensor, c, rank);
  }
  // Megatron-LM's plan for a GPT block, as its layers state it, derived from the parameter's
  // name and the case's mesh through spec_boxes.h (nothing of paramBox, tpDim or geometryOf,
  // which the executor shares): ColumnParallelLinear (attn.qkv, mlp.fc) splits its weight's
  // output rows and its bias, RowParallelLinear (attn.proj, mlp.proj) its weight's input
  // columns and keeps its bias whole, layer norms are whole; the tensor-parallel group is the
  // mesh's last axis (a 2-D mesh is [dp, tp]), every piece replicated over data parallelism.
  // Gradients and optimizer state have their parameter's layout.
  std::optional<SpecifiedBox> specifiedBox(const std::string& tensor, const CaseSpec& c, int rank,
                                           at::IntArrayRef fullShape) const override {
    const size_t slash = tensor.find('/');
    const std::string kind = tensor.substr(0, slash);
    if (slash == std::string::npos || !(kind == "grad" || kind == "param" || kind == "state") ||
        tensor == "state/step" || fullShape.empty()) {
      return std::nullopt;
    }
    std::string name = tensor.substr(slash + 1);
    if (kind == "state") name = name.substr(0, name.rfind('/'));
    const auto endsWith = [&](const std::string& suffix) {
      return name.size() >= suffix.size() &&
             name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
    };
    const bool column = name.rfind("attn.qkv.", 0) == 0 || name.rfind("mlp.fc.", 0) == 0;
    const bool row = name.rfind("attn.proj.", 0) == 0 || name.rfind("mlp.proj.", 0) == 0;
    const std::string tpAxis = std::to_string(c.mesh.size() - 1);
    std::vector<std::string> dims(fullShape.size(), "R");
    std::string layer = "LayerNorm: whole";
    if (column) {
      dims[0] = "S" + tpAxis;
      layer = "ColumnParallelLinear: its output features over tp";
    } else if (row && endsWith(".weight")) {
      if (dims.size() > 1) dims[1] = "S" + tpAxis;
      layer = "RowParallelLinear: its input features over tp";
    } else if (row) {
      layer = "RowParallelLinear: its bias whole";
    }
    std::string sequence = "[";
    for (size_t d = 0; d < dims.size(); ++d) sequence += (d ? ", " : "") + dims[d];
    sequence += "]";
    return SpecifiedBox{harness::colossalSequenceBox(sequence, fullShape, c.mesh, rank),
                        "Megatron-LM " + name + " (" + layer + "; tp mesh axis " + tpAxis +
                            ": ColossalAI " + sequence + ")"};
  }
  bool trainsSteps() const override { return true; }

  std::vector<std::pair<std::vector<int>, CommStats>> predictCommByGroup(const CaseSpec& c,
                                                                         int rank) const override {
    const BlockShape s = BlockShape::parse(c.shape);
    const Geometry g = geometryOf(c, rank);
    const int64_t es = c10::elementSize(c.dtype);
    const int64_t act = s.batch / g.dp * s.seq * s.dModel * es;  // a gathered activation
    const auto bytes = [](int64_t groupSize, int64_t b) { return groupSize > 1 ? b : 0; };
    std::vector<std::pair<std::vector<int>, CommStats>> out;
    CommStats tp;
    if (sp_) {
      tp.add(Collective::kAllGather, bytes(g.tp, act));  // ln1 output
      tp.add(Collective::kAllGather, bytes(g.tp, act));  // ln2 output
      for (int k = 0; k < 2; ++k) {
        tp.add(Collective::kReduceScatter, bytes(g.tp, act));
        tp.add(Collective::kAllGather, bytes(g.tp, act));  // its backward
      }
      tp.add(Collective::kReduceScatter, bytes(g.tp, act));  // the gathers' backward
      tp.add(Collective::kReduceScatter, bytes(g.tp, act));
    } else {
      for (int k = 0; k < 4; ++k) tp.add(Collective::kAllReduce, bytes(g.tp, act));
    }
    out.emplace_back(g.tpAxes, tp);
    // Parameter gradients: sharded ones over the data-parallel axis; shared ones, in sequence
    // parallel, over both. (What the strategy should do: a planted fault does not change it.)
    for (const auto& [name, dims] : reference::blockParameters(s)) {
      const int64_t b = paramBox(name, c, rank).numel() * es;
      std::vector<int> axes = g.dpAxes;
      if (sp_ && tpDim(name) < 0) axes.insert(axes.end(), g.tpAxes.begin(), g.tpAxes.end());
      if (axes.empty()) continue;
      CommStats st;
      st.add(Collective::kAllReduce, bytes(DeviceMesh(c.mesh).groupSize(axes), b));
      out.emplace_back(axes, st);
    }
    addTrainingComm(out, c);
    return out;
  }

  CommStats predictComm(const CaseSpec& c, int rank) const override {
    return totalComm(predictCommByGroup(c, rank));
  }
  // Per module (attn, mlp) and phase: each one's f and g (forward: g's all-reduce, or with
  // sequence parallelism f's all-gather and g's reduce-scatter; backward: their transposes),
  // then its parameters' gradient all-reduces, in the backward.
  std::optional<std::vector<harness::NodeComm>> predictCommByNode(const CaseSpec& c,
                                                                  int rank) const override {
    const BlockShape s = BlockShape::parse(c.shape);
    const Geometry g = geometryOf(c, rank);
    const int64_t es = c10::elementSize(c.dtype);
    const int64_t act = s.batch / g.dp * s.seq * s.dModel * es;
    const int64_t tpBytes = g.tp > 1 ? act : 0;
    std::vector<harness::NodeComm> out = {{"attn", "forward", {}},
                                          {"mlp", "forward", {}},
                                          {"mlp", "backward", {}},
                                          {"attn", "backward", {}}};
    for (int m = 0; m < 2; ++m) {
      CommStats& fwd = out[m].comm;
      CommStats& bwd = out[3 - m].comm;
      if (sp_) {
        fwd.add(Collective::kAllGather, tpBytes);
        fwd.add(Collective::kReduceScatter, tpBytes);
        bwd.add(Collective::kReduceScatter, tpBytes);
        bwd.add(Collective::kAllGather, tpBytes);
      } else {
        fwd.add(Collective::kAllReduce, tpBytes);
        bwd.add(Collective::kAllReduce, tpBytes);
      }
    }
    for (const auto& [name, dims] : reference::blockParameters(s)) {
      std::vector<int> axes = g.dpAxes;
      if (sp_ && tpDim(name) < 0) axes.insert(axes.end(), g.tpAxes.begin(), g.tpAxes.end());
      if (axes.empty()) continue;
      const int64_t b = paramBox(name, c, rank).numel() * es;
      out[blockModuleOf(name) == "attn" ? 3 : 2].comm.add(
          Collective::kAllReduce, DeviceMesh(c.mesh).groupSize(axes) > 1 ? b : 0);
    }
    addTrainingComm(out, c);
    return out;
  }

  harness::Tolerance tolerance(const std::string& tensor, const CaseSpec& c,
                               const at::Tensor& expected) const override {
    // Row-parallel products and every gradient sum partial results over ranks, in another
    // order than the reference: bounded by the longest contraction, the MLP's 4d (or the
    // tokens a parameter's gradient sums over).
    const BlockShape s = BlockShape::parse(c.shape);
    const Geometry g = geometryOf(c, 0);
    const int64_t length = std::max(4 * s.dModel, s.batch * s.seq);
    const harness::Tolerance split =
        harness::splitReductionTolerance(Strategy::tolerance(tensor, c, expected), c.dtype, length,
                                         std::max(g.tp, g.dp) * 2, expected);
    if (!c.training.enabled()) return split;
    // Over steps, each step's rounding moves the next step's parameters.
    // Not widened for AdamW's key bias (docs/sharding.md): its gradient is rounding alone
    // (softmax is shift-invariant), so AdamW steps it by about lr times that rounding's sign;
    // a tolerance of 2 lr a step would cover the whole fused bias and could never fail.
    return harness::overSteps(split, c.dtype, c.training.steps, expected);
  }

 private:
  bool sp_;
  std::string fault_;
};

MegatronExecutor::MegatronExecutor(const MegatronStrategy& s, const CaseSpec& c)
    : strategy_(s), case_(c) {}

void MegatronExecutor::prepare(RankContext& ctx, const reference::WorkloadData& data) {
  s_ = BlockShape::parse(case_.shape);
  g_ = geometryOf(case_, ctx.rank());
  sp_ = strategy_.sequenceParallel();
  tp_ = &ctx.group(g_.tpAxes);
  actBox_ = strategy_.activationBox(case_, ctx.rank());
  x_ = harness::sliceBox(data.inputs.at("input"), actBox_).clone().set_requires_grad(true);
  // A training case's loss is sum(output * target): its gradient seeds the backward.
  gradOut_ = harness::sliceBox(data.inputs.at(case_.training.enabled() ? "target" : "grad_output"),
                               actBox_)
                 .clone();
  for (const auto& [name, dims] : reference::blockParameters(s_)) {
    params_.emplace_back(
        name, harness::sliceBox(data.inputs.at(name), strategy_.paramBox(name, case_, ctx.rank()))
                  .clone()
                  .set_requires_grad(true));
    std::vector<int> axes = g_.dpAxes;
    if (sp_ && tpDim(name) < 0 && strategy_.fault() != "skip_shared_grad_all_reduce") {
      axes.insert(axes.end(), g_.tpAxes.begin(), g_.tpAxes.end());
    }
    paramGroup_[name] = axes.empty() ? nullptr : &ctx.group(axes);
  }
  const int64_t peak = modelPeak(ctx);
  if (!case_.training.enabled()) {
    if (peak >= 0) predicted_ = peak;
    return;
  }
  // Activations are replicated over the tensor-parallel ranks without sequence parallelism;
  // parameters over the data-parallel ranks, and the unsplit ones over the tensor-parallel too.
  outputCounted_ = sp_ || g_.tpIndex == 0;
  for (const auto& [name, leaf] : params_) {
    initialParams_.push_back(leaf.detach().clone());
    counted_.push_back(g_.dpIndex == 0 && (tpDim(name) >= 0 || g_.tpIndex == 0));
  }
  const auto u = harness::profileUpdate(ctx.rank(), case_.training, params_, counted_);
  updatePeak_ = u.peak;
  stateBytes_ = u.stateBytes;
  if (peak < 0) return;
  // The replay starts from the one-step's state (the previous step's output, input gradient
  // and parameter gradients alive). A training step's steps start with the input gradient and
  // the parameter gradients of the step before (released at the step's start, as there), the
  // output already gone, the initial pieces and, after the first, the optimizer's state alive;
  // between backwards the update holds its profiled peak on top of the same.
  int64_t initial = 0, grads = 0;
  for (const auto& t : initialParams_) initial += static_cast<int64_t>(t.nbytes());
  grads = initial;
  const int64_t act = static_cast<int64_t>(x_.nbytes());
  const int64_t later = case_.training.steps > 1 ? stateBytes_ : 0;
  int64_t base = static_cast<int64_t>(x_.nbytes() + gradOut_.nbytes()) + initial;
  for (const auto& [name, leaf] : params_) base += static_cast<int64_t>(leaf.nbytes());
  const int64_t steady = base + grads + act;  // live between steps
  predicted_ = std::max(peak + initial + later, steady + updatePeak_);
}

void MegatronExecutor::trainSteps(RankContext& ctx) {
  results_.clear();
  loop_.reset();
  {
    const at::NoGradGuard noGrad;
    for (size_t i = 0; i < params_.size(); ++i) params_[i].second.copy_(initialParams_[i]);
  }
  loop_ = std::make_unique<reference::TrainingLoop>(case_.training, params_);
  auto& world = ctx.world();
  const bool shared = case_.meshSize() > 1;
  if (shared) harness::shareNormOver(*loop_, counted_, world);
  for (int k = 0; k < case_.training.steps; ++k) {
    x_.mutable_grad().reset();
    for (auto& [name, leaf] : params_) leaf.mutable_grad().reset();
    double loss = 0;
    {
      // The backward seeded with the target, d sum(output * target) / d output, as the
      // one-step backward is with grad_output; the loss from the output after it.
      if (k == 0) startCapture(ctx.rank());
      const at::Tensor out = forward();
      reference::backward({out}, {gradOut_});
      endCapture();
      at::Tensor local =
          outputCounted_ ? (out.detach() * gradOut_).sum() : at::zeros({}, out.options());
      if (shared) {
        const harness::CommSiteScope site("", harness::StepPhase::kUpdate);
        world.allReduce(local);
      }
      loss = local.item<double>();
    }
    loop_->update(loss);
  }
}

std::map<std::string, at::Tensor> MegatronExecutor::results() const {
  if (!loop_) return results_;
  std::map<std::string, at::Tensor> out;
  loop_->write(out);
  return out;
}

at::Tensor MegatronExecutor::dropout(const at::Tensor& t, int site) const {
  if (s_.dropout == 0) return t;
  // The mask of this rank's box of the [batch, seq, d_model] activation (the whole sequence
  // in tensor parallel, its shard in sequence parallel): the unsharded run's mask there.
  at::Tensor keep = reference::dropoutKeepMask(s_.activation(), actBox_.offset, actBox_.length,
                                               case_.seed + site, s_.dropout, t.scalar_type());
  keep.mul_(1.0 / (1.0 - s_.dropout));
  return t * keep;
}

// [b, t/n, d] sequence shards -> [b, t, d]; the gradient reduce-scattered back.
at::Tensor MegatronExecutor::gatherSeq(const at::Tensor& t) {
  const at::Tensor rows = t.transpose(0, 1).contiguous();  // [t/n, b, d]
  const std::vector<int64_t> counts(g_.tp, rows.size(0));
  return harness::allGatherFwdReduceScatterBwd(rows, *tp_, counts).transpose(0, 1);
}

// [b, t, d] partial sums -> this rank's [b, t/n, d] sequence shard of their total; the gradient
// all-gathered back. The planted fault all-reduces the whole and keeps its shard: the same
// numbers for twice the wire bytes.
at::Tensor MegatronExecutor::scatterSeq(const at::Tensor& t) {
  const at::Tensor rows = t.transpose(0, 1).contiguous();  // [t, b, d]
  const int64_t n = rows.size(0) / g_.tp;
  if (strategy_.fault() == "all_reduce_instead_of_reduce_scatter") {
    return harness::allReduceFwdAllReduceBwd(rows, *tp_)
        .narrow(0, g_.tpIndex * n, n)
        .transpose(0, 1);
  }
  const std::vector<int64_t> counts(g_.tp, n);
  return harness::reduceScatterFwdAllGatherBwd(rows, *tp_, counts).transpose(0, 1);
}

void MegatronExecutor::startCapture(int rank) {
  if (!captureOn_) return;
  tape_ = std::make_unique<harness::CaptureTape>();
  tape_->hookGradient("input", "input", x_, actBox_);
  for (const auto& [name, leaf] : params_) {
    tape_->hookGradient(name, name, leaf, strategy_.resultBox("grad/" + name, case_, rank));
  }
}

void MegatronExecutor::step(RankContext& ctx) {
  if (case_.training.enabled()) {
    trainSteps(ctx);
    return;
  }
  results_.clear();
  x_.mutable_grad().reset();
  for (auto& [name, leaf] : params_) leaf.mutable_grad().reset();
  startCapture(ctx.rank());
  const at::Tensor out = forward();
  reference::backward({out}, {gradOut_});
  endCapture();
  results_["output"] = out.detach();
  results_["grad_input"] = x_.grad();
  for (const auto& [name, leaf] : params_) results_["grad/" + name] = leaf.grad();
}

at::Tensor MegatronExecutor::forward() {
  std::map<std::string, at::Tensor> p;
  for (auto& [name, leaf] : params_) {
    Communicator* g = paramGroup_.at(name);
    // Its gradient's all-reduce is its module's, in the backward (comm_site.h).
    const harness::CommSiteScope site(blockModuleOf(name));
    p[name] = g ? harness::identityFwdAllReduceBwd(leaf, *g) : leaf;
  }
  const int64_t D = s_.dModel, heads = s_.heads / g_.tp;
  const bool skipG = strategy_.fault() == "skip_forward_all_reduce";
  // Megatron's f (identity, all-reduce of the gradient) and g (all-reduce, identity).
  const auto f = [&](const at::Tensor& t) {
    return sp_ ? gatherSeq(t) : harness::identityFwdAllReduceBwd(t, *tp_);
  };
  const auto g = [&](const at::Tensor& t) {
    if (sp_) return scatterSeq(t);
    return skipG ? t : harness::allReduceFwdIdentityBwd(t, *tp_);
  };
  at::Tensor out;
  {
    // tap(): the activations a capture keeps (the reference's blockForward names them alike).
    // The two modules name their collectives' site: attention's f and g, the MLP's.
    std::optional<harness::CommSiteScope> site(std::in_place, "attn");
    const at::Tensor h = tap(0, at::layer_norm(x_, {D}, p["ln_1.weight"], p["ln_1.bias"], 1e-5));
    const at::Tensor qkv = at::linear(f(h), p["attn.qkv.weight"], p["attn.qkv.bias"]);
    const at::Tensor att = reference::blockAttention(qkv, heads, s_.dHead(), s_.causal);
    const at::Tensor a = tap(1, g(at::linear(att, p["attn.proj.weight"])) + p["attn.proj.bias"]);
    const at::Tensor r = tap(2, x_ + dropout(a, 0));
    site.emplace("mlp");
    const at::Tensor h2 = tap(3, at::layer_norm(r, {D}, p["ln_2.weight"], p["ln_2.bias"], 1e-5));
    const at::Tensor u = at::gelu(at::linear(f(h2), p["mlp.fc.weight"], p["mlp.fc.bias"]));
    const at::Tensor m = tap(4, g(at::linear(u, p["mlp.proj.weight"])) + p["mlp.proj.bias"]);
    out = tap(5, r + dropout(m, 1));
  }
  p.clear();
  return out;
}

int64_t MegatronExecutor::modelPeak(RankContext&) const {
  BlockStepSizes sizes;
  sizes.backend = tp_->backendName();
  sizes.sequenceParallel = sp_;
  sizes.twoD = !g_.dpAxes.empty();
  sizes.tp = g_.tp;
  sizes.batchLocal = actBox_.length[0];
  sizes.seqLocal = actBox_.length[1];
  sizes.shape = s_;
  sizes.dtype = case_.dtype;
  // The replay starts from the previous step's state: the input, the seed of the backward,
  // the parameters, and the results it left (its output, input gradient, every gradient).
  int64_t base = x_.nbytes() + gradOut_.nbytes(), results = 2 * x_.nbytes();
  for (const auto& [name, leaf] : params_) {
    base += leaf.nbytes();
    results += leaf.nbytes();
  }
  return replayBlockStep(sizes, base + results).value_or(-1);
}

std::vector<std::unique_ptr<harness::Strategy>> registerMegatron() {
  std::vector<std::unique_ptr<harness::Strategy>> out;
  out.push_back(std::make_unique<MegatronStrategy>(false, ""));
  out.push_back(std::make_unique<MegatronStrategy>(true, ""));
  return out;
}

}  // namespace
}  // namespace sb::strategies

SB_REGISTER_STRATEGIES(sb::strategies::registerMegatron);
