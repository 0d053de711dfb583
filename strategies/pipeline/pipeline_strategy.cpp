// Pipeline parallelism: `pipeline/<schedule>` runs a chain network (mlp_chain, gpt2_stack, or an
// imported model linearised: pipeline_model.cpp) cut by layers into stages, one per rank of mesh
// axis 0 (or, interleaved, several), through the
// actions of a schedule (schedule.h): GPipe, Megatron's 1F1B and interleaved 1F1B, Zero Bubble's
// ZB-H1, or a schedule read from torch.distributed.pipelining's CSV. On a 2-D mesh axis 1 is
// data parallel: each replica runs its rows' micro-batches through its pipeline, and the
// parameters' gradients are all-reduced over axis 1 after the step.
//
// An action on stage s and micro-batch m:
//   F  the stage's layers on the micro-batch: stage 0 reads the input's rows, every other stage
//      receives the previous stage's activation (Communicator::recv, tag (s, m)); the output is
//      sent on (isend, waited for at the end of the step, as torch.distributed.pipelining does)
//      or, on the last stage, kept, its gradient the target's rows (the loss is sum(y * target)).
//   B  the stage's backward from the next stage's input gradient (received): every parameter's
//      gradient accumulated in place, the input's gradient sent back (or, on stage 0, kept).
//   I  B's input gradient alone, the graph kept, what W starts from kept beside it; W its
//      parameters' gradients from there, nothing of the activations' side again
//      (split_backward.h), accumulated in place.
// The reference is the same micro-batches accumulated in order on one rank (the chain
// workloads' and the torchscript workload's shape key `microbatches`): where a schedule
// accumulates every stage's micro-batches in order 0..M-1 (each built in one does) and there is
// one replica, every tensor is bitwise equal; with data parallelism the replicas' sums are added
// in another order (a tolerance for a sum split over the replicas). An imported model's
// reference is the module's own forward and backward, its kernels rounding otherwise than the
// imported graph's operators where they differ (the default tolerance). A parameter that stages
// on several ranks read (GPT-2's tied embedding) is held by each: each accumulates its stages'
// part, and after the step the holders exchange parts and add them in rank order.
//
// Each rank records its actions' start and end in every step; the row's details have the
// measured idle time per rank and the bubble (idle rank time over ranks x step) of the median
// step (by bubble, the lower of two middle ones) among those after the warm-up, beside the dry
// run's (simulate()) on per-stage costs profiled in prepare (each rank times its stages' F and B,
// or I and W, on one micro-batch; the costs are all-gathered).
//
// Planted faults (tests): "grad_twice" (stage 0 accumulates micro-batch 1's gradients twice),
// "warmup_short" (1F1B with every rank's warm-up one forward short: the last stage's first
// backward comes before its forward, which the dry run names; the run times out naming the
// rank), "w_before_i" (ZB-H1 with stage 0's first W moved before its I: the executor refuses
// it), "send_wrong_stage" (interleaved: stage 0 sends micro-batch 0's activation as stage 2's:
// the receiving rank waits for what never comes, or takes the wrong activation).

#include <ATen/ATen.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <set>

#include "harness/error.h"
#include "harness/registry.h"
#include "reference/autograd_engine.h"
#include "strategies/pipeline/pipeline_executor.h"

