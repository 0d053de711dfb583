// Running a sharding plan of a whole model (model.h): `sharding/auto/<algo>` solves the plan
// for the case (ilp, megatron, data-parallel, replicated) and `sharding/plan` reads one from a
// file (params.plan); both run it with the same executor.
//
// The executor walks the graph in order on every rank (SPMD). Each node takes its operands in
// the layouts its strategy reads and runs the operator's strategy (op_strategies.h's runOp:
// its local compute and its collectives). Where a value was written in another layout, the
// edge redistributes it with the planner's steps (harness/redistribute.h) in an autograd
// function whose backward moves the gradient back with the planner's steps the other way:
// gradients are kept whole in their tensor's layout (a replicated tensor's gradient is
// replicated, as the operator strategies keep theirs). Parameters are sliced once, in their
// first reader's layout. Values are dropped after their last reader, so that only what autograd
// saved stays alive, which the memory model (model.h) counts.
//
// The record compares the output and every parameter's gradient with the plain LibTorch model
// (reference/graph.h), the communication counted with the sum of the nodes' and the edges'
// predictions, and the step time and peak memory with the plan's predictions.
//
// A training case (`steps: N`) runs N forwards and backwards through the plan from the initial
// pieces, LibTorch's optimizer over each rank's pieces between them (an elementwise update: the
// whole tensor's on those elements; a replicated parameter stepped alike on every rank that
// holds it), the loss and the gradient norm's squares all-reduced over the mesh with each
// replicated box counted once. The peak is the plan's with the optimizer's state alive, or the
// update's, profiled in prepare() on copies of the pieces.
//
// Planted fault `skip_edge_redistribution`: the first edge that needs a redistribution does
// none; its consumer gets the producer's piece cut or zero-padded to the shape it expects.

#include "strategies/sharding/auto/plan_executor.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <map>

#include "harness/comm/comm_site.h"
#include "harness/measure/memory.h"
#include "harness/measure/step_trace.h"
#include "harness/measure/update_profile.h"
#include "reference/autograd_engine.h"
#include "reference/training.h"
#include "strategies/sharding/auto/model.h"
#include "strategies/sharding/auto/plan_memory.h"
#include "strategies/sharding/auto/plan_trace.h"
#include "strategies/sharding/layout/redistribute_exec.h"
#include "strategies/sharding/sharding_util.h"

namespace sb::strategies::autoshard {

Layout parameterLayout(const SolvedPlan& s, const std::string& name) {
  return *s.model->valueLayout(name, s.plan.choice);
}

Box planResultBox(const SolvedPlan& s, const std::string& tensor, const CaseSpec& c, int rank) {
  const auto& g = s.model->graph();
  const auto coords = harness::DeviceMesh(c.mesh).coords(rank);
  if (tensor == "output") {
    return s.model->valueLayout(g.output, s.plan.choice)
        ->box(g.valueShape(g.output), c.mesh, coords);
  }
  // grad/<parameter>, param/<parameter>, state/<parameter>/<key>: the parameter's piece.
  std::string name = tensor.substr(tensor.find('/') + 1);
  if (tensor.rfind("state/", 0) == 0) name = name.substr(0, name.rfind('/'));
  return parameterLayout(s, name).box(g.valueShape(name), c.mesh, coords);
}

namespace {

// Gradient moves back along the planner's steps the other way (see the file comment).
struct EdgeRedistribute : torch::autograd::Function<EdgeRedistribute> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const harness::RedistRunner* fwd, const harness::RedistRunner* bwd) {
    ctx->saved_data["bwd"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(bwd));
    harness::saveCommNode(ctx);
    return fwd->run(x, false);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto* bwd = reinterpret_cast<const harness::RedistRunner*>(
        static_cast<intptr_t>(ctx->saved_data["bwd"].toInt()));
    const auto site = harness::backwardCommSite(ctx);
    return {bwd->run(grads[0].contiguous(), false), at::Tensor(), at::Tensor()};
  }
};

