// Sharded single operators: the strategy, its executor and its memory model (op_strategies.h).
//
// Memory: the executor's step is a short program whose allocations are known from the local
// shapes (ATen's CPU kernels allocate their outputs and a few documented temporaries; autograd
// keeps what each node saves; the backend's collectives add their scratch). predictedPeakBytes
// replays that program on a counter, per rank, in the order the step runs it: the prediction is
// checked against the tracking allocator's measured peak on every row.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <numeric>
#include <set>

#include "harness/autograd_comm.h"
#include "harness/registry.h"
#include "harness/suite.h"
#include "reference/autograd_engine.h"
#include "strategies/sharding/op_strategies.h"
#include "strategies/sharding/sharding_util.h"

namespace sb::strategies {
namespace {

using harness::Applicability;
using harness::Box;
using harness::CaseSpec;
using harness::Collective;
using harness::CommStats;
using harness::Communicator;
using harness::DeviceMesh;
using harness::Layout;
using harness::RankContext;
using reference::OpShape;
using Axes = std::vector<int>;

constexpr const char* kPrefix = "sharding/op/";
constexpr double kEps = 1e-5;

Axes sortedUnique(Axes a) {
  std::sort(a.begin(), a.end());
  a.erase(std::unique(a.begin(), a.end()), a.end());
  return a;
}

Axes usedAxes(const Layout& l) {
  Axes a = l.partialAxes();
  for (const auto& d : l.dimAxes()) a.insert(a.end(), d.begin(), d.end());
  return sortedUnique(a);
}

Axes minus(const Axes& a, const Axes& b) {
  Axes out;
  for (int x : a) {
    if (std::find(b.begin(), b.end(), x) == b.end()) out.push_back(x);
  }
  return out;
}

int64_t numelOf(const std::vector<int64_t>& s) {
  return std::accumulate(s.begin(), s.end(), int64_t{1}, std::multiplies<>());
}

// The input-to-output mapping of a view: groups of input dimensions whose product equals the
// product of a group of output dimensions, in order.
struct ViewGroup {
  std::vector<int> in, out;
};
std::vector<ViewGroup> viewGroups(const std::vector<int64_t>& in, const std::vector<int64_t>& out) {
  std::vector<ViewGroup> groups;
  size_t i = 0, o = 0;
  while (i < in.size() || o < out.size()) {
    ViewGroup g;
    int64_t pi = 1, po = 1;
    do {
      if (i < in.size() && (pi <= po || o >= out.size())) {
        pi *= in[i];
        g.in.push_back(static_cast<int>(i++));
      } else if (o < out.size()) {
        po *= out[o];
        g.out.push_back(static_cast<int>(o++));
      }
    } while ((pi != po || g.in.empty() || g.out.empty()) && (i < in.size() || o < out.size()));
    // Absorb trailing extents of 1 into this group.
    while (i < in.size() && in[i] == 1 && o >= out.size()) g.in.push_back(static_cast<int>(i++));
    while (o < out.size() && out[o] == 1 && i >= in.size()) g.out.push_back(static_cast<int>(o++));
    groups.push_back(g);
  }
  return groups;
}

// The output layout of a view of an input laid out as `in`, or a message naming the dimension
// whose shards the view would interleave. Per group, the input's shards must cover one
// contiguous block of the flattened group: every sharded dimension but the last has one index
// per rank (e.g. batch 2 over 2 ranks, heads split inside: [B, H] -> [B * H] sharded over both
// axes, outer first); the flattened block is then cut the same way into the output's
// dimensions.
std::string viewLayout(const std::vector<int64_t>& inShape, const std::vector<int64_t>& outShape,
                       const Layout& in, const harness::DeviceMesh& mesh, Layout& out) {
  std::vector<Axes> dims(outShape.size());
  for (const auto& g : viewGroups(inShape, outShape)) {
    Axes axes;
    int last = -1;
    for (size_t k = 0; k < g.in.size(); ++k) {
      if (!in.axesOf(g.in[k]).empty()) last = static_cast<int>(k);
    }
    for (int k = 0; k <= last; ++k) {
      const int d = g.in[k];
      const Axes& a = in.axesOf(d);
      const int64_t parts = mesh.groupSize(a);
      if (k < last && inShape[d] / parts != 1) {
        const int inner = g.in[last];
        return "view: dimension " + std::to_string(inner) + " of the input (size " +
               std::to_string(inShape[inner]) + ", sharded " + in.compact() +
               ") is split inside dimension " + std::to_string(d) + " (size " +
               std::to_string(inShape[d]) + ", " + std::to_string(inShape[d] / parts) +
               " indices per rank): the view interleaves its shards";
      }
      axes.insert(axes.end(), a.begin(), a.end());
    }
    // Cut the flattened block into the output dimensions, outermost first.
    size_t next = 0;
    for (size_t k = 0; k < g.out.size() && next < axes.size(); ++k) {
      const int d = g.out[k];
      int64_t rest = 1;
      for (size_t a = next; a < axes.size(); ++a) rest *= mesh.groupSize({axes[a]});
      if (outShape[d] % rest == 0) {  // the remaining axes all split this dimension
        dims[d].assign(axes.begin() + static_cast<long>(next), axes.end());
        next = axes.size();
        break;
      }
      int64_t taken = 1;
      size_t end = next;
      while (end < axes.size() && taken < outShape[d]) taken *= mesh.groupSize({axes[end++]});
      if (taken != outShape[d]) {
        return "view: the input's shards (" + in.compact() + ") do not cut output dimension " +
               std::to_string(d) + " (size " + std::to_string(outShape[d]) + ") evenly";
      }
      dims[d].assign(axes.begin() + static_cast<long>(next), axes.begin() + static_cast<long>(end));
      next = end;
    }
    if (next < axes.size()) {
      return "view: the input's shards (" + in.compact() +
             ") do not map to the output's dimensions";
    }
  }
  out = Layout(dims, {});
  return "";
}

using Resolved = ResolvedOp;

// Normalisation whose statistics span ranks: y = (x - mean) * rstd * w + b, with the mean and
// variance over `dims` of the whole tensor while each rank holds a piece of those dimensions
// (a layer norm over a split hidden dimension; a batch norm over a split batch, PyTorch's
// SyncBatchNorm). Forward: the sum, then the centred sum of squares, each all-reduced (two
// passes: no cancellation). Backward: the two sums the input gradient needs (of g = dy * w and
// of g * xhat), all-reduced together. Every buffer is allocated where the comments say, which
// the memory model (OpExecutor::modelPeak, splitNormModel) replays.
struct SplitNorm : torch::autograd::Function<SplitNorm> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const at::Tensor& w, const at::Tensor& b, Communicator* comm,
                            std::vector<int64_t> dims, std::vector<int64_t> paramView,
                            double count) {
    at::Tensor s = x.sum(dims, /*keepdim=*/true);  // R
    if (comm != nullptr) comm->allReduce(s);       // + scratch(R)
    s.div_(count);
    at::Tensor xhat = x - s;                       // X
    s.reset();                                     // - R
    at::Tensor v = (xhat * xhat).sum(dims, true);  // + X, + R, - X
    if (comm != nullptr) comm->allReduce(v);
    v.div_(count).add_(kEps).rsqrt_();  // rstd, in place
    xhat.mul_(v);
    at::Tensor y = at::addcmul(b.view(paramView), xhat, w.view(paramView));  // X
    ctx->save_for_backward({xhat, v, w});
    ctx->saved_data["comm"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(comm));
    ctx->saved_data["dims"] = dims;
    ctx->saved_data["view"] = paramView;
    ctx->saved_data["count"] = count;
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& xhat = saved[0];
    const at::Tensor& rstd = saved[1];
    const at::Tensor& w = saved[2];
    auto* comm =
        reinterpret_cast<Communicator*>(static_cast<intptr_t>(ctx->saved_data["comm"].toInt()));
    const auto dims = ctx->saved_data["dims"].toIntVector();
    const auto view = ctx->saved_data["view"].toIntVector();
    const double count = ctx->saved_data["count"].toDouble();
    const at::Tensor& dy = grads[0];
    // The sums over the statistics' dimensions that every rank needs whole, in one buffer.
    at::Tensor g = dy * w.view(view);  // X
    at::Tensor st = at::cat({g.sum(dims, true), (g * xhat).sum(dims, true)}, dims.back());
    if (comm != nullptr) comm->allReduce(st);  // + scratch(2R)
    st.div_(count);
    // dx = rstd * (g - mean(g) - xhat * mean(g * xhat))
    at::Tensor dx = xhat * st.narrow(dims.back(), 1, 1);  // X
    dx.add_(st.narrow(dims.back(), 0, 1)).neg_().add_(g).mul_(rstd);
    g.reset();
    st.reset();
    // The parameters' gradients over every dimension but theirs.
    // (`view` lines up with dy's trailing dimensions.)
    std::vector<int64_t> paramDims;
    const int64_t offset = dy.dim() - static_cast<int64_t>(view.size());
    for (int64_t d = 0; d < dy.dim(); ++d) {
      if (d < offset || view[d - offset] == 1) paramDims.push_back(d);
    }
    at::Tensor dw = (dy * xhat).sum(paramDims);  // + X, + W, - X
    at::Tensor db = dy.sum(paramDims);           // + W
    return {dx, dw, db, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// The axes over which operand i's gradient holds partial sums (see op_strategies.h).
Axes gradPartialOf(const OpStrategySpec& spec, const std::vector<Layout>& operands,
                   const std::vector<Layout>& outputs, size_t i) {
  // A bias is added after the pending sums are reduced: it meets only the output.
  if (spec.operands[i] == "bias") {
    Axes all;
    for (const auto& l : outputs) {
      for (const auto& d : l.dimAxes()) all.insert(all.end(), d.begin(), d.end());
    }
    return minus(sortedUnique(all), usedAxes(operands[i]));
  }
  Axes all;
  for (const auto& l : operands) {
    const Axes u = usedAxes(l);
    all.insert(all.end(), u.begin(), u.end());
  }
  for (const auto& l : outputs) {
    const Axes u = usedAxes(l);
    all.insert(all.end(), u.begin(), u.end());
  }
  return minus(sortedUnique(all), usedAxes(operands[i]));
}

class OpStrategy;

class OpExecutor final : public harness::RankExecutor {
 public:
  OpExecutor(const OpStrategy& s, const CaseSpec& c);
  void prepare(RankContext& ctx, const reference::WorkloadData& data) override;
  void step(RankContext& ctx) override;
  std::map<std::string, at::Tensor> results() const override { return results_; }
  std::optional<int64_t> predictedPeakBytes() const override { return predicted_; }

 private:
  int64_t modelPeak(RankContext& ctx) const;

  const OpStrategy& strategy_;
  const CaseSpec& case_;
  Resolved r_;
  std::vector<at::Tensor> leaves_, gradOut_;
  std::vector<Box> operandBoxes_, outputBoxes_;
  std::map<std::string, at::Tensor> results_;
  std::optional<int64_t> predicted_;
  int rank_ = 0;
};

class OpStrategy final : public harness::Strategy {
 public:
  OpStrategy(OpStrategySpec spec, std::string fault)
      : Strategy(kPrefix + spec.op + "/" + compactName(spec.name), spec.name,
                 harness::Family::kSharding),
        spec_(std::move(spec)),
        fault_(std::move(fault)) {}

  const OpStrategySpec& spec() const { return spec_; }
  const std::string& fault() const { return fault_; }

  std::vector<std::string> plantableFaults() const override {
    std::vector<std::string> f;
    bool partialOut = false;
    for (const auto& l : spec_.outputLayouts) partialOut |= !l.partialAxes().empty();
    if (partialOut) f.push_back("skip_output_all_reduce");
    if (spec_.op == "layer_norm" && spec_.variant == "hidden") f.push_back("skip_stats_all_reduce");
    if (spec_.op == "batch_norm" && spec_.variant == "sync") f.push_back("skip_stats_all_reduce");
    if (spec_.variant == "vocab") f.push_back("skip_vocab_mask");
    if (spec_.op == "softmax" && usedAxes(spec_.operandLayouts[0]).size() > 0) {
      f.push_back("softmax_over_sharded_dim");
    }
    if (spec_.op == "bmm" && !spec_.operandLayouts[1].axesOf(0).empty()) {
      f.push_back("batch_split_one_operand");
    }
    if (spec_.op == "dropout") f.push_back("per_rank_dropout_seed");
    for (size_t i = 0; i < spec_.operands.size(); ++i) {
      if (!gradPartialOf(spec_, spec_.operandLayouts, spec_.outputLayouts, i).empty() &&
          !(spec_.op == "embedding" && i == 0)) {
        f.push_back("skip_grad_all_reduce");
        break;
      }
    }
    return f;
  }
  std::unique_ptr<harness::Strategy> withPlantedFault(const std::string& name) const override {
    const auto f = plantableFaults();
    if (std::find(f.begin(), f.end(), name) == f.end()) return nullptr;
    OpStrategySpec sp = spec_;
    // The softmax dimension sharded over the strategy's first axis (resolve() moves it there):
    // each rank normalises over its piece of the dimension only.
    if (name == "softmax_over_sharded_dim") sp.variant = "fault_softmax";
    return std::make_unique<OpStrategy>(sp, name);
  }

  std::vector<std::pair<std::string, std::string>> params() const override {
    std::string meshes;
    for (int d : spec_.meshDims) meshes += (meshes.empty() ? "" : ",") + std::to_string(d) + "-D";
    return {{"op", spec_.op}, {"set", spec_.set}, {"meshes", meshes}};
  }

  nlohmann::json sequences(const Resolved& r) const {
    nlohmann::json j = nlohmann::json::object();
    for (size_t i = 0; i < spec_.operands.size(); ++i) {
      j[spec_.operands[i]] = r.operands[i].sequence();
    }
    const auto names = r.shape.outputNames();
    for (size_t i = 0; i < names.size() && i < r.outputs.size(); ++i) {
      j[names[i]] = r.outputs[i].sequence();
    }
    return j;
  }

  nlohmann::json commJson(const Resolved& r) const {
    nlohmann::json actions = nlohmann::json::array();
    for (size_t i = 0; i < r.outputs.size(); ++i) {
      if (r.outputs[i].partialAxes().empty()) continue;
      actions.push_back(
          {{"phase", "forward"},
           {"collective", "all_reduce"},
           {"operand", r.shape.outputNames()[i]},
           {"mesh_axes", r.outputs[i].partialAxes()},
           {"why", spec_.variant == "vocab" ? "each rank looks up its vocabulary rows only"
                                            : "partial sums of a split reduction"}});
    }
    if (!r.statAxes.empty()) {
      for (const auto& [phase, what] : std::vector<std::pair<const char*, const char*>>{
               {"forward", "sum"},
               {"forward", "centred sum of squares"},
               {"backward", "sums of dy*w and dy*w*xhat"}}) {
        actions.push_back({{"phase", phase},
                           {"collective", "all_reduce"},
                           {"operand", what},
                           {"mesh_axes", r.statAxes},
                           {"why", "statistics over a split dimension"}});
      }
    }
    for (size_t i = 0; i < r.gradPartial.size(); ++i) {
      if (r.gradPartial[i].empty()) continue;
      actions.push_back({{"phase", "backward"},
                         {"collective", "all_reduce"},
                         {"operand", "grad_" + spec_.operands[i]},
                         {"mesh_axes", r.gradPartial[i]},
                         {"why", "replicated over axes whose ranks compute different parts"}});
    }
    return actions;
  }

  Resolved resolve(const CaseSpec& c) const {
    return resolveOp(spec_, OpShape::parse(c.shape), c.mesh);
  }

  nlohmann::json describe() const override {
    nlohmann::json seqs = nlohmann::json::object();
    for (size_t i = 0; i < spec_.operands.size(); ++i) {
      seqs[spec_.operands[i]] = spec_.operandLayouts[i].sequence();
    }
    if (!spec_.outputFromShape) {
      for (size_t i = 0; i < spec_.outputLayouts.size(); ++i) {
        seqs[spec_.outputLayouts.size() == 1 ? "output" : "output" + std::to_string(i)] =
            spec_.outputLayouts[i].sequence();
      }
    }
    nlohmann::json ranks = nlohmann::json::object();
    for (size_t i = 0; i < spec_.operands.size(); ++i)
      ranks[spec_.operands[i]] = spec_.operandRanks[i];
    return {{"op", spec_.op},
            {"set", spec_.set},
            {"variant", spec_.variant},
            {"sharding_sequences", seqs},
            {"operand_ranks", ranks}};
  }

  nlohmann::json caseDetails(const CaseSpec& c) const override {
    const Resolved r = resolve(c);
    return {{"sharding_sequences", sequences(r)}, {"communication", commJson(r)}};
  }

  Applicability applies(const CaseSpec& c) const override {
    if (c.workload != "op") return Applicability::notApplicable("not an op workload");
    const OpShape s = OpShape::parse(c.shape);
    if (s.op != spec_.op) return Applicability::notApplicable("another operator");
    if (s.operands() != spec_.operands) {
      return Applicability::notApplicable("generated for other operands");
    }
    if (const std::string why = opNotApplicable(spec_, s, c.mesh); !why.empty()) {
      return Applicability::notApplicable(why);
    }
    const Resolved r = resolve(c);
    if (!r.problem.empty()) return Applicability::unsupported(r.problem);
    return Applicability::yes();
  }

  std::unique_ptr<harness::RankExecutor> makeExecutor(const CaseSpec& c) const override {
    return std::make_unique<OpExecutor>(*this, c);
  }

  Box resultBox(const std::string& tensor, const CaseSpec& c, int rank) const override {
    const Resolved r = resolve(c);
    const DeviceMesh mesh(c.mesh);
    const auto coords = mesh.coords(rank);
    const auto outs = r.shape.outputs();
    const auto names = r.shape.outputNames();
    for (size_t i = 0; i < names.size(); ++i) {
      if (tensor == names[i]) return r.outputs[i].box(outs[i], c.mesh, coords);
    }
    for (size_t i = 0; i < spec_.operands.size(); ++i) {
      if (tensor == "grad_" + spec_.operands[i]) {
        return r.operands[i].box(r.shape.operandShape(spec_.operands[i]), c.mesh, coords);
      }
    }
    TORCH_INTERNAL_ASSERT(false, "no layout for tensor ", tensor);
  }

  // What the strategy's layouts require, whatever fault is planted: a fault that skips a
  // collective fails on the count as well as on the numbers.
  std::vector<std::pair<std::vector<int>, CommStats>> predictCommByGroup(const CaseSpec& c,
                                                                         int rank) const override {
    return opCommByGroup(resolve(c), c.mesh, rank, c.dtype);
  }
  std::optional<double> predictFlops(const CaseSpec& c, int rank) const override {
    return opFlops(resolve(c), c.mesh, rank);
  }
  std::optional<harness::LocalWork> predictLocalWork(const CaseSpec& c, int rank) const override {
    return opLocalWork(resolve(c), c.mesh, rank, c.dtype);
  }

  CommStats predictComm(const CaseSpec& c, int rank) const override {
    return totalComm(predictCommByGroup(c, rank));
  }

  harness::Tolerance tolerance(const std::string& tensor, const CaseSpec& c,
                               const at::Tensor& expected) const override {
    // A tensor whose computation sums partial results of ranks (a split contraction, split
    // statistics, a gradient all-reduced over ranks) adds in another order than the reference:
    // bounded by the longest sum the operator does.
    const harness::Tolerance base = Strategy::tolerance(tensor, c, expected);
    const Resolved r = resolve(c);
    const DeviceMesh mesh(c.mesh);
    int64_t parts = 1;
    const auto names = r.shape.outputNames();
    for (size_t i = 0; i < names.size(); ++i) {
      if (tensor == names[i]) parts = mesh.groupSize(r.outputs[i].partialAxes());
    }
    for (size_t i = 0; i < spec_.operands.size(); ++i) {
      if (tensor == "grad_" + spec_.operands[i]) parts = mesh.groupSize(r.gradPartial[i]);
    }
    if (!r.statAxes.empty()) parts = std::max(parts, mesh.groupSize(r.statAxes));
    int64_t length = 1;
    for (const auto& n : spec_.operands)
      length = std::max(length, numelOf(r.shape.operandShape(n)));
    for (const auto& o : r.shape.outputs()) length = std::max(length, numelOf(o));
    return harness::splitReductionTolerance(base, c.dtype, length, parts, expected);
  }

 private:
  OpStrategySpec spec_;
  std::string fault_;
};

OpExecutor::OpExecutor(const OpStrategy& s, const CaseSpec& c) : strategy_(s), case_(c) {}

void OpExecutor::prepare(RankContext& ctx, const reference::WorkloadData& data) {
  r_ = strategy_.resolve(case_);
  rank_ = ctx.rank();
  const auto coords = ctx.mesh().coords(ctx.rank());
  const auto& names = strategy_.spec().operands;
  for (size_t i = 0; i < names.size(); ++i) {
    const auto& shape = r_.shape.operandShape(names[i]);
    Box box = r_.operands[i].box(shape, case_.mesh, coords);
    operandBoxes_.push_back(box);
    if (strategy_.fault() == "batch_split_one_operand" && names[i] == "other") {
      box.offset[0] = 0;  // the batch split on the input only: every rank takes the first batches
    }
    at::Tensor t = harness::sliceBox(data.inputs.at(names[i]), box).clone();
    if (r_.shape.differentiable(names[i])) t.set_requires_grad(true);
    leaves_.push_back(t);
  }
  const auto outs = r_.shape.outputs();
  const auto outNames = r_.shape.outputNames();
  for (size_t i = 0; i < outs.size(); ++i) {
    const Box box = r_.outputs[i].box(outs[i], case_.mesh, coords);
    outputBoxes_.push_back(box);
    gradOut_.push_back(harness::sliceBox(data.inputs.at("grad_" + outNames[i]), box).clone());
  }
  predicted_ = modelPeak(ctx);
}

void OpExecutor::step(RankContext& ctx) {
  results_.clear();
  for (auto& l : leaves_) {
    if (l.requires_grad()) l.mutable_grad().reset();
  }
  std::vector<at::Tensor> outs = runOp(r_, ctx, leaves_, case_.seed, strategy_.fault());
  reference::backward(outs, gradOut_);
  const auto names = r_.shape.outputNames();
  for (size_t i = 0; i < outs.size(); ++i) results_[names[i]] = outs[i].detach();
  for (size_t i = 0; i < leaves_.size(); ++i) {
    if (leaves_[i].requires_grad())
      results_["grad_" + strategy_.spec().operands[i]] = leaves_[i].grad();
  }
}

// The allocation replay (see the file comment): bytes above the step's start, where the
// prepared operands and gradient seeds are alive.
struct Counter {
  int64_t current = 0, peak = 0;
  void alloc(int64_t b) {
    current += b;
    peak = std::max(peak, current);
  }
  void release(int64_t b) { current -= b; }
};

int64_t OpExecutor::modelPeak(RankContext& ctx) const {
  const OpShape& s = r_.shape;
  const std::string& op = s.op;
  const std::string& fault = strategy_.fault();
  const int64_t es = c10::elementSize(case_.dtype);
  // CPU kernels keep statistics in the accumulation type: float for float and the 16-bit types.
  const int64_t statEs = case_.dtype == at::kDouble ? 8 : 4;
  int64_t base = 0;
  for (const auto& l : leaves_) base += l.nbytes();
  for (const auto& g : gradOut_) base += g.nbytes();
  const int64_t X = leaves_[0].nbytes();
  const int64_t n = leaves_[0].numel();
  int64_t O = 0;
  for (const Box& b : outputBoxes_) O += b.numel() * es;
  std::vector<int64_t> g(leaves_.size(), 0);
  int64_t sumG = 0;
  for (size_t i = 0; i < leaves_.size(); ++i) {
    if (leaves_[i].requires_grad()) sumG += g[i] = leaves_[i].nbytes();
  }
  const auto scratch = [&](const Axes& axes, int64_t b) {
    return ctx.mesh().groupSize(axes) > 1
               ? ctx.group(axes).scratchBytes(Collective::kAllReduce, b, b, case_.dtype)
               : 0;
  };
  Counter m;
  // The previous step's results are alive when the window opens and are dropped first: its
  // outputs (views of the input for view, permute, transpose and split) and gradients (for
  // view, a view of the gradient seed).
  const bool viewOut = op == "view" || op == "permute" || op == "transpose" || op == "split";
  const int64_t previous = (viewOut ? 0 : O) + (op == "view" ? 0 : sumG);
  m.alloc(previous);
  m.release(previous);

  // A partial output's all-reduce: a copy, reduced through the backend's scratch; the local
  // result is a temporary that goes when the reduction returns.
  const Axes& outPartial = r_.outputs[0].partialAxes();
  const bool reduces = !outPartial.empty() && fault != "skip_output_all_reduce";
  const auto reduceCopy = [&] {
    if (!reduces) return;
    m.alloc(O);
    m.alloc(scratch(outPartial, O));
    m.release(scratch(outPartial, O));
    m.release(O);
  };
  // After the operator's backward node: each partial gradient is all-reduced through a copy,
  // which replaces it.
  const auto gradAllReduces = [&] {
    if (fault == "skip_grad_all_reduce") return;
    for (size_t i = 0; i < leaves_.size(); ++i) {
      if (g[i] == 0 || r_.gradPartial[i].empty()) continue;
      const int64_t sc = scratch(r_.gradPartial[i], g[i]);
      m.alloc(g[i] + sc);
      m.release(g[i] + sc);
    }
  };

  // conv2d's im2col columns, [N, C_in * k * k, out_h * out_w]: in the forward and again in the
  // backward, which recomputes them.
  int64_t columns = 0;
  if (op == "conv2d") {
    const int64_t k = s.kernel();
    columns = leaves_[0].size(0) * leaves_[0].size(1) * k * k * outputBoxes_[0].length[2] *
              outputBoxes_[0].length[3] * es;
  }
  if (op == "addmm" || op == "conv2d") {
    m.alloc(columns);
    m.alloc(O);
    m.release(columns);
    m.release(O);
    if (!reduces) {
      m.alloc(O);
    } else {
      // (product, reduced copy) + bias: the product lives to the end of the expression.
      m.alloc(O);
      m.alloc(O);
      m.alloc(scratch(outPartial, O));
      m.release(scratch(outPartial, O));
      m.alloc(O);
      m.release(2 * O);
    }
    m.alloc(sumG);
    m.alloc(columns);
    m.release(columns);
    gradAllReduces();
  } else if (op == "bmm" || op == "matmul" || op == "sum") {
    m.alloc(O);
    reduceCopy();
    m.alloc(sumG);  // sum: the expanded gradient, copied into the leaf's layout
    gradAllReduces();
  } else if (op == "embedding" && strategy_.spec().variant == "vocab") {
    const int64_t ids1 = n, ids8 = n * 8;
    if (fault == "skip_vocab_mask") {
      m.alloc(2 * ids8);  // (ids - v0), clamped
      m.release(ids8);
      m.alloc(O);
      reduceCopy();
      m.alloc(g[1]);
      m.release(ids8);
    } else {
      m.alloc(3 * ids1);  // the two comparisons and their union
      m.release(2 * ids1);
      m.alloc(ids8);  // the local ids
      m.alloc(O);     // the lookup, masked in place
      if (reduces) {
        m.alloc(O);
        m.alloc(scratch(outPartial, O));
        m.release(scratch(outPartial, O));
        m.release(O);
      }
      // Backward: the masked gradient, the mask released, the weight's gradient, the masked
      // gradient and the local ids released.
      m.alloc(O);
      m.release(ids1);
      m.alloc(g[1]);
      m.release(O);
      m.release(ids8);
    }
    gradAllReduces();
  } else if (op == "embedding") {
    m.alloc(O);
    m.alloc(g[1]);  // a zeroed table, rows added
    gradAllReduces();
  } else if (op == "layer_norm" && r_.statAxes.empty() && strategy_.spec().variant != "hidden") {
    const int64_t rows = n / std::max<int64_t>(1, leaves_[0].size(-1));
    const int64_t R = rows * es;
    // The kernel's per-thread buffer for the weight and bias gradients.
    const int64_t buffer = 2 * at::get_num_threads() * leaves_[0].size(-1) * es;
    m.alloc(O + 2 * R);
    m.alloc(sumG + buffer);
    m.release(buffer + 2 * R);
    gradAllReduces();
  } else if (op == "layer_norm" || (op == "batch_norm" && strategy_.spec().variant == "sync")) {
    // SplitNorm, as its comments list its buffers.
    const at::Tensor& x = leaves_[0];
    int64_t R = 0, W = 0;
    if (op == "layer_norm") {
      R = x.numel() / std::max<int64_t>(1, x.size(-1)) * es;
      W = x.size(-1) * es;
    } else {
      R = W = x.size(1) * es;
    }
    Communicator* comm = nullptr;
    if (!r_.statAxes.empty() && fault != "skip_stats_all_reduce") comm = &ctx.group(r_.statAxes);
    const auto sc = [&](int64_t b) { return comm ? scratch(r_.statAxes, b) : 0; };
    m.alloc(R);  // sum
    m.alloc(sc(R));
    m.release(sc(R));
    m.alloc(X);  // xhat
    m.release(R);
    m.alloc(X);  // squares
    m.alloc(R);  // their sum: rstd
    m.release(X);
    m.alloc(sc(R));
    m.release(sc(R));
    m.alloc(O);  // y
    // Backward.
    m.alloc(X);          // g
    m.alloc(R + X + R);  // sum(g), g * xhat, its sum
    m.alloc(2 * R);      // cat
    m.release(R + X + R);
    m.alloc(sc(2 * R));
    m.release(sc(2 * R));
    m.alloc(X);  // dx
    m.release(X + 2 * R);
    m.alloc(X + W);  // dy * xhat, its sum
    m.release(X);
    m.alloc(W);        // db
    m.release(X + R);  // the saved xhat and rstd
    gradAllReduces();
  } else if (op == "batch_norm") {
    const int64_t C = leaves_[0].size(1) * statEs;
    m.alloc(4 * C);  // saved mean and inverse deviation, and two temporaries
    m.release(2 * C);
    m.alloc(O);
    m.alloc(2 * C);
    m.release(2 * C);
    m.alloc(sumG);
    m.alloc(X);  // a temporary of the input's size
    m.release(X + 2 * C);
    gradAllReduces();
  } else if (op == "max_pool2d") {
    const int64_t indices = outputBoxes_[0].numel() * 8;
    m.alloc(O + indices);
    m.alloc(sumG);
    m.release(indices);
  } else if (op == "add" || op == "mul") {
    m.alloc(O);
    for (size_t i = 0; i < leaves_.size(); ++i) {
      const bool broadcast = leaves_[i].numel() != outputBoxes_[0].numel();
      if (op == "mul" && broadcast) {
        m.alloc(O);  // the full product, then summed to the operand's shape
        m.alloc(g[i]);
        m.release(O);
      } else {
        m.alloc(g[i]);
      }
    }
    gradAllReduces();
  } else if (op == "dropout") {
    // The mask: two int64 tensors of the shard's size and a scalar at most, then the mask.
    m.alloc(16 * n + 8);
    m.release(16 * n + 8);
    m.alloc(n * es);  // the scaled mask, saved
    m.alloc(O);
    m.alloc(sumG);
  } else if (op == "view") {
    // A view forward; the gradient a view of the seed.
  } else if (op == "split") {
    m.alloc(X);  // the gradients concatenated
  } else {       // gelu, relu, softmax, permute, transpose: the output, then the input's gradient
    if (!viewOut) m.alloc(O);
    m.alloc(sumG);
  }
  return base + m.peak;
}

}  // namespace

std::unique_ptr<harness::Strategy> makeOpStrategy(const OpStrategySpec& spec,
                                                  const std::string& fault) {
  return std::make_unique<OpStrategy>(spec, fault);
}

std::vector<Layout> ResolvedOp::reducedOutputs() const {
  std::vector<Layout> out;
  for (const auto& l : outputs) out.emplace_back(l.dimAxes(), std::vector<int>{});
  return out;
}

ResolvedOp resolveOp(const OpStrategySpec& spec, const OpShape& shape,
                     const std::vector<int64_t>& meshShape) {
  Resolved r;
  r.spec = spec;
  r.shape = shape;
  // The layouts for the case's shape: the generator's strategy of this name for it (names
  // that do not spell every dimension, such as an embedding's "RR = R x S0R", stand for one
  // strategy on ids of any rank).
  r.operands = spec.operandLayouts;
  r.outputs = spec.outputLayouts;
  for (const auto& sp : opStrategySpecs(r.shape)) {
    if (sp.name == spec.name) {
      r.operands = sp.operandLayouts;
      r.outputs = sp.outputLayouts;
      break;
    }
  }
  const DeviceMesh mesh(meshShape);
  if (spec.outputFromShape) {  // view: map each input dimension's shards to the output
    Layout out;
    r.problem = viewLayout(r.shape.input, r.shape.outputs()[0], r.operands[0], mesh, out);
    if (!r.problem.empty()) return r;
    r.outputs = {out};
  }
  if (spec.variant == "fault_softmax") {
    // Shard the softmax dimension over the strategy's first axis instead of its own dim.
    const int sd = static_cast<int>(r.shape.reducedDims()[0]);
    const int axis = usedAxes(r.operands[0])[0];
    auto dims = r.operands[0].dimAxes();
    for (auto& d : dims) d.erase(std::remove(d.begin(), d.end(), axis), d.end());
    dims[sd].push_back(axis);
    r.operands = {Layout(dims, {})};
    r.outputs = {Layout(dims, {})};
  }
  for (size_t i = 0; i < r.operands.size(); ++i) {
    r.gradPartial.push_back(r.shape.differentiable(spec.operands[i])
                                ? gradPartialOf(spec, r.operands, r.outputs, i)
                                : Axes{});
  }
  if (spec.variant == "hidden") r.statAxes = r.operands[0].axesOf(r.operands[0].ndim() - 1);
  if (spec.variant == "sync") r.statAxes = r.operands[0].axesOf(0);
  // Even shards, as ColossalAI requires; name the first dimension that does not divide.
  const auto check = [&](const std::string& what, const Layout& l,
                         const std::vector<int64_t>& shape) {
    for (int d = 0; d < l.ndim() && r.problem.empty(); ++d) {
      const int64_t parts = mesh.groupSize(l.axesOf(d));
      if (parts > 1 && shape[d] % parts != 0) {
        r.problem = what + " dimension " + std::to_string(d) + " (size " +
                    std::to_string(shape[d]) + ") does not divide evenly over mesh axes " +
                    Layout(std::vector<Axes>{l.axesOf(d)}, {}).compact() + " (" +
                    std::to_string(parts) + " ranks)";
      }
    }
  };
  for (size_t i = 0; i < r.operands.size(); ++i) {
    check(spec.operands[i], r.operands[i], r.shape.operandShape(spec.operands[i]));
  }
  const auto outs = r.shape.outputs();
  const auto names = r.shape.outputNames();
  for (size_t i = 0; i < r.outputs.size() && i < outs.size(); ++i) {
    check(names[i], r.outputs[i], outs[i]);
  }
  return r;
}

std::string opNotApplicable(const OpStrategySpec& spec, const OpShape& s,
                            const std::vector<int64_t>& mesh) {
  // The generator's strategies for this shape: one of this name, or this is not one of them.
  const auto mine = opStrategySpecs(s);
  if (std::none_of(mine.begin(), mine.end(),
                   [&](const OpStrategySpec& o) { return o.name == spec.name; })) {
    return "not generated for this shape";
  }
  const int meshNdim = static_cast<int>(mesh.size());
  if (std::find(spec.meshDims.begin(), spec.meshDims.end(), meshNdim) == spec.meshDims.end()) {
    return "not generated for a " + std::to_string(meshNdim) + "-D mesh";
  }
  if (meshNdim == 2 && spec.degenerateAxis >= 0) {
    const int other = 1 - spec.degenerateAxis;
    if (mesh[other] != 1 || mesh[spec.degenerateAxis] == 1) {
      return "for a 2-D mesh with one axis of extent 1";
    }
  }
  if (meshNdim == 1 && spec.degenerateAxis > 0) return "for a 2-D mesh with one axis of extent 1";
  if (spec.meshMustBeFull &&
      std::any_of(mesh.begin(), mesh.end(), [](int64_t e) { return e == 1; })) {
    return "for a 2-D mesh without axes of extent 1";
  }
  return "";
}

namespace {
// The statistics one rank all-reduces: a layer norm's one per row, a batch norm's one per
// channel.
int64_t statNumel(const Resolved& r, const std::vector<int64_t>& mesh,
                  const std::vector<int64_t>& coords) {
  const Box in = r.operands[0].box(r.shape.input, mesh, coords);
  if (r.shape.op == "layer_norm") return in.numel() / in.length.back();
  return in.length[1];
}
}  // namespace

std::vector<std::pair<std::vector<int>, CommStats>> opCommByGroup(
    const ResolvedOp& r, const std::vector<int64_t>& meshShape, int rank, at::ScalarType dtype) {
  const DeviceMesh mesh(meshShape);
  const auto coords = mesh.coords(rank);
  const int64_t es = c10::elementSize(dtype);
  std::vector<std::pair<std::vector<int>, CommStats>> out;
  const auto allReduce = [&](const Axes& axes, int64_t numel) {
    CommStats st;
    st.add(Collective::kAllReduce, mesh.groupSize(axes) > 1 ? numel * es : 0);
    out.emplace_back(axes, st);
  };
  const auto outs = r.shape.outputs();
  for (size_t i = 0; i < r.outputs.size(); ++i) {
    if (!r.outputs[i].partialAxes().empty()) {
      allReduce(r.outputs[i].partialAxes(), r.outputs[i].box(outs[i], meshShape, coords).numel());
    }
  }
  if (!r.statAxes.empty()) {
    const int64_t stats = statNumel(r, meshShape, coords);
    allReduce(r.statAxes, stats);      // forward: the sum
    allReduce(r.statAxes, stats);      // forward: the centred sum of squares
    allReduce(r.statAxes, 2 * stats);  // backward: both sums of the input gradient
  }
  for (size_t i = 0; i < r.gradPartial.size(); ++i) {
    if (r.gradPartial[i].empty()) continue;
    allReduce(
        r.gradPartial[i],
        r.operands[i].box(r.shape.operandShape(r.spec.operands[i]), meshShape, coords).numel());
  }
  return out;
}

// Floating-point operations of this rank's products, forward and backward (three products
// each of 2 x the local contraction): addmm, bmm, matmul and conv2d; none for the rest.
double opFlops(const ResolvedOp& r, const std::vector<int64_t>& mesh, int rank) {
  const auto coords = DeviceMesh(mesh).coords(rank);
  const auto box = [&](size_t i) {
    return r.operands[i].box(r.shape.operandShape(r.spec.operands[i]), mesh, coords);
  };
  const std::string& op = r.shape.op;
  if (op == "addmm" || op == "bmm" || op == "matmul") {
    const Box a = box(0), b = box(1);
    // input [.., M, K] x other [.., K, N] (matmul: [M, K] x [K] or [K] x [K])
    const double n = op == "matmul" ? 1.0 : static_cast<double>(b.length.back());
    return 6.0 * static_cast<double>(a.numel()) * n;
  }
  if (op == "conv2d") {
    const Box out = r.outputs[0].box(r.shape.outputs()[0], mesh, coords);
    const Box w = box(1);
    return 6.0 * static_cast<double>(out.numel()) * static_cast<double>(w.numel() / w.length[0]);
  }
  return 0.0;
}

// The memory traffic of the element-wise and reduction kernels, priced by the profile's copy
// fit: forward, the operands read and the outputs written; backward, the gradient seeds and
// saved operands read and the gradients written. A kernel per operand and output each way.
harness::LocalWork opLocalWork(const ResolvedOp& r, const std::vector<int64_t>& mesh, int rank,
                               at::ScalarType dtype) {
  const auto coords = DeviceMesh(mesh).coords(rank);
  const int64_t es = c10::elementSize(dtype);
  int64_t operands = 0, outputs = 0, grads = 0;
  for (size_t i = 0; i < r.spec.operands.size(); ++i) {
    const int64_t b =
        r.operands[i].box(r.shape.operandShape(r.spec.operands[i]), mesh, coords).numel() * es;
    operands += b;
    if (r.shape.differentiable(r.spec.operands[i])) grads += b;
  }
  const auto outs = r.shape.outputs();
  for (size_t i = 0; i < outs.size(); ++i) {
    outputs += r.outputs[i].box(outs[i], mesh, coords).numel() * es;
  }
  harness::LocalWork w;
  w.copies = 2 * static_cast<int64_t>(r.spec.operands.size() + outs.size());
  w.bytes = 2 * operands + 2 * outputs + grads;
  return w;
}

namespace {

std::vector<at::Tensor> forwardLocal(const Resolved& r_, RankContext& ctx,
                                     const std::vector<at::Tensor>& in, uint64_t seed0,
                                     const std::string& fault) {
  const OpShape& s = r_.shape;
  const std::string& op = s.op;
  const auto reduce = [&](const at::Tensor& y, size_t out = 0) {
    const Axes& p = r_.outputs[out].partialAxes();
    if (p.empty() || fault == "skip_output_all_reduce") return y;
    return harness::allReduceFwdIdentityBwd(y, ctx.group(p));
  };
  // The statistics' group, or none when the planted fault skips their all-reduce.
  Communicator* statComm =
      r_.statAxes.empty() || fault == "skip_stats_all_reduce" ? nullptr : &ctx.group(r_.statAxes);
  const auto coords = ctx.mesh().coords(ctx.rank());
  const std::vector<int64_t> mesh = ctx.mesh().shape();
  const auto operandBox = [&](size_t i) {
    return r_.operands[i].box(s.operandShape(r_.spec.operands[i]), mesh, coords);
  };
  const at::Tensor& x = in[0];
  if (op == "addmm") {
    if (r_.outputs[0].partialAxes().empty()) return {at::addmm(in[2], x, in[1])};
    return {reduce(at::mm(x, in[1])) + in[2]};  // the bias once, after the sum
  }
  if (op == "conv2d") {
    // ATen's native im2col convolution (thnn_conv2d), not oneDNN's: its buffers are a function
    // of the shapes alone, where oneDNN's blocked reorders pad channels to the CPU's vector
    // width. The reference runs at::conv2d; the results agree to the dtype's tolerance.
    const int64_t st = s.stride(), p = s.padding(), k = s.kernel();
    if (r_.outputs[0].partialAxes().empty()) {
      return {at::thnn_conv2d(x, in[1], {k, k}, in[2], {st, st}, {p, p})};
    }
    return {reduce(at::thnn_conv2d(x, in[1], {k, k}, {}, {st, st}, {p, p})) +
            in[2].view({1, -1, 1, 1})};
  }
  if (op == "bmm") return {reduce(at::bmm(x, in[1]))};
  if (op == "matmul") return {reduce(at::matmul(x, in[1]))};
  if (op == "embedding") {
    if (r_.spec.variant != "vocab") return {at::embedding(in[1], x)};
    // This rank holds rows [v0, v0 + n) of the table: ids outside them look up row 0 and are
    // zeroed, and the all-reduce adds the one rank's row that holds each id.
    const Box table = operandBox(1);
    const int64_t v0 = table.offset[0], n = table.length[0];
    if (fault == "skip_vocab_mask") return {reduce(at::embedding(in[1], (x - v0).clamp(0, n - 1)))};
    const at::Tensor foreign = at::logical_or(x < v0, x >= v0 + n);
    const at::Tensor local = (x - v0).masked_fill_(foreign, 0);
    return {reduce(at::embedding(in[1], local).masked_fill_(foreign.unsqueeze(-1), 0))};
  }
  if (op == "layer_norm") {
    if (r_.spec.variant != "hidden") {
      return {at::layer_norm(x, {x.size(-1)}, in[1], in[2], kEps)};
    }
    // Statistics over the whole hidden dimension; with the planted fault, over this rank's
    // piece only.
    const double h = static_cast<double>(statComm ? s.input.back() : x.size(-1));
    return {SplitNorm::apply(x, in[1], in[2], statComm, std::vector<int64_t>{x.dim() - 1},
                             std::vector<int64_t>{x.size(-1)}, h)};
  }
  if (op == "batch_norm") {
    if (r_.spec.variant != "sync") {
      return {at::batch_norm(x, in[1], in[2], {}, {}, true, 0.1, kEps, false)};
    }
    // Synchronised statistics over the whole batch (every dimension but the channels).
    std::vector<int64_t> dims = {0}, view(x.dim(), 1);
    for (int64_t d = 2; d < x.dim(); ++d) dims.push_back(d);
    view[1] = x.size(1);
    const int64_t perSample = x.numel() / std::max<int64_t>(1, x.size(0) * x.size(1));
    const double count = static_cast<double>((statComm ? s.input[0] : x.size(0)) * perSample);
    return {SplitNorm::apply(x, in[1], in[2], statComm, dims, view, count)};
  }
  if (op == "dropout") {
    const double p = s.attrDouble("p");
    const uint64_t seed =
        fault == "per_rank_dropout_seed" ? seed0 + 1 + static_cast<uint64_t>(ctx.rank()) : seed0;
    const Box box = operandBox(0);
    at::Tensor keep =
        reference::dropoutKeepMask(s.input, box.offset, box.length, seed, p, x.scalar_type());
    keep.mul_(1.0 / (1.0 - p));
    return {x * keep};
  }
  if (op == "view") return {x.reshape(r_.outputs[0].box(s.outputs()[0], mesh, coords).length)};
  if (op == "softmax") {
    // The causal mask needs the rows' place in the whole tensor (the softmax dimension, the
    // last, is never split).
    const int64_t rows = x.dim() >= 2 ? operandBox(0).offset[x.dim() - 2] : 0;
    return {reference::attentionSoftmax(x, s.reducedDims()[0], s.scale(), s.causal(), rows)};
  }
  if (op == "sum") return {reduce(x.sum(s.reducedDims()))};
  if (op == "split") {
    auto parts = x.split(s.attrInt("split_size"), s.reducedDims()[0]);
    return std::vector<at::Tensor>(parts.begin(), parts.end());
  }
  // The rest compute on their pieces exactly as on the whole tensor.
  std::map<std::string, at::Tensor> t;
  for (size_t i = 0; i < in.size(); ++i) t[r_.spec.operands[i]] = in[i];
  return reference::opForward(s, t, seed0);
}

}  // namespace

std::vector<at::Tensor> runOp(const ResolvedOp& r, RankContext& ctx,
                              const std::vector<at::Tensor>& local, uint64_t seed,
                              const std::string& fault) {
  std::vector<at::Tensor> in;
  for (size_t i = 0; i < local.size(); ++i) {
    const Axes& g = r.gradPartial[i];
    if (!g.empty() && local[i].requires_grad() && fault != "skip_grad_all_reduce") {
      in.push_back(harness::identityFwdAllReduceBwd(local[i], ctx.group(g)));
    } else {
      in.push_back(local[i]);
    }
  }
  return forwardLocal(r, ctx, in, seed, fault);
}

namespace {

// Canonical shapes whose strategy sets are registered up front (so `list` shows them); other
// ranks are generated when a case asks for them.
std::vector<nlohmann::json> canonicalShapes() {
  return {
      {{"op", "addmm"}, {"input", {16, 32}}, {"other", {32, 16}}},
      {{"op", "bmm"}, {"input", {4, 8, 16}}, {"other", {4, 16, 8}}},
      {{"op", "matmul"}, {"input", {16}}, {"other", {16}}},
      {{"op", "matmul"}, {"input", {8, 16}}, {"other", {16}}},
      {{"op", "embedding"}, {"input", {4, 16, 16}}, {"num_embeddings", 64}, {"embedding_dim", 32}},
      {{"op", "layer_norm"}, {"input", {4, 16}}},
      {{"op", "batch_norm"}, {"input", {8, 4, 6, 6}}},
      {{"op", "conv2d"}, {"input", {4, 4, 8, 8}}, {"out_channels", 8}, {"kernel", 3}},
      {{"op", "max_pool2d"}, {"input", {4, 4, 8, 8}}, {"kernel", 2}},
      {{"op", "avg_pool2d"}, {"input", {4, 4, 8, 8}}, {"kernel", 2}},
      {{"op", "add"}, {"input", {8, 16}}, {"other", {16}}},
      {{"op", "mul"}, {"input", {8, 16}}, {"other", {8, 16}}},
      {{"op", "gelu"}, {"input", {8, 16}}},
      {{"op", "relu"}, {"input", {8, 16}}},
      {{"op", "dropout"}, {"input", {8, 16}}, {"p", 0.25}},
      {{"op", "softmax"}, {"input", {8, 16}}, {"dim", -1}},
      {{"op", "view"}, {"input", {8, 16}}, {"size", {128}}},
      {{"op", "permute"}, {"input", {4, 8, 16}}, {"dims", {2, 0, 1}}},
      {{"op", "transpose"}, {"input", {8, 16}}, {"dim0", 0}, {"dim1", 1}},
      {{"op", "split"}, {"input", {8, 16}}, {"split_size", 8}, {"dim", 1}},
      {{"op", "sum"}, {"input", {8, 16}}, {"dims", {0}}},
  };
}

std::vector<std::unique_ptr<harness::Strategy>> strategiesFor(const OpShape& s) {
  std::vector<std::unique_ptr<harness::Strategy>> out;
  for (const auto& sp : opStrategySpecs(s)) out.push_back(makeOpStrategy(sp));
  return out;
}

std::vector<std::unique_ptr<harness::Strategy>> registerCanonical() {
  std::vector<std::unique_ptr<harness::Strategy>> out;
  std::set<std::string> seen;
  for (const auto& shape : canonicalShapes()) {
    for (auto& st : strategiesFor(OpShape::parse(shape))) {
      if (seen.insert(st->id()).second) out.push_back(std::move(st));
    }
  }
  return out;
}

std::vector<std::unique_ptr<harness::Strategy>> generateForCase(const CaseSpec& c) {
  if (c.workload != "op") return {};
  return strategiesFor(OpShape::parse(c.shape));
}

}  // namespace
}  // namespace sb::strategies

SB_REGISTER_STRATEGIES(sb::strategies::registerCanonical);
SB_REGISTER_STRATEGY_GENERATOR((sb::harness::StrategyRegistry::GeneratorInfo{
    "sharding/op/<op>/<strategy>", sb::harness::Family::kSharding,
    "the strategies of a single-operator case (workload op) for its operands' ranks, as "
    "ColossalAI's generators make them, where not registered for the canonical shapes",
    sb::strategies::generateForCase}));