namespace sb::strategies::pipeline {

using harness::Applicability;
using harness::Box;
using harness::Collective;
using harness::CommStats;

const char* faultName(Fault f) {
  switch (f) {
    case Fault::kNone:
      return "none";
    case Fault::kGradTwice:
      return "grad_twice";
    case Fault::kWarmupShort:
      return "warmup_short";
    case Fault::kWeightBeforeInput:
      return "w_before_i";
    case Fault::kSendWrongStage:
      return "send_wrong_stage";
  }
  return "?";
}

namespace {
std::string microbatchName(const Plan& p, int d, int m) {
  return "micro-batch " + std::to_string(m) + (p.dp > 1 ? " of replica " + std::to_string(d) : "");
}
}  // namespace

std::string stageOutputName(const Plan& p, int stage, int d, int m) {
  return "x[" + std::to_string(p.cut[stage + 1]) + "] of " + microbatchName(p, d, m);
}
std::string stageInputGradName(const Plan& p, int stage, int d, int m) {
  return "grad x[" + std::to_string(p.cut[stage]) + "] of " + microbatchName(p, d, m);
}
std::string accumulatedGradName(const Plan& p, const std::string& param, int d, int m) {
  return "grad " + param + " after " + microbatchName(p, d, m);
}

std::vector<harness::TraceValue> pipelineReferenceTrace(const Plan& p, const CaseSpec& c,
                                                        const reference::WorkloadData& data) {
  const auto net = makeChainNet(c, data);
  net->zeroGrad();
  const int S = static_cast<int>(p.cut.size()) - 1;
  const int64_t rows = net->input().size(0) / p.dp;
  // Each parameter's stage, where one stage alone reads it (another's gradient is a part of the
  // sum); -1 for a tied one.
  std::vector<int> stageOfParam;
  for (const auto& [name, t] : net->parameters()) {
    const auto layers = layersOf(c, name);
    const int s = p.stageOf(layers.front());
    stageOfParam.push_back(s == p.stageOf(layers.back()) ? s : -1);
  }
  std::vector<harness::TraceValue> out;
  const auto keep = [&](const char* phase, int s, std::string name, const at::Tensor& t) {
    out.push_back({"stage " + std::to_string(s), phase, std::move(name), t.detach().clone(), {}});
  };
  for (int d = 0; d < p.dp; ++d) {
    net->zeroGrad();  // each replica accumulates its own micro-batches
    const auto xs = net->input().narrow(0, d * rows, rows).chunk(p.microbatches, 0);
    const auto ts = net->target().narrow(0, d * rows, rows).chunk(p.microbatches, 0);
    for (int m = 0; m < p.microbatches; ++m) {
      std::vector<at::Tensor> in, outs;
      at::Tensor h = xs[m].contiguous();
      for (int s = 0; s < S; ++s) {
        in.push_back(at::isFloatingType(h.scalar_type()) ? h.detach().requires_grad_(true) : h);
        h = in.back();
        for (int l = p.cut[s]; l < p.cut[s + 1]; ++l) h = net->stage(l, h, true);
        outs.push_back(h);
        keep("forward", s, stageOutputName(p, s, d, m), h);
      }
      at::Tensor gy = ts[m].contiguous();
      for (int s = S; s-- > 0;) {
        reference::backward({outs[s]}, {gy});
        gy = in[s].grad();
        if (gy.defined()) keep("backward", s, stageInputGradName(p, s, d, m), gy);
        if (!p.inOrder) continue;
        for (size_t k = 0; k < net->parameters().size(); ++k) {
          if (stageOfParam[k] != s) continue;
          const auto& [name, t] = net->parameters()[k];
          keep("backward", s, accumulatedGradName(p, name, d, m), t.grad());
        }
      }
    }
  }
  return out;
}

namespace {

class PipelineStrategy final : public harness::Strategy {
 public:
  PipelineStrategy(std::string kind, Fault f)
      : Strategy("pipeline/" + kind, "pipeline " + kind, harness::Family::kPipeline),
        kind_(std::move(kind)),
        fault_(f) {}
  const std::string& kind() const { return kind_; }
  Fault fault() const { return fault_; }

  std::vector<std::string> caseParams() const override { return {"virtual_stages", "cut", "csv"}; }
  std::vector<std::pair<std::string, std::string>> params() const override {
    return {{"schedule", kind_},
            {"stages", "mesh axis 0 (interleaved: virtual_stages per rank)"},
            {"case params",
             "virtual_stages (interleaved-1f1b, default 2), cut (layers | balanced: one per "
             "block, gpt2_stack's final layer norm nearly none; an imported model's layers by "
             "their graph nodes), csv (pipeline/csv: the schedule file)"}};
  }

  // A malformed parameter, or a schedule file that cannot be read, is bad input (exit 2),
  // not a case the pipeline cannot run.
  static void input(bool ok, const std::string& what) {
    if (!ok) throw harness::InputError(what);
  }

  int virtualStages(const CaseSpec& c) const {
    if (!c.params.contains("virtual_stages")) return kind_ == "interleaved-1f1b" ? 2 : 1;
    const auto& j = c.params["virtual_stages"];
    input(j.is_number_integer() && j.get<int64_t>() >= 1 && j.get<int64_t>() <= 64,
          "params.virtual_stages must be an integer from 1 to 64, got " + j.dump());
    return static_cast<int>(j.get<int64_t>());
  }