// Whether the rank at `coords` adds its piece of a tensor in `layout` to a sum over the whole
// tensor: on every axis that replicates it, only the first rank does (sharded axes hold other
// elements, pending-sum axes other terms).
bool countsOnce(const Layout& layout, const std::vector<int64_t>& coords) {
  for (size_t a = 0; a < coords.size(); ++a) {
    const int axis = static_cast<int>(a);
    if (layout.shardDimOf(axis) < 0 && !layout.isPartial(axis) && coords[a] != 0) return false;
  }
  return true;
}

}  // namespace

void PlanExecutor::prepare(RankContext& ctx, const reference::WorkloadData& data) {
  const auto& m = *solved_->model;
  const auto& g = m.graph();
  const auto coords = ctx.mesh().coords(ctx.rank());
  for (size_t v = 0; v < g.nodes.size(); ++v) {
    const auto& n = g.nodes[v];
    const Candidate& cand = m.candidates(v)[solved_->plan.choice[v]];
    for (size_t i = 0; i < n.args.size(); ++i) {
      const std::string& a = n.args[i];
      const Box box = cand.storedLayout(i).box(g.valueShape(a), case_.mesh, coords);
      if (g.isInput(a)) {
        data_[{static_cast<int>(v), i}] = harness::sliceBox(data.inputs.at(a), box).clone();
      } else if (g.isParameter(a) && !leaves_.count(a)) {
        leaves_[a] = harness::sliceBox(data.inputs.at(a), box).clone().set_requires_grad(true);
      }
    }
  }
  const Layout outLayout = *m.valueLayout(g.output, solved_->plan.choice);
  const Box out = outLayout.box(g.valueShape(g.output), case_.mesh, coords);
  // A training case's loss is sum(output * target): its gradient seeds the backward.
  seed_ =
      harness::sliceBox(data.inputs.at(case_.training.enabled() ? "target" : "grad_output"), out)
          .clone();
  heldBytes_ = static_cast<int64_t>(seed_.nbytes());
  for (const auto& [name, l] : leaves_) heldBytes_ += static_cast<int64_t>(l.nbytes());
  for (const auto& [key, t] : data_) heldBytes_ += static_cast<int64_t>(t.nbytes());
  for (const auto& e : solved_->edges) edgeOf_[{e.node, e.operand}] = &e;
  auto& mem = harness::MemoryTracker::instance();
  std::vector<PlanMemoryEvent> log;
  liveAfterForward_.clear();
  try {
    stepPeak_ =
        replayPlanStep(m, solved_->plan.choice, solved_->edges, ctx, case_.dtype,
                       mem.tracing(ctx.rank()) ? &log : nullptr, replayFault_, nullptr,
                       recompute_ ? &recompute_->replayPolicy() : nullptr, &liveAfterForward_);
    replayed_ = true;
  } catch (const PlanMemoryUnknown& e) {
    notReplayed_ = e.what();
  }
  for (const auto& e : log) {
    fprintf(stderr, "model %+lld %s\n", static_cast<long long>(e.bytes), e.what.c_str());
  }
  if (case_.training.enabled()) {
    outputCounted_ = countsOnce(outLayout, coords);
    for (const auto& [name, l] : leaves_) {
      initialLeaves_.push_back(l.detach().clone());
      initialBytes_ += static_cast<int64_t>(initialLeaves_.back().nbytes());
      leafCounted_.push_back(countsOnce(parameterLayout(*solved_, name), coords));
    }
    const auto u = harness::profileUpdate(ctx.rank(), case_.training, namedLeaves(), leafCounted_);
    updatePeak_ = u.peak;
    stateBytes_ = u.stateBytes;
  }
}

std::vector<std::pair<std::string, at::Tensor>> PlanExecutor::namedLeaves() const {
  return {leaves_.begin(), leaves_.end()};
}

