// A pipeline rank's step (pipeline_executor.h; what the family does: pipeline_strategy.cpp):
// its schedule's actions on its stages, their sends and receives, training's loop, the results.

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <set>

#include "harness/comm/comm_site.h"
#include "harness/error.h"
#include "harness/measure/memory.h"
#include "harness/measure/step_trace.h"
#include "reference/autograd_engine.h"
#include "strategies/pipeline/pipeline_executor.h"
#include "strategies/pipeline/split_backward.h"

namespace sb::strategies::pipeline {

PipelineExecutor::PipelineExecutor(Plan plan, Fault fault, const CaseSpec& c)
    : case_(c), fault_(fault), plan_(std::move(plan)), training_(c.training.enabled()) {}

at::Tensor PipelineExecutor::stageForward(int stage, const at::Tensor& x) const {
  at::Tensor h = x;
  for (int l = plan_.cut[stage]; l < plan_.cut[stage + 1]; ++l) h = net_->stage(l, h, true);
  return h;
}

const std::vector<at::Tensor>& PipelineExecutor::paramsOf(int stage) const {
  static const std::vector<at::Tensor> none;
  const auto it = stageParams_.find(stage);
  return it == stageParams_.end() ? none : it->second;
}

void PipelineExecutor::prepare(RankContext& ctx, const reference::WorkloadData& data) {
  // NCCL matches a pair's sends and receives by their order, not their tags: a schedule that
  // mixes activations and gradients in one direction would take one for the other.
  if (ctx.world().backendName() == "nccl") {
    throw harness::UnsupportedCase(
        "the pipeline's sends are matched by tag; NCCL matches them by order (not run there yet)");
  }
  p_ = ctx.group({0}).rank();
  d_ = plan_.dp > 1 ? ctx.group({1}).rank() : 0;
  if (plan_.dp > 1) dpComm_ = &ctx.group({1});
  worldComm_ = &ctx.world();
  net_ = makeChainNet(case_, data);
  const int64_t rows = net_->input().size(0) / plan_.dp;
  const at::Tensor in = net_->input().narrow(0, d_ * rows, rows);
  const at::Tensor tgt = net_->target().narrow(0, d_ * rows, rows);
  for (const at::Tensor& t : in.chunk(plan_.microbatches, 0)) inputs_.push_back(t.contiguous());
  for (const at::Tensor& t : tgt.chunk(plan_.microbatches, 0)) targets_.push_back(t.contiguous());
  // What crosses each layer boundary: micro-batch 0 through the whole chain, untaped (layers
  // need not keep their input's shape: an imported model goes from ids to features to logits).
  // The samples stand in for received activations in the profile, then are let go.
  {
    at::NoGradGuard noGrad;
    at::Tensor h = inputs_[0];
    const int L = net_->numStages();
    for (int b = 0; b <= L; ++b) {
      boundary_.push_back({h.sizes().vec(), h.options()});
      // The first cut's (the profile's ping-pong) and each of this rank's stages' input.
      const bool used =
          b == plan_.cut[1] || (b < L && plan_.schedule.stageRank[plan_.stageOf(b)] == p_ &&
                                plan_.cut[plan_.stageOf(b)] == b);
      if (used) samples_[b] = h;
      if (b < L) h = net_->stage(b, h, false);
    }
  }
  // Each parameter on every rank holding a stage that reads it; elsewhere let go (the layers
  // hold the tensors, emptied), so that a rank's memory is its stages' alone.
  int index = -1;  // the parameter's place in the net, the same on every rank
  for (const auto& [name, t] : net_->parameters()) {
    ++index;
    const std::vector<int> layers = layersOf(case_, name);
    shapes_[name] = t.sizes().vec();
    std::set<int> mine;
    for (int l : layers) {
      if (plan_.schedule.stageRank[plan_.stageOf(l)] == p_) mine.insert(plan_.stageOf(l));
    }
    if (mine.empty()) {
      at::NoGradGuard noGrad;
      at::Tensor(t).set_(at::empty({0}, t.options()));
      continue;
    }
    const std::vector<int> holders = holdersOf(plan_, layers);
    if (holders.size() > 1) tied_.push_back({owned_.size(), holders, index});
    // One stage reading it: whose accumulated gradient the reference's trace has.
    if (plan_.stageOf(layers.front()) == plan_.stageOf(layers.back())) {
      stageOfParam_[name] = plan_.stageOf(layers.front());
    }
    owned_.emplace_back(name, t);
    for (int s : mine) stageParams_[s].push_back(t);
    t.mutable_grad() = at::zeros_like(t);
  }
  profile(ctx);
  samples_.clear();
  if (training_) {
    for (const auto& [name, t] : owned_) initial_.push_back(t.detach().clone());
    // The norm's squares counted once: on replica 0, by a tied parameter's first holder.
    std::vector<bool> counted(owned_.size(), d_ == 0);
    for (const Tied& t : tied_) counted[t.owned] = counted[t.owned] && t.holders.front() == p_;
    update_ = harness::profileUpdate(ctx.rank(), case_.training, owned_, counted);
    counted_ = counted;
  }
}

void PipelineExecutor::run(RankContext& ctx, const Action& a) {
  auto& pipe = ctx.group({0});
  const int S = plan_.schedule.stages, s = a.stage, m = a.microbatch;
  const auto& where = plan_.schedule.stageRank;
  const auto receive = [&](at::Tensor t, int from, int tag, const char* what) {
    if (profiling_) return t;
    try {
      pipe.recv(t, from, tag);
    } catch (const c10::Error& e) {
      TORCH_CHECK(false, "pipeline rank ", p_, " at ", a.name(), " waiting for ", what, ": ",
                  e.what_without_backtrace());
    }
    computeStart_ = std::chrono::steady_clock::now();  // the wait before it is idle time
    return t;
  };
  // What is sent goes contiguous (a stage of an imported model may end in a view).
  const auto send = [&](at::Tensor t, int to, int tag) {
    t = t.contiguous();
    if (profiling_) {
      held_.push_back(t);
    } else {
      sends_.push_back(pipe.isend(t, to, tag));
    }
  };
  if (a.op == Op::kForward) {
    const int b = plan_.cut[s];
    at::Tensor x = s == 0 ? inputs_[m]
                          : receive(boundary_[b].empty(), where[s - 1], tagOf(plan_, s, m, 0),
                                    "the previous stage's activation");
    // Ids (an imported model's first stage) take no gradient.
    x = at::isFloatingType(x.scalar_type()) ? x.detach().requires_grad_(true) : x;
    at::Tensor y = stageForward(s, x);
    if (s < S - 1) {
      int to = s + 1;
      if (fault_ == Fault::kSendWrongStage && s == 0 && m == 0) to = std::min(S - 1, s + 2);
      send(y.detach(), where[s + 1], tagOf(plan_, to, m, 0));
    }
    if (capturing_) keep("forward", s, stageOutputName(plan_, s, d_, m), y);
    stash_[{s, m}] = {x, y, {}};
    return;
  }
  auto it = stash_.find({s, m});
  TORCH_CHECK(it != stash_.end(), "pipeline rank ", p_, " runs ", a.name(), " before ",
              std::to_string(s) + "F" + std::to_string(m), " (its forward)");
  Stash& st = it->second;
  if (a.op == Op::kBackwardWeight) {
    TORCH_CHECK(st.w.ready(), "pipeline rank ", p_, " runs ", a.name(), " before ",
                std::to_string(s) + "I" + std::to_string(m),
                ": the weight gradient starts from the gradients the input gradient's pass keeps");
    backwardWeight(st.w, paramsOf(s));
    keepAccumulated(s, m);
    stash_.erase(it);
    return;
  }
  if (training_ && s == S - 1) lossSum_ += (st.y * targets_[m]).sum().item<double>();
  const at::Tensor gy =
      s == S - 1 ? targets_[m]
                 : receive(at::empty_like(st.y, at::MemoryFormat::Contiguous), where[s + 1],
                           tagOf(plan_, s, m, 1), "the next stage's input gradient");
  at::Tensor gx;
  if (a.op == Op::kBackward) {
    // Planted: this micro-batch's share of every parameter's gradient added a second time.
    const bool twice = fault_ == Fault::kGradTwice && s == 0 && m == 1;
    std::vector<at::Tensor> before;
    if (twice) {
      for (const at::Tensor& p : paramsOf(s)) before.push_back(p.grad().clone());
    }
    if (st.y.requires_grad()) reference::backward({st.y}, {gy});
    for (size_t k = 0; k < before.size(); ++k) {
      const at::Tensor& g = paramsOf(s)[k].mutable_grad();
      g.add_(g - before[k]);
    }
    gx = st.x.grad();
  } else {
    // I: the input's gradient alone, the graph kept; what W starts from kept beside it.
    gx = backwardInput(st.x, st.y, gy, paramsOf(s), st.w);
  }
  if (!gx.defined() && st.x.requires_grad()) {
    // The stage's output does not depend on its input: the input's gradient is zeros.
    gx = boundary_[plan_.cut[s]].empty().zero_();
  }
  if (capturing_ && gx.defined()) keep("backward", s, stageInputGradName(plan_, s, d_, m), gx);
  if (a.op == Op::kBackward) keepAccumulated(s, m);
  if (s > 0) {
    send(gx, where[s - 1], tagOf(plan_, s - 1, m, 1));
  } else {
    gradInputs_[m] = gx;
  }
  if (s == S - 1) outputs_[m] = st.y.detach();
  if (a.op == Op::kBackward) stash_.erase(it);
}

void PipelineExecutor::keep(const char* phase, int stage, const std::string& tensor,
                            const at::Tensor& t) {
  if (!capturing_ || profiling_) return;
  captured_.push_back({"stage " + std::to_string(stage), phase, tensor, t.detach().clone(),
                       harness::Box::whole(t.sizes()), harness::TraceValue::clockNs()});
}

void PipelineExecutor::keepAccumulated(int stage, int m) {
  // Only where the reference accumulates the same micro-batches in the same order (this
  // replica's, before the replicas' all-reduce).
  if (!capturing_ || profiling_ || !plan_.inOrder) return;
  for (const auto& [name, t] : owned_) {
    const auto it = stageOfParam_.find(name);
    if (it == stageOfParam_.end() || it->second != stage) continue;
    keep("backward", stage, accumulatedGradName(plan_, name, d_, m), t.grad());
  }
}

void PipelineExecutor::step(RankContext& ctx) {
  auto& mem = harness::MemoryTracker::instance();
  entryBefore_ = mem.current(ctx.rank());
  at::manual_seed(reference::ChainWorkload::dropoutSeed(case_.seed));
  const int iterations = training_ ? case_.training.steps : 1;
  if (training_) {
    // Every step() is the case's whole run: from the initial parameters, a new optimizer (the
    // last run's state let go), the norm's squares each counted on one replica, summed over
    // the mesh.
    loop_.reset();
    at::NoGradGuard noGrad;
    for (size_t i = 0; i < owned_.size(); ++i) owned_[i].second.copy_(initial_[i]);
    loop_ = std::make_unique<reference::TrainingLoop>(case_.training, owned_);
    harness::shareNormOver(*loop_, counted_, ctx.world());
  }
  const auto now = [&] {
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start_)
        .count();
  };
  double end = 0;
  for (int k = 0; k < iterations; ++k) {
    capturing_ = capture_ && k == 0;
    for (auto& [name, t] : owned_) t.mutable_grad().zero_();
    outputs_.assign(plan_.microbatches, at::Tensor());
    gradInputs_.assign(plan_.microbatches, at::Tensor());
    if (k == 0) entryAfter_ = mem.current(ctx.rank());
    lossSum_ = 0;
    StepRecord record;
    record.warmup = stepCalls_ == 0;
    start_ = std::chrono::steady_clock::now();
    for (const Action& a : plan_.schedule.perRank[p_]) {
      computeStart_ = std::chrono::steady_clock::now();
      // run --trace: the action as a span (its name built only when traced).
      const harness::TraceScope span("action", harness::stepTracing() ? a.name() : std::string());
      // Its sends and receives are its stage's, in its phase (comm_site.h).
      const harness::CommSiteScope site(
          "stage" + std::to_string(a.stage),
          a.op == Op::kForward ? harness::StepPhase::kForward : harness::StepPhase::kBackward);
      try {
        run(ctx, a);
      } catch (const c10::Error& e) {
        // A schedule that cannot finish: what the dry run said of it, beside what happened.
        TORCH_CHECK(predicted_.deadlock.empty(), e.what_without_backtrace(),
                    " (the dry run: " + predicted_.deadlock + ")");
        throw;
      }
      const double t0 = std::chrono::duration<double, std::micro>(computeStart_ - start_).count();
      record.timeline.push_back({a, t0, now()});
    }
    for (auto& s : sends_) s->wait();
    sends_.clear();
    capturing_ = false;
    end = now();
    for (const auto& t : record.timeline) record.busyUs += t.endUs - t.startUs;
    record.endUs = end;
    steps_.push_back(std::move(record));
    const harness::CommSiteScope update("", harness::StepPhase::kUpdate);
    sumTiedGradients(ctx);
    if (plan_.dp > 1) {
      for (auto& [name, t] : owned_) ctx.group({1}).allReduce(t.mutable_grad());
    }
    if (training_) {
      // The loss: the last stage's micro-batches', summed over the replicas (every other rank
      // adds nothing); then the loop's norm (over the mesh), clipping and update.
      double loss = 0;
      {
        at::Tensor l = at::tensor({lossSum_}, at::kDouble);
        ctx.world().allReduce(l);
        loss = l.item<double>();
      }
      loop_->update(loss);
    }
  }
  ++stepCalls_;
}