  static std::string cutOf(const CaseSpec& c) {
    if (!c.params.contains("cut")) return "layers";
    const auto& j = c.params["cut"];
    input(j.is_string() && (j.get<std::string>() == "layers" || j.get<std::string>() == "balanced"),
          "params.cut must be layers or balanced, got " + j.dump());
    return j.get<std::string>();
  }

  // params.csv's schedule, read and checked on its own (readScheduleFile): bad input.
  static Schedule csvSchedule(const std::string& file) {
    try {
      return readScheduleFile(file);
    } catch (const ScheduleError& e) {
      throw harness::InputError(std::string("params.csv: ") + e.what());
    }
  }

  // The plan a case makes, or why it cannot run: made once per case (a CSV read once), then
  // the same for every call.
  Plan plan(const CaseSpec& c) const {
    const std::string key = c.suite + "\n" + c.name + "\n" + c.meshString() + "\n" +
                            c.shape.dump() + "\n" + c.params.dump();
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = plans_.find(key);
      if (it != plans_.end()) return it->second;
    }
    Plan p = makePlan(c);
    std::lock_guard<std::mutex> lock(mu_);
    plans_.emplace(key, p);
    return p;
  }

  Plan makePlan(const CaseSpec& c) const {
    const auto model = chainModel(c);
    TORCH_CHECK(model, "a pipeline runs mlp_chain, gpt2_stack or an imported model");
    const int L = model->layers;
    Plan p;
    p.pp = static_cast<int>(c.mesh.at(0));
    p.dp = c.mesh.size() == 2 ? static_cast<int>(c.mesh[1]) : 1;
    const int64_t total = c.shape.is_object() ? c.shape.value("microbatches", int64_t{1}) : 1;
    TORCH_CHECK(total >= 1 && total <= 100000, "the shape's microbatches must be 1 to 100000, got ",
                total);
    TORCH_CHECK(total % p.dp == 0, "the shape's ", total, " micro-batches do not split over ", p.dp,
                " data-parallel replicas");
    p.microbatches = static_cast<int>(total / p.dp);
    const int v = virtualStages(c);
    if (kind_ == "csv") {
      const std::string file = c.params["csv"].get<std::string>();
      p.schedule = csvSchedule(file);
      input(p.schedule.ranks == p.pp, file + " schedules " + std::to_string(p.schedule.ranks) +
                                          " ranks; the mesh's axis 0 has " + std::to_string(p.pp));
      input(p.schedule.microbatches == p.microbatches,
            file + " has " + std::to_string(p.schedule.microbatches) +
                " micro-batches; the case runs " + std::to_string(p.microbatches) + " per replica");
    } else {
      p.schedule = makeSchedule(kind_, p.pp, p.microbatches, v);
    }
    plant(p.schedule);
    validate(p.schedule);
    TORCH_CHECK(p.schedule.stages <= L, "the chain has ", L, " layers, fewer than the ",
                p.schedule.stages, " stages");
    for (int s = 0; s + 1 < p.schedule.stages; ++s) {
      TORCH_CHECK(p.schedule.stageRank[s] != p.schedule.stageRank[s + 1], "stages ", s, " and ",
                  s + 1, " are both on rank ", p.schedule.stageRank[s],
                  ": neighbouring stages on one rank (V-shaped schedules) are not run yet");
    }
    if (cutOf(c) == "layers") {
      p.cut = evenStages(L, p.schedule.stages);
    } else {
      p.cut = balanceStages(model->layerCost, p.schedule.stages);
    }
    // In order where every stage's B (or W) run micro-batches 0..M-1.
    for (const auto& actions : p.schedule.perRank) {
      std::map<int, int> next;
      for (const Action& a : actions) {
        if (a.op != Op::kBackward && a.op != Op::kBackwardWeight) continue;
        if (a.microbatch != next[a.stage]++) p.inOrder = false;
      }
    }
    return p;
  }

  // The params, each on its own (what fits the case is plan's): bad input (exit 2) whether
  // or not the strategy runs the case.
  void checkParams(const CaseSpec& c) const override {
    virtualStages(c);
    cutOf(c);
    if (c.params.contains("csv")) {
      input(c.params["csv"].is_string(),
            "params.csv must be the path of a schedule file, got " + c.params["csv"].dump());
      // Read, parsed and dry-run by the one strategy that runs it (a pattern over the other
      // schedules reads it not at all).
      if (kind_ == "csv") csvSchedule(c.params["csv"].get<std::string>());
    }
  }