void PlanExecutor::step(RankContext& ctx) {
  if (case_.training.enabled()) {
    trainSteps(ctx);
    return;
  }
  results_.clear();
  runners_.clear();
  for (auto& [name, l] : leaves_) l.mutable_grad().reset();
  startCapture(ctx);
  at::Tensor out;
  {
    const PassScope pass(*this, ctx);
    out = forward(ctx);
    reference::backward({out}, {seed_});
  }
  endCapture();
  results_["output"] = out.detach();
  for (const auto& [name, l] : leaves_) results_["grad/" + name] = l.grad();
}

void PlanExecutor::trainSteps(RankContext& ctx) {
  results_.clear();
  loop_.reset();
  {
    const at::NoGradGuard noGrad;
    size_t i = 0;
    for (auto& [name, l] : leaves_) l.copy_(initialLeaves_[i++]);
  }
  loop_ = std::make_unique<reference::TrainingLoop>(case_.training, namedLeaves());
  auto& world = ctx.world();
  const bool shared = case_.meshSize() > 1;
  if (shared) harness::shareNormOver(*loop_, leafCounted_, world);
  // The step starts as its updates run: every piece's gradient and the previous step's edge
  // runners alive (a first step's gradients made here, zero), so that what is live now is
  // what each update sits on.
  for (auto& [name, l] : leaves_) {
    if (!l.grad().defined()) l.mutable_grad() = at::zeros_like(l);
  }
  startLive_ = harness::MemoryTracker::instance().current(ctx.rank());
  for (int k = 0; k < case_.training.steps; ++k) {
    runners_.clear();
    for (auto& [name, l] : leaves_) l.mutable_grad().reset();
    double loss = 0;
    {
      if (k == 0) startCapture(ctx);
      at::Tensor out;
      {
        const PassScope pass(*this, ctx);
        out = forward(ctx);
        // Seeded with the target, d sum(output * target) / d output, as the one-step backward
        // is (the plan's memory model counts that backward); the loss from the output after it.
        reference::backward({out}, {seed_});
      }
      endCapture();
      at::Tensor total =
          outputCounted_ ? (out.detach() * seed_).sum() : at::zeros({}, out.options());
      if (shared) {
        const harness::CommSiteScope site("", harness::StepPhase::kUpdate);
        world.allReduce(total);
      }
      loss = total.item<double>();
    }
    loop_->update(loss);
  }
}

std::map<std::string, at::Tensor> PlanExecutor::results() const {
  if (!loop_) return results_;
  std::map<std::string, at::Tensor> out;
  loop_->write(out);
  return out;
}

at::Tensor PlanExecutor::forward(RankContext& ctx) {
  const auto& g = solved_->model->graph();
  // How many reads each value has left, to drop it after its last.
  std::map<std::string, int> reads;
  for (const auto& n : g.nodes) {
    for (const auto& a : n.args) ++reads[a];
  }
  bool faultDone = !fault_;
  std::map<std::string, at::Tensor> values;
  for (size_t v = 0; v < g.nodes.size(); ++v) {
    const auto& n = g.nodes[v];
    // run --trace: the node's forward (its edges' redistributions in it) as a span.
    const harness::TraceScope span("node", n.name);
    std::vector<at::Tensor> outs;
    {
      const auto hooks = recompute_ ? recompute_->nodeHooks(static_cast<int>(v)) : nullptr;
      outs = nodeForward(
          ctx, v,
          [&](size_t i) -> at::Tensor {
            const std::string& a = n.args[i];
            if (g.isInput(a)) return data_.at({static_cast<int>(v), i});
            if (g.isParameter(a)) return leaves_.at(a);
            return values.at(a);
          },
          [&](size_t i) {
            const std::string& a = n.args[i];
            if (!g.isInput(a) && !g.isParameter(a) && --reads[a] == 0 && a != g.output) {
              values.erase(a);
            }
          },
          faultDone, 0, true);
    }
    if (recompute_) recompute_->nodeDone(static_cast<int>(v), outs);
    const auto names = n.outputs();
    for (size_t j = 0; j < names.size(); ++j) {
      if (reads[names[j]] > 0 || names[j] == g.output) values[names[j]] = outs[j];
    }
    outs.clear();
    // SB_MEMORY_TRACE: the model's forward rows are "after node v".
    if (auto& mem = harness::MemoryTracker::instance(); mem.tracing(ctx.rank())) {
      mem.traceNote(ctx.rank(), ("after " + n.name).c_str());
    }
  }
  at::Tensor out = values.at(g.output);
  values.clear();
  return out;
}