// A tied parameter's gradient on each rank holding it is its stages' part: each holder sends
// its part to every other and receives theirs, then adds the parts in the holders' order, so that
// every holder has the same sum to the bit. (Each part is received into a buffer of its own; a
// holder's own part is changed only after its sends are done.)
void PipelineExecutor::sumTiedGradients(RankContext& ctx) {
  auto& pipe = ctx.group({0});
  for (const Tied& tied : tied_) {
    const std::vector<int>& holders = tied.holders;
    at::Tensor& g = owned_[tied.owned].second.mutable_grad();
    // Past every action's tag and the profile's ping-pong; by the parameter's place in the net,
    // which every holder agrees on (this rank's list holds only what it holds).
    const int tag = tagOf(plan_, plan_.schedule.stages, 1, 0) + tied.index;
    std::vector<std::unique_ptr<harness::Communicator::PendingSend>> out;
    for (int h : holders) {
      if (h != p_) out.push_back(pipe.isend(g, h, tag));
    }
    std::vector<at::Tensor> parts;
    for (int h : holders) {
      if (h == p_) {
        parts.push_back(g);
        continue;
      }
      parts.push_back(at::empty_like(g, at::MemoryFormat::Contiguous));
      pipe.recv(parts.back(), h, tag);
    }
    for (auto& s : out) s->wait();
    at::NoGradGuard noGrad;
    at::Tensor& sum = parts.front();
    for (size_t j = 1; j < parts.size(); ++j) sum.add_(parts[j]);
    if (!sum.is_same(g)) g.copy_(sum);
  }
}