  Applicability applies(const CaseSpec& c) const override {
    if (kind_ == "csv" && !c.params.contains("csv")) {
      return Applicability::notApplicable("a case without params.csv (the schedule file)");
    }
    if (!cutsIntoStages(c.workload)) {
      return Applicability::notApplicable(
          "not a chain network without batch norm (mlp_chain, gpt2_stack) or an imported model");
    }
    if (c.mesh.size() > 2 || c.mesh.at(0) < 2) {
      return Applicability::unsupported(
          "a pipeline runs on 2 ranks or more of a 1-D mesh, or "
          "of axis 0 of a 2-D one (axis 1 data parallel); the case "
          "has " +
          c.meshString());
    }
    if (c.workload != "torchscript" && c.shape.is_object() &&
        c.shape.value("dropout", 0.1) != 0.0) {
      return Applicability::unsupported(
          "dropout must be 0: the stages draw their masks in another order than the reference");
    }
    try {
      plan(c);
    } catch (const harness::InputError&) {
      throw;
    } catch (const std::exception& e) {
      std::string msg = e.what();
      if (auto* ce = dynamic_cast<const c10::Error*>(&e)) msg = ce->what_without_backtrace();
      return Applicability::unsupported(msg);
    }
    return Applicability::yes();
  }

  std::unique_ptr<harness::RankExecutor> makeExecutor(const CaseSpec& c) const override {
    return std::make_unique<PipelineExecutor>(plan(c), fault_, c);
  }
  std::vector<harness::TraceValue> referenceTrace(
      const CaseSpec& c, const reference::WorkloadData& data) const override {
    return pipelineReferenceTrace(plan(c), c, data);
  }
  bool trainsSteps() const override { return true; }

  Box resultBox(const std::string&, const CaseSpec&, int) const override {
    TORCH_INTERNAL_ASSERT(false, "pipeline results are boxed by resultBoxOf");
  }
  // Output and input gradient: the replica's rows, on the rank of the last (first) stage;
  // a parameter's gradient whole on the rank of its stage; nothing elsewhere.
  Box resultBoxOf(const std::string& tensor, const CaseSpec& c, int rank,
                  at::IntArrayRef shape) const override {
    const Plan p = plan(c);
    const int pipeRank = rank / p.dp, replica = rank % p.dp;
    Box box = Box::whole(shape);
    const auto none = [&] {
      Box b = Box::whole(shape);
      if (!b.length.empty()) b.length[0] = 0;
      return b;
    };
    if (tensor == "rng/cpu" || tensor == "rng/cuda" || harness::isWholeTrainingResult(tensor)) {
      return box;
    }
    if (tensor == "output" || tensor == "grad_input") {
      const int stage = tensor == "output" ? p.schedule.stages - 1 : 0;
      if (p.schedule.stageRank[stage] != pipeRank) return none();
      const int64_t rows = shape[0] / p.dp;
      box.offset[0] = replica * rows;
      box.length[0] = rows;
      return box;
    }
    // Every rank holding a stage that reads the parameter (a tied one's, summed over them):
    // grad/<name>, param/<name>, state/<name>/<key>. (An imported model's names are looked up
    // whole; the built-in chains' by their first component, which hid the key.)
    std::string name = tensor.substr(tensor.find('/') + 1);
    if (tensor.rfind("state/", 0) == 0) name = name.substr(0, name.rfind('/'));
    for (int layer : layersOf(c, name)) {
      if (p.schedule.stageRank[p.stageOf(layer)] == pipeRank) return box;
    }
    return none();
  }