std::vector<at::Tensor> PlanExecutor::nodeForward(RankContext& ctx, size_t v,
                                                  const std::function<at::Tensor(size_t)>& operand,
                                                  const std::function<void(size_t)>& taken,
                                                  bool& faultDone, uint64_t seedShift,
                                                  bool capture) {
  const auto& m = *solved_->model;
  const auto& n = m.graph().nodes[v];
  const Candidate& cand = m.candidates(v)[solved_->plan.choice[v]];
  const harness::CommSiteScope site(n.name);
  PlanCapture* const cap = capture ? capture_.get() : nullptr;
  std::vector<at::Tensor> local;
  for (size_t i = 0; i < n.args.size(); ++i) {
    at::Tensor t = operand(i);
    if (auto e = edgeOf_.find({static_cast<int>(v), i}); e != edgeOf_.end()) {
      const PlanEdge& edge = *e->second;
      if (!faultDone) {
        // The planted fault: no redistribution; the piece cut or padded to the expected shape.
        faultDone = true;
        const auto want =
            cand.op.operands[i].box(edge.geometry.shape, case_.mesh, ctx.mesh().coords(ctx.rank()));
        for (int64_t d = 0; d < t.dim(); ++d) {
          if (t.size(d) > want.length[d]) t = t.narrow(d, 0, want.length[d]);
        }
        std::vector<int64_t> pad;
        for (int64_t d = t.dim() - 1; d >= 0; --d) {
          pad.push_back(0);
          pad.push_back(want.length[d] - t.size(d));
        }
        t = at::constant_pad_nd(t, pad, 0);
        if (cap) cap->operand(v, i, t);
      } else {
        runners_.push_back(
            std::make_unique<harness::RedistRunner>(edge.geometry, edge.forward, ctx, case_.dtype));
        const harness::RedistRunner* fwd = runners_.back().get();
        runners_.push_back(std::make_unique<harness::RedistRunner>(edge.geometry, edge.backward,
                                                                   ctx, case_.dtype));
        t = EdgeRedistribute::apply(t, fwd, runners_.back().get());
        if (cap) cap->operand(v, i, t);
      }
    }
    local.push_back(t);
    t = at::Tensor();
    taken(i);
  }
  auto outs = runOp(cand.op, ctx, local, case_.seed + n.seedOffset + seedShift);
  local.clear();
  if (cap) cap->outputs(v, outs);
  return outs;
}

void PlanExecutor::startPass(RankContext& ctx) {
  if (!recompute_) return;
  std::vector<at::Tensor> held;
  for (const auto& [name, l] : leaves_) held.push_back(l);
  for (const auto& [key, t] : data_) held.push_back(t);
  held.push_back(seed_);
  const auto& g = solved_->model->graph();
  recompute_->startPass(
      [this, &ctx, &g](int v, const PlanRecompute::Value& value, uint64_t seedShift) {
        const auto& n = g.nodes[static_cast<size_t>(v)];
        bool noFault = true;
        return nodeForward(
            ctx, static_cast<size_t>(v),
            [&](size_t i) -> at::Tensor {
              const std::string& a = n.args[i];
              if (g.isInput(a)) return data_.at({v, i});
              if (g.isParameter(a)) return leaves_.at(a);
              return value(a);
            },
            [](size_t) {}, noFault, seedShift, false);
      },
      held);
}

}  // namespace sb::strategies::autoshard
