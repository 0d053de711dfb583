// What a pipeline rank's dry run predicts with (pipeline_executor.h): each of its stages' actions
// timed and their bytes measured on one micro-batch in prepare, a hop between neighbours, and
// the prediction of the step's peak from the dry run's walk.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/autograd.h>

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <map>
#include <set>
#include <thread>

#include "harness/measure/memory.h"
#include "strategies/pipeline/pipeline_executor.h"

namespace sb::strategies::pipeline {

using harness::Collective;

namespace {
double usSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

// Each of this rank's stages timed on micro-batch 0 (forward; backward, or its input and weight
// halves), the median of three, one rank at a time (the others wait), so that each cost is the
// stage's alone on its host; every stage's gathered; the dry run on them, the ranks of a host
// taking turns on its cores where they are more than it has (Costs::sharing).
void PipelineExecutor::profile(RankContext& ctx) {
  const int S = plan_.schedule.stages;
  at::Tensor mine = at::zeros({S, 4}, at::kDouble);
  auto& world = ctx.world();
  for (int turn = 0; turn < world.size(); ++turn) {
    at::Tensor token = at::zeros({1}, at::kDouble);
    if (turn == world.rank()) timeStages(mine, 3);
    world.allReduce(token);  // the next rank's turn
  }
  // Each stage's row is nonzero on its rank only: summed over the pipeline, every stage's.
  at::Tensor all = mine.clone();
  ctx.group({0}).allReduce(all);
  Costs costs;
  costs.sharing = hostSharing(ctx);
  // One hop of an activation between neighbours: half a ping-pong's round trip, timed on one
  // clock (ranks 2k and 2k + 1), the median of five after one to warm up; the pairs' mean.
  auto& pipe = ctx.group({0});
  const bool pinger = p_ % 2 == 0 && p_ + 1 < plan_.pp, ponger = p_ % 2 == 1;
  const int kPing = tagOf(plan_, S, 0, 0), kPong = kPing + 1;  // past every action's tag
  // The ball: the first activation that crosses to another rank (micro-batch 0's, at the first
  // cut).
  const at::Tensor first = samples_.at(plan_.cut.at(1)).contiguous();
  at::Tensor ball = at::empty_like(first);
  std::vector<double> hops;
  for (int rep = 0; rep < 6 && (pinger || ponger); ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    if (pinger) {
      auto sent = pipe.isend(first, p_ + 1, kPing);
      pipe.recv(ball, p_ + 1, kPong);
      sent->wait();
      if (rep > 0) hops.push_back(usSince(t0) / 2);
    } else {
      pipe.recv(ball, p_ - 1, kPing);
      pipe.isend(ball, p_ - 1, kPong)->wait();
    }
  }
  std::sort(hops.begin(), hops.end());
  at::Tensor hop = at::tensor(
      {hops.empty() ? 0.0 : hops[hops.size() / 2], hops.empty() ? 0.0 : 1.0}, at::kDouble);
  pipe.allReduce(hop);
  costs.p2pUs = hop[0].item<double>() / std::max(1.0, hop[1].item<double>());
  for (int s = 0; s < S; ++s) {
    StageCost c;
    c.forwardUs = all[s][0].item<double>();
    c.backwardUs = all[s][1].item<double>();
    c.backwardInputUs = all[s][2].item<double>();
    c.backwardWeightUs = all[s][3].item<double>();
    costs.stages.push_back(c);
  }
  profileMemory(ctx, costs);
  costs_ = costs;
  predicted_ = simulate(plan_.schedule, costs);
  if (predicted_.deadlock.empty()) predictedStepUs_ = predicted_.stepUs;
}

// Each of this rank's stages timed on micro-batch 0, the median of `reps`: its row of `mine`
// (forward, backward, input gradient, weight gradient).
void PipelineExecutor::timeStages(at::Tensor& mine, int reps) {
  for (int stage = 0; stage < plan_.schedule.stages; ++stage) {
    if (plan_.schedule.stageRank[stage] != p_) continue;      // every stage of this rank's, with
    const std::vector<at::Tensor>& params = paramsOf(stage);  // parameters or none
    std::vector<double> f, b, i, w;
    for (int rep = 0; rep < reps; ++rep) {
      // The stage's input as micro-batch 0 reaches it (ids take no gradient).
      at::Tensor x = samples_.at(plan_.cut[stage]).detach().clone();
      const bool differentiable = at::isFloatingType(x.scalar_type());
      if (differentiable) x.requires_grad_(true);
      auto t0 = std::chrono::steady_clock::now();
      at::Tensor y = stageForward(stage, x);
      f.push_back(usSince(t0));
      const at::Tensor g = at::ones_like(y);
      // I and W as run() runs them (split_backward.h).
      WeightPass wp;
      t0 = std::chrono::steady_clock::now();
      backwardInput(x, y, g, params, wp);
      i.push_back(usSince(t0));
      std::vector<at::Tensor> before;
      for (const at::Tensor& p : params) before.push_back(p.grad().clone());
      t0 = std::chrono::steady_clock::now();
      backwardWeight(wp, params);
      w.push_back(usSince(t0));
      {
        at::NoGradGuard noGrad;  // the parameters' gradients as they were
        for (size_t k = 0; k < params.size(); ++k) params[k].mutable_grad().copy_(before[k]);
      }
      y = stageForward(stage, x);
      std::vector<at::Tensor> all = params;
      if (differentiable) all.push_back(x);
      t0 = std::chrono::steady_clock::now();
      if (!all.empty() && y.requires_grad()) torch::autograd::grad({y}, all, {g});
      b.push_back(usSince(t0));
    }
    const auto median = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    mine[stage][0] = median(f);
    mine[stage][1] = median(b);
    mine[stage][2] = median(i);
    mine[stage][3] = median(w);
  }
}

// The host each pipeline rank runs on and the cores it shares: every rank's host (its name's
// hash), cores and kernel threads, gathered over the mesh. Other replicas of the pipeline on a
// host (data parallelism's) run the same schedule beside it: this pipeline gets its share of
// the host's cores.
Costs::Sharing PipelineExecutor::hostSharing(RankContext& ctx) {
  auto& world = ctx.world();
  const int W = world.size();
  char name[256] = {};
  gethostname(name, sizeof(name) - 1);
  const double host = static_cast<double>(std::hash<std::string>{}(name) % (1u << 30));
  at::Tensor mine = at::zeros({W, 3}, at::kDouble);
  mine[world.rank()][0] = host;
  // The cores this process may run on (its affinity mask: a container's or taskset's), not the
  // machine's.
  int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) cores = std::max(1, CPU_COUNT(&set));
  mine[world.rank()][1] = static_cast<double>(cores);
  mine[world.rank()][2] = at::get_num_threads();
  world.allReduce(mine);
  const harness::DeviceMesh& mesh = ctx.mesh();
  const auto pipeline = mesh.groupRanks(world.rank(), {0});  // this replica's, by stage rank
  std::map<double, int> hostId, onHost, mineOnHost;
  Costs::Sharing sh;
  for (int r = 0; r < W; ++r) {
    hostId.try_emplace(mine[r][0].item<double>(), static_cast<int>(hostId.size()));
    ++onHost[mine[r][0].item<double>()];
  }
  for (int64_t r : pipeline) {
    const double h = mine[r][0].item<double>();
    sh.hostOf.push_back(hostId.at(h));
    ++mineOnHost[h];
  }
  const double h = mine[world.rank()][0].item<double>();
  sh.cores = mine[world.rank()][1].item<double>() * mineOnHost.at(h) / onHost.at(h);
  sh.threads = static_cast<int>(mine[world.rank()][2].item<double>());
  // A GPU per rank: its kernels run on the device, and ranks do not wait for each other's cores.
  if (reference::caseDevice().is_cuda()) sh.cores = 0;
  host_ = {{"cores", mine[world.rank()][1].item<double>()},
           {"kernel_threads_per_rank", sh.threads},
           {"ranks_on_host", onHost.at(h)}};
  return sh;
}

void PipelineExecutor::profileMemory(RankContext& ctx, Costs& costs) {
  auto& mem = harness::MemoryTracker::instance();
  const int r = ctx.rank(), S = plan_.schedule.stages;
  outputs_.assign(plan_.microbatches, at::Tensor());
  gradInputs_.assign(plan_.microbatches, at::Tensor());
  // Each stage's row is this rank's where it holds the stage; summed over the pipeline below.
  at::Tensor mine = at::zeros({S, 8}, at::kDouble);
  const int64_t start = mem.current(r);
  profiling_ = true;
  const auto measure = [&](int stage, Op op, int m = 0) {
    StageCost::Bytes b;
    const int64_t before = mem.current(r);
    b.peak = static_cast<double>(mem.heldDuring(r, [&] { run(ctx, {stage, op, m}); }));
    b.net = static_cast<double>(mem.current(r) - before);
    return b;
  };
  // Every kind of backward the rank's actions use on the stage (a CSV may mix B with I and W).
  std::set<std::pair<int, Op>> used;
  for (const Action& a : plan_.schedule.perRank[p_]) used.insert({a.stage, a.op});
  for (int s = 0; s < S; ++s) {
    if (plan_.schedule.stageRank[s] != p_) continue;
    const StageCost::Bytes f = measure(s, Op::kForward);
    mine[s][0] = f.net;
    mine[s][1] = f.peak;
    bool forwarded = true;
    if (used.count({s, Op::kBackward})) {
      const StageCost::Bytes b = measure(s, Op::kBackward);
      mine[s][2] = b.net;
      mine[s][3] = b.peak;
      forwarded = false;
    }
    if (used.count({s, Op::kBackwardInput})) {
      // Where B was measured on micro-batch 0, I and W on micro-batch 1 (a schedule mixing
      // them has two or more): micro-batch 0's kept output is not let go in between.
      const int m = forwarded ? 0 : 1;
      if (!forwarded) measure(s, Op::kForward, m);
      const StageCost::Bytes i = measure(s, Op::kBackwardInput, m);
      const StageCost::Bytes w = measure(s, Op::kBackwardWeight, m);
      mine[s][4] = i.net;
      mine[s][5] = i.peak;
      mine[s][6] = w.net;
      mine[s][7] = w.peak;
    }
  }
  profiling_ = false;
  held_.clear();
  stash_.clear();
  outputs_.clear();
  gradInputs_.clear();
  TORCH_CHECK(mem.current(r) == start, "pipeline: the memory profile left ", mem.current(r) - start,
              " bytes allocated");
  ctx.group({0}).allReduce(mine);
  for (int s = 0; s < S; ++s) {
    StageCost& c = costs.stages.at(static_cast<size_t>(s));
    c.forwardBytes = {mine[s][0].item<double>(), mine[s][1].item<double>()};
    c.backwardBytes = {mine[s][2].item<double>(), mine[s][3].item<double>()};
    c.backwardInputBytes = {mine[s][4].item<double>(), mine[s][5].item<double>()};
    c.backwardWeightBytes = {mine[s][6].item<double>(), mine[s][7].item<double>()};
  }
}

int64_t PipelineExecutor::Boundary::bytes() const {
  int64_t n = static_cast<int64_t>(c10::elementSize(c10::typeMetaToScalarType(options.dtype())));
  for (int64_t d : shape) n *= d;
  return n;
}

// The dry run's peak for this rank (its actions' profiled bytes in its order) above what was
// live once the step let the last step's outputs go; then, after the step waits for its sends
// and lets what they held go, data parallelism's all-reduce of each gradient (its scratch).
std::optional<int64_t> PipelineExecutor::predictedPeakBytes() const {
  // On a GPU, the split backward's autograd::grad runs on LibTorch's device threads, whose
  // allocations count against no rank: no claim there.
  if (!predicted_.deadlock.empty() || reference::caseDevice().is_cuda()) return std::nullopt;
  const int S = plan_.schedule.stages;
  double net = 0;
  int64_t sent = 0;  // what the step's sends hold until it waits for them
  for (const Action& a : plan_.schedule.perRank[p_]) {
    const StageCost& c = costs_.of(a.stage);
    switch (a.op) {
      case Op::kForward:
        net += c.forwardBytes.net;
        if (a.stage < S - 1) sent += boundary_.at(plan_.cut[a.stage + 1]).bytes();
        break;
      case Op::kBackward:
        net += c.backwardBytes.net;
        if (a.stage > 0) sent += boundary_.at(plan_.cut[a.stage]).bytes();
        break;
      case Op::kBackwardInput:
        net += c.backwardInputBytes.net;
        if (a.stage > 0) sent += boundary_.at(plan_.cut[a.stage]).bytes();
        break;
      case Op::kBackwardWeight:
        net += c.backwardWeightBytes.net;
        break;
    }
  }
  const auto scratchOf = [](harness::Communicator* comm, int64_t bytes, at::ScalarType t) {
    return comm ? comm->scratchBytes(Collective::kAllReduce, bytes, bytes, t) : int64_t{0};
  };
  // A tied parameter's gradient: the other holders' parts, received into buffers of their own.
  int64_t updateScratch = 0;
  for (const Tied& t : tied_) {
    updateScratch =
        std::max(updateScratch, static_cast<int64_t>(t.holders.size() - 1) *
                                    static_cast<int64_t>(owned_[t.owned].second.nbytes()));
  }
  if (plan_.dp > 1) {
    for (const auto& [name, t] : owned_) {
      updateScratch = std::max(
          updateScratch, scratchOf(dpComm_, static_cast<int64_t>(t.nbytes()), t.scalar_type()));
    }
  }
  // Each iteration (one, or the case's steps) from what was live once it let the last one's
  // outputs go (and, after the first update, the optimizer's state): its actions' walk; after
  // its sends are let go, data parallelism's all-reduce; training's loss (one float64,
  // all-reduced) and the update (measured: the most above what was live before the first).
  int64_t peak = entryBefore_;
  const int iterations = training_ ? case_.training.steps : 1;
  for (int k = 0; k < iterations; ++k) {
    const int64_t state = k > 0 ? update_.stateBytes : 0;
    const int64_t base = entryAfter_ + state;
    const int64_t end = base + static_cast<int64_t>(net) - sent;
    peak = std::max({peak, base + static_cast<int64_t>(predicted_.ranks.at(p_).peakBytes),
                     end + updateScratch});
    if (training_) {
      peak = std::max(
          {peak, end + 8 + scratchOf(worldComm_, 8, at::kDouble), end - state + update_.peak});
    }
  }
  return peak;
}

}  // namespace sb::strategies::pipeline