  CommStats predictComm(const CaseSpec& c, int rank) const override {
    return harness::totalOf(*predictCommByNode(c, rank));
  }
  // Per stage ("stage0", ...) and phase: a forward action's receive and send, a backward
  // action's; outside the stages, in the update, the replicas' gradient all-reduces and the
  // loss's and the norm's.
  std::optional<std::vector<harness::NodeComm>> predictCommByNode(const CaseSpec& c,
                                                                  int rank) const override {
    const Plan p = plan(c);
    const int me = rank / p.dp;
    const auto model = chainModel(c);
    // What crosses into layer b (one micro-batch's activation, or its gradient back).
    const auto bytesOf = [&](int b) { return model->boundaryBytes.at(static_cast<size_t>(b)); };
    std::vector<harness::NodeComm> nodes;
    const auto at = [&](const std::string& node, const char* phase) -> CommStats& {
      return harness::commAt(nodes, node, phase);
    };
    for (const Action& a : p.schedule.perRank[me]) {
      const int S = p.schedule.stages;
      const bool fwd = a.op == Op::kForward,
                 bwd = a.op == Op::kBackward || a.op == Op::kBackwardInput;
      if (!fwd && !bwd) continue;
      CommStats& out = at("stage" + std::to_string(a.stage), fwd ? "forward" : "backward");
      if (fwd && a.stage > 0 && p.schedule.stageRank[a.stage - 1] != me) {
        out.add(Collective::kSendRecv, 0);  // receive
      }
      if (fwd && a.stage < S - 1 && p.schedule.stageRank[a.stage + 1] != me) {
        out.add(Collective::kSendRecv, bytesOf(p.cut[a.stage + 1]));
      }
      if (bwd && a.stage < S - 1 && p.schedule.stageRank[a.stage + 1] != me) {
        out.add(Collective::kSendRecv, 0);
      }
      if (bwd && a.stage > 0 && p.schedule.stageRank[a.stage - 1] != me) {
        out.add(Collective::kSendRecv, bytesOf(p.cut[a.stage]));
      }
    }
    // After the step: a tied parameter's gradient sent to every other rank holding it and theirs
    // received; then every held parameter's gradient all-reduced over the replicas.
    // (A built-in chain ties no parameter: its net is built for the shapes only with replicas.)
    if (p.dp > 1 || model->imported) {
      const int64_t es = static_cast<int64_t>(c10::elementSize(c.dtype));
      for (const auto& [name, dims] : parameterShapes(c)) {
        int64_t bytes = es;
        for (int64_t d : dims) bytes *= d;
        const std::vector<int> holders = holdersOf(p, layersOf(c, name));
        if (std::find(holders.begin(), holders.end(), me) == holders.end()) continue;
        for (size_t k = 1; k < holders.size(); ++k) {
          at("", "update").add(Collective::kSendRecv, bytes);
          at("", "update").add(Collective::kSendRecv, 0);
        }
        if (p.dp > 1) at("", "update").add(Collective::kAllReduce, bytes);
      }
    }
    if (!c.training.enabled()) return nodes;
    // Each step: the above; the loss and the norm's squares, each one float64 over the mesh.
    at("", "update").add(Collective::kAllReduce, 8);
    at("", "update").add(Collective::kAllReduce, 8);
    for (auto& n : nodes) n.comm.scale(c.training.steps);
    return nodes;
  }

  harness::Tolerance tolerance(const std::string& tensor, const CaseSpec& c,
                               const at::Tensor& expected) const override {
    const Plan p = plan(c);
    harness::Tolerance t;
    // A parameter read by several stages (tied): each stage accumulates its part over the
    // micro-batches, then the parts are added; the reference adds the parts per micro-batch.
    int readers = 1;
    std::string name;
    if (tensor.rfind("grad/", 0) == 0 || tensor.rfind("param/", 0) == 0) {
      name = tensor.substr(tensor.find('/') + 1);
    } else if (tensor.rfind("state/", 0) == 0 && tensor.find('/', 6) != std::string::npos) {
      name = tensor.substr(6, tensor.rfind('/') - 6);  // state/<parameter>/<key>
    }
    if (!name.empty()) {
      std::set<int> stages;
      for (int l : layersOf(c, name)) stages.insert(p.stageOf(l));
      readers = static_cast<int>(stages.size());
    }
    if (readers > 1) {
      t = harness::splitReductionTolerance(harness::Tolerance::defaultFor(c.dtype), c.dtype,
                                           p.microbatches * p.dp * readers, readers * p.dp,
                                           expected);
      t.reason = "a tied parameter: its " + std::to_string(readers) +
                 " stages' sums over the micro-batches added, where the reference adds their "
                 "parts per micro-batch: " +
                 t.reason;
    } else if (p.dp == 1 && p.inOrder && c.workload == "torchscript") {
      // The stages run the imported graph (its decompositions: linear as a transpose, views and
      // addmm; its norms' and rotary embeddings' operators), the reference the module's own
      // kernels: rounded otherwise where they differ (LLaMA's graph), to the bit where they do
      // not (GPT-2's). The schedule's own arithmetic is the graph's accumulated in order.
      t = harness::Tolerance::defaultFor(c.dtype);
      t.reason = "the imported graph's operators against the module's kernels: " + t.reason;
    } else if (p.dp == 1 && p.inOrder) {
      t = harness::Tolerance::bitwise(
          "the reference's micro-batches, accumulated in the schedule's order");
    } else {
      t = harness::splitReductionTolerance(harness::Tolerance::defaultFor(c.dtype), c.dtype,
                                           p.microbatches * p.dp, std::max(2, p.dp), expected);
      t.reason = std::string(p.dp > 1 ? "the replicas' sums added" : "micro-batches accumulated") +
                 " in another order than the reference's: " + t.reason;
    }
    if (!c.training.enabled()) return t;
    // Over steps: the gradient norm is a sum of squares split over the stages' ranks, so it is
    // not the reference's bits; where the norm clips, every update after depends on it.
    const auto splitNorm = [&] {
      harness::Tolerance n =
          harness::splitReductionTolerance(harness::Tolerance::defaultFor(c.dtype), c.dtype,
                                           int64_t{1} << 20, p.pp * p.dp, expected);
      n.reason = "the norm's squares summed per stage, then over the ranks: " + n.reason;
      return n;
    };
    if (tensor == "grad_norm")
      return harness::overSteps(splitNorm(), c.dtype, c.training.steps, expected);
    if (c.training.optimizer.clipGradNorm > 0 &&
        !(t.exact && tensor == "loss" && c.training.steps == 1)) {
      return harness::overSteps(t.exact ? splitNorm() : t, c.dtype, c.training.steps, expected);
    }
    return harness::overSteps(t, c.dtype, c.training.steps, expected);
  }