void PipelineExecutor::settle(RankContext& ctx) {
  results_.clear();
  const auto shapeOf = [](const at::Tensor& t) { return t.sizes().vec(); };
  // Nothing of a tensor this rank does not hold: its rows none (in the case's floating dtype).
  const auto empty = [&](std::vector<int64_t> shape) {
    shape[0] = 0;
    return at::empty(shape, net_->target().options());
  };
  const int S = plan_.schedule.stages;
  results_["output"] =
      plan_.schedule.stageRank[S - 1] == p_ ? at::cat(outputs_, 0) : empty(shapeOf(net_->target()));
  // The input's gradient, where the chain differentiates its input (ids take none).
  if (!chainModel(case_)->idsInput) {
    results_["grad_input"] =
        plan_.schedule.stageRank[0] == p_ ? at::cat(gradInputs_, 0) : empty(shapeOf(net_->input()));
  }
  std::set<std::string> mine;
  for (const auto& [name, t] : owned_) {
    results_["grad/" + name] = t.grad();
    mine.insert(name);
  }
  for (const auto& [name, shape] : shapes_) {
    if (!mine.count(name)) results_["grad/" + name] = empty(shape);
  }
  results_["rng/cpu"] = at::detail::getDefaultCPUGenerator().get_state();
  if (net_->input().is_cuda()) {
    results_["rng/cuda"] = reference::deviceGeneratorState(net_->input().device());
  }
  if (training_) {
    // loss, grad_norm, this rank's param/ and state/, state/step; nothing of the others'.
    loop_->write(results_);
    for (const auto& [name, shape] : shapes_) {
      if (mine.count(name)) continue;
      results_["param/" + name] = empty(shape);
      for (const std::string& key : reference::optimizerStateKeys(case_.training.optimizer)) {
        results_["state/" + name + "/" + key] = empty(shape);
      }
    }
  }
  // The steps measured: every pipeline step since the warm-up (after the measured step, that
  // one; after the timing, the timed ones too: detailsCoverTiming), the warm-up's only where
  // nothing else ran. Every rank's busy time and end of each, gathered (uncounted: settle); the
  // measured bubble is the median step's (a single step's moves with whatever else the machine
  // runs), and its idle time per rank and timeline are the record's.
  std::vector<const StepRecord*> used;
  for (const auto& r : steps_) {
    if (!r.warmup) used.push_back(&r);
  }
  if (used.empty()) {
    for (const auto& r : steps_) used.push_back(&r);
  }
  TORCH_CHECK(!used.empty(), "pipeline: settle before any step");
  const int64_t n = static_cast<int64_t>(used.size());
  at::Tensor mineT = at::empty({n, 2}, at::kDouble);
  for (int64_t j = 0; j < n; ++j) {
    mineT[j][0] = used[j]->busyUs;
    mineT[j][1] = used[j]->endUs;
  }
  const at::Tensor all = ctx.group({0}).allGather(mineT, std::vector<int64_t>(plan_.pp, n));
  const auto allAcc = all.accessor<double, 2>();  // rank r's step j at row r * n + j
  std::vector<double> stepOf(n, 0.0), bubbleOf(n, 0.0);
  for (int64_t j = 0; j < n; ++j) {
    for (int r = 0; r < plan_.pp; ++r) stepOf[j] = std::max(stepOf[j], allAcc[r * n + j][1]);
    double idleJ = 0;
    for (int r = 0; r < plan_.pp; ++r) idleJ += stepOf[j] - allAcc[r * n + j][0];
    bubbleOf[j] = stepOf[j] > 0 ? idleJ / (plan_.pp * stepOf[j]) : 0.0;
  }
  std::vector<int64_t> byBubble(n);
  for (int64_t j = 0; j < n; ++j) byBubble[j] = j;
  std::sort(byBubble.begin(), byBubble.end(),
            [&](int64_t a, int64_t b) { return bubbleOf[a] < bubbleOf[b]; });
  const int64_t jm = byBubble[(n - 1) / 2];
  const double step = stepOf[jm];
  double idle = 0;
  std::vector<double> idlePerRank;
  for (int r = 0; r < plan_.pp; ++r) {
    idlePerRank.push_back(step - allAcc[r * n + jm][0]);
    idle += idlePerRank.back();
  }
  // And every rank's actions in that step (each action's compute, after what it received, to
  // its end), gathered: the measured run in the dry run's form, for the report's timeline and
  // Chrome trace.
  Simulation measured;
  {
    const std::vector<TimedAction>& timeline = used[jm]->timeline;
    std::vector<int64_t> counts;
    for (int r = 0; r < plan_.pp; ++r) {
      counts.push_back(static_cast<int64_t>(plan_.schedule.perRank[r].size()));
    }
    at::Tensor times = at::empty({static_cast<int64_t>(timeline.size()), 2}, at::kDouble);
    for (size_t k = 0; k < timeline.size(); ++k) {
      times[k][0] = timeline[k].startUs;
      times[k][1] = timeline[k].endUs;
    }
    TORCH_CHECK(times.size(0) == counts[p_], "pipeline rank ", p_, " timed ", times.size(0),
                " actions of its ", counts[p_]);
    const at::Tensor every = ctx.group({0}).allGather(times, counts);
    const auto acc = every.accessor<double, 2>();
    int64_t row = 0;
    for (int r = 0; r < plan_.pp; ++r) {
      RankTimeline t;
      for (const Action& a : plan_.schedule.perRank[r]) {
        t.actions.push_back({a, acc[row][0], acc[row][1]});
        t.busyUs += acc[row][1] - acc[row][0];
        ++row;
      }
      measured.ranks.push_back(std::move(t));
    }
    measured.stepUs = step;
    measured.bubbleFraction = step > 0 ? idle / (plan_.pp * step) : 0.0;
  }
  std::vector<double> predictedIdle;
  for (const auto& rt : predicted_.ranks) predictedIdle.push_back(predicted_.stepUs - rt.busyUs);
  auto& d = details_["pipeline"];
  d["schedule"] = plan_.schedule.name;
  d["stages"] = S;
  d["microbatches"] = plan_.microbatches;
  d["stage_layers"] = plan_.cut;
  d["measured"] = {{"step_us", step},
                   {"idle_us_per_rank", idlePerRank},
                   {"bubble_fraction", step > 0 ? idle / (plan_.pp * step) : 0.0},
                   {"steps", n},
                   {"bubble_fraction_min", bubbleOf[byBubble.front()]},
                   {"bubble_fraction_max", bubbleOf[byBubble.back()]}};
  d["predicted"] = {{"step_us", predicted_.stepUs},
                    {"idle_us_per_rank", predictedIdle},
                    {"bubble_fraction", predicted_.bubbleFraction}};
  if (!predicted_.deadlock.empty()) d["predicted"]["deadlock"] = predicted_.deadlock;
  // Both runs as `solve pipeline` writes them (reports/plots/pipeline_plot.py draws either).
  d["measured"]["run"] = simulationValue(plan_.schedule, measured);
  for (auto& r : d["measured"]["run"]["per_rank"]) {  // memory is the row's, not the timeline's
    for (const char* k : {"peak_activation_bytes", "peak_bytes", "peak_microbatches_in_flight"}) {
      r.erase(k);
    }
  }
  d["predicted"]["run"] = simulationValue(plan_.schedule, predicted_);
  // The bubble judged (harness/run/predict.cpp): the dry run's idle fraction within 10% of the
  // measured one, or within 2 points of the step where the bubble is small (a few hundred
  // microseconds of a millisecond step move with the machine's other work).
  if (predicted_.deadlock.empty() && step > 0) {
    details_["predictions"] =
        nlohmann::json::array({{{"what", "bubble"},
                                {"unit", "%"},
                                {"measured", 100 * idle / (plan_.pp * step)},
                                {"predicted", 100 * predicted_.bubbleFraction},
                                {"tolerance", kBubbleTolerance},
                                {"floor", 100 * kBubbleFloor}}});
  }
  // The costs the dry run ran on, in `solve pipeline --profile`'s format.
  nlohmann::json stages = nlohmann::json::array();
  for (const StageCost& c : costs_.stages) {
    nlohmann::json e = {{"forward_us", c.forwardUs},
                        {"backward_us", c.backwardUs},
                        {"backward_input_us", c.backwardInputUs},
                        {"backward_weight_us", c.backwardWeightUs}};
    for (const auto& [kind, b] :
         {std::pair<const char*, StageCost::Bytes>{"forward", c.forwardBytes},
          {"backward", c.backwardBytes},
          {"backward_input", c.backwardInputBytes},
          {"backward_weight", c.backwardWeightBytes}}) {
      e[std::string(kind) + "_net_bytes"] = b.net;
      e[std::string(kind) + "_peak_bytes"] = b.peak;
    }
    stages.push_back(e);
  }
  d["profile"] = {{"p2p_us", costs_.p2pUs}, {"stages", stages}};
  if (costs_.sharing.cores > 0) {
    d["profile"]["cores"] = costs_.sharing.cores;
    d["profile"]["threads"] = costs_.sharing.threads;
    d["profile"]["host_of"] = costs_.sharing.hostOf;
  }
  d["predicted"]["shared_cores"] = predicted_.coresShared;
  d["host"] = host_;
}

std::vector<std::pair<std::string, std::string>> PipelineExecutor::recordParams() const {
  return {{"schedule", plan_.schedule.name},
          {"stages", std::to_string(plan_.schedule.stages)},
          {"microbatches", std::to_string(plan_.microbatches)},
          {"data_parallel", std::to_string(plan_.dp)}};
}

}  // namespace sb::strategies::pipeline
