// The operator strategies' model, generic over the operators: a strategy's resolution on a mesh
// (its operands' and outputs' layouts, the partial sums of each gradient, why it cannot run),
// what one rank communicates, its flops and local work, the memory-replay vocabulary the rules
// write their allocations in, the rules' shared defaults, and one rank's forward (runOp). The
// strategy and executor that use them are op_sharding.cpp; each operator's own parts are its
// rule's file (op_rule.h).

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <optional>
#include <set>

#include "harness/comm/autograd_comm.h"
#include "harness/registry.h"
#include "reference/autograd_engine.h"
#include "strategies/sharding/layout/redistribute.h"
#include "strategies/sharding/layout/redistribute_exec.h"
#include "strategies/sharding/ops/op_rule.h"
#include "strategies/sharding/ops/op_specs_common.h"
#include "strategies/sharding/ops/op_strategies.h"
#include "strategies/sharding/sharding_util.h"

namespace sb::strategies {
namespace {

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
using Resolved = ResolvedOp;

// A FULLY REPLICATED strategy's gather (OpStrategySpec::gatherInput): the geometry of the whole
// input, and the redistribution from its layout to replicated.
struct GatherPlan {
  harness::RedistGeometry geometry;
  harness::RedistPlan plan;
};
GatherPlan gatherPlan(const Resolved& r, const std::vector<int64_t>& mesh, at::ScalarType dtype) {
  GatherPlan p;
  p.geometry.shape = r.shape.input;
  p.geometry.mesh = mesh;
  p.geometry.elemSize = static_cast<int64_t>(c10::elementSize(dtype));
  p.plan = harness::planRedistribution(p.geometry, r.operands[0],
                                       Layout(static_cast<int>(r.shape.input.size())),
                                       harness::RedistCostModel{});
  return p;
}

// Whether the strategy gathers its input over more than one rank.
bool gathers(const Resolved& r, const DeviceMesh& mesh) {
  return r.spec.gatherInput && mesh.groupSize(usedAxes(r.operands[0])) > 1;
}

// Forward: the input gathered whole by the redistribution's steps (the runner's address travels
// as an integer, as RedistributeFn's does; it lives while the forward runs). Backward: this
// rank's box of the whole gradient, a copy of its own, with nothing communicated.
struct GatherFwdSliceBwd : torch::autograd::Function<GatherFwdSliceBwd> {
  static at::Tensor forward(torch::autograd::AutogradContext* actx, const at::Tensor& x,
                            int64_t runner, std::vector<int64_t> offset) {
    actx->saved_data["offset"] = offset;
    actx->saved_data["length"] = x.sizes().vec();
    return reinterpret_cast<const harness::RedistRunner*>(static_cast<intptr_t>(runner))
        ->run(x, false);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* actx,
                                                 torch::autograd::variable_list grads) {
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor(), at::Tensor()};
    const auto offset = actx->saved_data["offset"].toIntVector();
    const auto length = actx->saved_data["length"].toIntVector();
    at::Tensor g = grads[0];
    for (size_t d = 0; d < offset.size(); ++d) {
      g = g.narrow(static_cast<int64_t>(d), offset[d], length[d]);
    }
    return {g.clone(at::MemoryFormat::Contiguous), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

bool MemoryReplay::gathersInput() const { return gathers(r, ctx.mesh()); }

void MemoryReplay::gatherInput() {
  if (!gathersInput()) return;
  const GatherPlan p = gatherPlan(r, ctx.mesh().shape(), dtype);
  const harness::RedistRunner runner(p.geometry, p.plan, ctx, dtype);
  const auto mem = runner.memory(current, false);
  peak = std::max(peak, mem.peak);
  current = mem.live;
}

int64_t MemoryReplay::scratch(const Axes& axes, int64_t b) const {
  return ctx.group(axes).scratchBytes(Collective::kAllReduce, b, b, dtype);
}

void MemoryReplay::dropPreviousResults(bool outputsAreViews, bool gradientsAreViews) {
  if (split) return;
  const int64_t previous = (outputsAreViews ? 0 : O) + (gradientsAreViews ? 0 : sumG);
  alloc(previous);
  release(previous);
}

void MemoryReplay::reduceCopy() {
  if (!reduces) return;
  alloc(O);
  alloc(scratch(outPartial, O));
  release(scratch(outPartial, O));
  release(O);
}

void MemoryReplay::gradAllReduces() {
  if (split || fault == "skip_grad_all_reduce") return;
  for (size_t i = 0; i < leaves.size(); ++i) {
    if (g[i] == 0 || r.gradPartial[i].empty()) continue;
    const int64_t sc = scratch(r.gradPartial[i], g[i]);
    alloc(g[i] + sc);
    release(g[i] + sc);
  }
}

at::Tensor LocalForward::reduce(const at::Tensor& y, size_t out) const {
  const Axes& p = r.outputs[out].partialAxes();
  if (p.empty() || fault == "skip_output_all_reduce") return y;
  return harness::allReduceFwdIdentityBwd(y, ctx.group(p));
}

Box LocalForward::operandBox(size_t i) const {
  return r.operands[i].box(r.shape.operandShape(r.spec.operands[i]), mesh, coords);
}

std::vector<std::string> commonFaults(const OpStrategySpec& spec,
                                      const std::vector<std::string>& own, int noGradient) {
  std::vector<std::string> f;
  bool partialOut = false;
  for (const auto& l : spec.outputLayouts) partialOut |= !l.partialAxes().empty();
  if (partialOut) f.push_back("skip_output_all_reduce");
  f.insert(f.end(), own.begin(), own.end());
  for (size_t i = 0; i < spec.operands.size(); ++i) {
    if (!gradPartialOf(spec, spec.operandLayouts, spec.outputLayouts, i).empty() &&
        static_cast<int>(i) != noGradient) {
      f.push_back("skip_grad_all_reduce");
      break;
    }
  }
  return f;
}

void keepLayouts(ResolvedOp&, const DeviceMesh&) {}

std::vector<at::Tensor> referenceForward(const LocalForward& f) {
  // The rest compute on their pieces exactly as on the whole tensor.
  std::map<std::string, at::Tensor> t;
  for (size_t i = 0; i < f.in.size(); ++i) t[f.r.spec.operands[i]] = f.in[i];
  return reference::opForward(f.r.shape, t, f.seed);
}

double noFlops(const ResolvedOp&, const std::vector<int64_t>&, int) { return 0.0; }

int64_t noReduction(const OpShape&, const std::string&) { return 0; }

int64_t productReductionLength(const OpShape& s, const std::string& tensor) {
  const int64_t k = s.input.empty() ? 1 : s.input.back();
  const int64_t rows =
      std::accumulate(s.input.begin(), s.input.end(), int64_t{1}, std::multiplies<>()) /
      std::max<int64_t>(k, 1);
  if (tensor == "grad_input") return s.other.size() >= 2 ? s.other.back() : 1;
  if (tensor == "grad_other" || tensor == "grad_bias") return rows;
  return k;  // the output
}

int64_t noStatistics(const Box&) {
  TORCH_INTERNAL_ASSERT(false, "statistics over ranks asked of an operator without them");
}

namespace {
// The strategies of a shape on a mesh of `meshNdim` axes: the generator's (1-D and 2-D), or on
// more axes the expansion, made once per shape and mesh rank (a plan's model resolves each of a
// node's strategies by name among them, and every rank's executor does again); none beyond
// kMaxExpandedAxes.
std::shared_ptr<const std::vector<OpStrategySpec>> specsFor(const OpShape& s, int meshNdim) {
  if (meshNdim <= 2)
    return std::make_shared<const std::vector<OpStrategySpec>>(opRule(s.op).specs(s));
  if (meshNdim > kMaxExpandedAxes) return std::make_shared<const std::vector<OpStrategySpec>>();
  static std::mutex mu;
  static std::map<std::string, std::shared_ptr<const std::vector<OpStrategySpec>>> cache;
  const std::string key = s.toString() + "|" + s.attrs.dump() + "|" + std::to_string(meshNdim);
  {
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = cache.find(key); it != cache.end()) return it->second;
  }
  auto made = std::make_shared<const std::vector<OpStrategySpec>>(
      expandToMesh(opRule(s.op).specs(s), s, meshNdim));
  std::lock_guard<std::mutex> lock(mu);
  return cache.emplace(key, std::move(made)).first->second;
}
}  // namespace

std::vector<OpStrategySpec> opStrategySpecs(const reference::OpShape& s, int meshNdim) {
  return *specsFor(s, meshNdim);
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
  const auto specs = specsFor(r.shape, static_cast<int>(meshShape.size()));
  for (const auto& sp : *specs) {
    if (sp.name == spec.name) {
      r.operands = sp.operandLayouts;
      r.outputs = sp.outputLayouts;
      // A view keeps its input's shards or gathers it as the case's shapes allow.
      r.spec.gatherInput = sp.gatherInput;
      r.spec.outputFromShape = sp.outputFromShape;
      r.spec.colossalName = sp.colossalName;
      r.spec.buffers = sp.buffers;
      break;
    }
  }
  const DeviceMesh mesh(meshShape);
  // The operator's own layouts for the case (view: each input dimension's shards mapped to the
  // output).
  opRule(spec.op).layouts(r, mesh);
  if (!r.problem.empty()) return r;
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
  const int meshNdim = static_cast<int>(mesh.size());
  const bool generatedForMesh =
      std::find(spec.meshDims.begin(), spec.meshDims.end(), meshNdim) != spec.meshDims.end();
  // On 1-D and 2-D meshes a strategy is the generator's for its mesh ranks; beyond, the
  // expansion's of its name (an expanded name that a 2-D strategy has too, by the same layouts:
  // the batched matmul's names are their layouts, "S0S1RR = S0S1RR x S0S1RR").
  if (meshNdim <= 2 && !generatedForMesh) {
    return "not generated for a " + std::to_string(meshNdim) + "-D mesh";
  }
  const auto specs = specsFor(s, meshNdim);
  const auto& mine = *specs;
  if (std::none_of(mine.begin(), mine.end(),
                   [&](const OpStrategySpec& o) { return o.name == spec.name; })) {
    return generatedForMesh ? "not generated for this shape"
                            : "not generated for a " + std::to_string(meshNdim) + "-D mesh";
  }
  if (meshNdim > 2) {
    // An axis of extent 1 shards nothing: the strategy without it is the same.
    for (const auto& l : spec.operandLayouts) {
      for (int a : usedAxes(l)) {
        if (mesh[static_cast<size_t>(a)] == 1) {
          return "shards over mesh axis " + std::to_string(a) +
                 ", of extent 1 (the same strategy without it applies)";
        }
      }
    }
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
  return opRule(r.shape.op).statistics(in);
}
}  // namespace

std::vector<OpCommPart> opCommParts(const ResolvedOp& r, const std::vector<int64_t>& meshShape,
                                    int rank, at::ScalarType dtype) {
  const DeviceMesh mesh(meshShape);
  const auto coords = mesh.coords(rank);
  const int64_t es = c10::elementSize(dtype);
  std::vector<OpCommPart> out;
  const auto allReduce = [&](const Axes& axes, int64_t numel, bool backward) {
    CommStats st;
    st.add(Collective::kAllReduce, mesh.groupSize(axes) > 1 ? numel * es : 0);
    out.push_back({axes, backward, st});
  };
  const auto outs = r.shape.outputs();
  for (size_t i = 0; i < r.outputs.size(); ++i) {
    if (!r.outputs[i].partialAxes().empty()) {
      allReduce(r.outputs[i].partialAxes(), r.outputs[i].box(outs[i], meshShape, coords).numel(),
                false);
    }
  }
  if (!r.statAxes.empty()) {
    const int64_t stats = statNumel(r, meshShape, coords);
    allReduce(r.statAxes, stats, false);     // forward: the sum
    allReduce(r.statAxes, stats, false);     // forward: the centred sum of squares
    allReduce(r.statAxes, 2 * stats, true);  // backward: both sums of the input gradient
  }
  for (size_t i = 0; i < r.gradPartial.size(); ++i) {
    if (r.gradPartial[i].empty()) continue;
    allReduce(
        r.gradPartial[i],
        r.operands[i].box(r.shape.operandShape(r.spec.operands[i]), meshShape, coords).numel(),
        true);
  }
  if (gathers(r, mesh)) {  // the input's gather, forward only
    const GatherPlan p = gatherPlan(r, meshShape, dtype);
    for (auto& [axes, st] : p.plan.commByGroup(p.geometry, rank, false)) {
      out.push_back({std::move(axes), false, std::move(st)});
    }
  }
  return out;
}

std::vector<std::pair<std::vector<int>, CommStats>> opCommByGroup(
    const ResolvedOp& r, const std::vector<int64_t>& meshShape, int rank, at::ScalarType dtype) {
  std::vector<std::pair<std::vector<int>, CommStats>> out;
  for (auto& p : opCommParts(r, meshShape, rank, dtype)) {
    out.emplace_back(std::move(p.axes), std::move(p.comm));
  }
  return out;
}

// Floating-point operations of this rank's products, forward and backward (three products
// each of 2 x the local contraction): addmm, bmm, matmul and conv2d; none for the rest.
double opFlops(const ResolvedOp& r, const std::vector<int64_t>& mesh, int rank) {
  return opRule(r.shape.op).flops(r, mesh, rank);
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
  if (gathers(r, DeviceMesh(mesh))) {
    const GatherPlan p = gatherPlan(r, mesh, dtype);
    w += p.plan.localWork(p.geometry, rank, false);
  }
  return w;
}

std::vector<at::Tensor> runOp(const ResolvedOp& r, RankContext& ctx,
                              const std::vector<at::Tensor>& local, uint64_t seed,
                              const std::string& fault) {
  std::vector<at::Tensor> in;
  // A FULLY REPLICATED strategy gathers its input whole first; the runner lives while the
  // forward runs, which is all the gather needs of it.
  std::optional<GatherPlan> gather;
  std::optional<harness::RedistRunner> runner;
  if (gathers(r, ctx.mesh())) {
    gather = gatherPlan(r, ctx.mesh().shape(), local[0].scalar_type());
    runner.emplace(gather->geometry, gather->plan, ctx, local[0].scalar_type());
  }
  for (size_t i = 0; i < local.size(); ++i) {
    const Axes& g = r.gradPartial[i];
    if (!g.empty() && local[i].requires_grad() && fault != "skip_grad_all_reduce") {
      in.push_back(harness::identityFwdAllReduceBwd(local[i], ctx.group(g)));
    } else if (i == 0 && runner) {
      // The planted fault keeps the first rank's box of the gradient on every rank.
      auto offset = r.operands[0]
                        .box(r.shape.input, ctx.mesh().shape(), ctx.mesh().coords(ctx.rank()))
                        .offset;
      if (fault == "gather_first_box") offset.assign(offset.size(), 0);
      in.push_back(GatherFwdSliceBwd::apply(
          local[0], static_cast<int64_t>(reinterpret_cast<intptr_t>(&*runner)), offset));
    } else {
      in.push_back(local[i]);
    }
  }
  // The statistics' group, or none when the planted fault skips their all-reduce.
  Communicator* statComm =
      r.statAxes.empty() || fault == "skip_stats_all_reduce" ? nullptr : &ctx.group(r.statAxes);
  const LocalForward f{
      r, ctx, in, seed, fault, statComm, ctx.mesh().coords(ctx.rank()), ctx.mesh().shape()};
  return opRule(r.shape.op).forward(f);
}

}  // namespace sb::strategies