  // Memory: the dry run on each action's profiled bytes, claimed to the byte. Time: recorded
  // beside the measurement, not judged (ranks sharing cores on a CPU are not the pipeline's
  // devices).
  PredictionTolerance predictionTolerance() const override {
    return PredictionTolerance::exactMemory();
  }

  std::vector<std::string> plantableFaults() const override {
    if (kind_ == "1f1b") return {faultName(Fault::kGradTwice), faultName(Fault::kWarmupShort)};
    if (kind_ == "zb-h1") return {faultName(Fault::kWeightBeforeInput)};
    if (kind_ == "interleaved-1f1b") return {faultName(Fault::kSendWrongStage)};
    return {};
  }
  std::unique_ptr<harness::Strategy> withPlantedFault(const std::string& name) const override {
    for (Fault f : {Fault::kGradTwice, Fault::kWarmupShort, Fault::kWeightBeforeInput,
                    Fault::kSendWrongStage}) {
      const auto ok = plantableFaults();
      if (name == faultName(f) && std::find(ok.begin(), ok.end(), name) != ok.end()) {
        return std::make_unique<PipelineStrategy>(kind_, f);
      }
    }
    return nullptr;
  }

 private:
  // The schedule faults: a warm-up one forward short, a W before its I.
  void plant(Schedule& s) const {
    if (fault_ == Fault::kWarmupShort) {
      for (auto& actions : s.perRank) {
        // The first backward one place earlier (before the last warm-up forward).
        auto b = std::find_if(actions.begin(), actions.end(),
                              [](const Action& a) { return a.op == Op::kBackward; });
        if (b != actions.begin() && b != actions.end()) std::iter_swap(b - 1, b);
      }
    }
    if (fault_ == Fault::kWeightBeforeInput) {
      auto& actions = s.perRank.front();
      auto i = std::find_if(actions.begin(), actions.end(),
                            [](const Action& a) { return a.op == Op::kBackwardInput; });
      auto w = std::find_if(actions.begin(), actions.end(), [&](const Action& a) {
        return a.op == Op::kBackwardWeight && a.microbatch == i->microbatch;
      });
      const Action moved = *w;
      actions.erase(w);
      actions.insert(i, moved);
    }
  }

  std::string kind_;
  Fault fault_;
  mutable std::mutex mu_;
  mutable std::map<std::string, Plan> plans_;
};

std::vector<std::unique_ptr<harness::Strategy>> registerPipeline() {
  std::vector<std::unique_ptr<harness::Strategy>> out;
  for (const std::string& k : scheduleKinds()) {
    out.push_back(std::make_unique<PipelineStrategy>(k, Fault::kNone));
  }
  out.push_back(std::make_unique<PipelineStrategy>("csv", Fault::kNone));
  return out;
}

}  // namespace
}  // namespace sb::strategies::pipeline

SB_REGISTER_STRATEGIES(sb::strategies::pipeline::registerPipeline);
