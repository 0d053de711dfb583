// PyTorch's own strategies as executors: `torch/<name>`, run by PyTorch in Python processes under
// torch.distributed, verified, timed and profiled by the harness like any other row.
//
// Every rank of the case's mesh starts one Python process, rank_runner.py, with torchrun's
// environment (RANK, WORLD_SIZE, MASTER_ADDR, and a MASTER_PORT rank 0 picks and broadcasts);
// the processes meet in a gloo group and build a DeviceMesh of the case's shape. The harness
// keeps everything but the step: the case, the reference (LibTorch's, from the TorchScript file
// the user's model was traced to), the verdicts and the record. What crosses over:
//   prepare   the reference's initial parameters, buffers, data inputs and target, in a tensor
//             bundle (reference/tensor_bundle.h: safetensors' format) the Python side loads into
//             the module the file was traced from (the "python" entry trace_models.py writes beside
//             it, or the case's `params: {model: "file.py:name"}`), then hands to the strategy's
//             parallelize() as the user's code would be handed it;
//   step      the case's optimizer steps (or one forward and backward) from those parameters;
//             the measured one with its collectives counted by a dispatch mode over c10d's
//             operators and its allocations profiled (OutOfProcessStep);
//   settle    every rank's local tensors named as the reference names them (loss, grad_norm,
//             param/..., state/..., or output and grad/...), each with its DTensor placements
//             on the whole mesh.
// A local tensor is checked against the slice of the reference its placements declare
// (placement.h's nested torch.chunk, DTensor's); a tensor a rank does not report is not there
// (a pipeline stage's parameters live on its rank only: an empty box). Where a built-in strategy
// documents its layout (FSDP2 shards dim 0, DDP replicates, the Megatron plan's column- and
// row-wise weights), that specification is checked against the placements too (specifiedBox),
// so that a plan that left a weight replicated fails even where its numbers are right.
//
// The runners outlive a row (RunnerPool): starting Python and importing torch costs seconds a
// rank, a step milliseconds. `torch/dtensor/linear/<input>x<weight>x<bias>` is generated per
// linear case, one executor per layout of F.linear's operands, run by DTensor itself.
//
// The step's time is the harness's clock around the command (the pipe's round trip is in it,
// tens of microseconds); the runner's own clock is in the record's details. Memory: the peak of
// the profiler's allocation events over the step, on what was live at its start (parameters,
// gradients, optimizer state, buffers, inputs): the same meaning as the tracker's, but without
// the harness's own copies, which live in this process. Communication is counted, not modelled:
// predictComm() is the prediction stratbench's own executor of the same plan (its twin) makes,
// shown beside the counts and not judged (judgesComm).
//
// Missing or old Python or PyTorch: every row `unsupported`, saying what the probe found.
//
// Whole, for now: the kinds table, the probe, the runner pool, TorchStrategy and its rank
// executor share this file's unnamed namespace (Kind, Probe, RunnerPool, the layouts each
// rank reported), and it is the family's one translation unit of LibTorch's headers (a
// minute of the 2-core build a unit). The seams where it could be cut: the runner pool
// (freePort, PooledRunner, RunnerPool) into rank_process.cpp, which has no LibTorch; the
// layout specifications (specifiedBox, composeSpecifiedBox) into a file of their own once
// TorchStrategy's declaration moves into a header.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <regex>
#include <set>

#include "harness/comm/mesh.h"
#include "harness/error.h"
#include "harness/measure/verify.h"
#include "harness/registry.h"
#include "reference/moe.h"
#include "reference/tensor_bundle.h"
#include "reference/torchscript/export.h"
#include "reference/torchscript/import.h"
#include "reference/training.h"
#include "strategies/checkpointing/sac/policy.h"
#include "strategies/pipeline/schedule.h"
#include "strategies/sharding/layout/placement.h"
#include "strategies/sharding/moe/ep_axes.h"
#include "strategies/torch/rank_process.h"

namespace sb::strategies::torchside {
namespace {

using harness::Applicability;
using harness::Box;
using harness::CaseSpec;
using harness::CommStats;
using harness::Family;
using harness::Layout;
using harness::Placement;
using reference::readBundle;
using reference::TensorBundle;
using reference::writeBundle;

// A tensor's layout as a rank reported it: its placements, on a view of the tensor where
// they are a strided shard's (Box::view).
struct Reported {
  Layout layout;
  std::vector<int64_t> view;
};

struct Kind {
  std::string name;
  Family family;
  std::string twin;  // stratbench's executor of the same plan, or ""
  std::vector<std::string> faults;
  std::string summary;
};

const std::vector<Kind>& kinds() {
  // clang-format off
  static const std::vector<Kind> table = {
      {"ddp", Family::kFsdp, "sharding/fsdp/ddp", {"grad_divided_twice"},
       "DistributedDataParallel over a 1-D mesh"},
      {"fsdp2", Family::kFsdp, "sharding/fsdp/zero3", {"grad_divided_twice"},
       "fully_shard per block and the root, resharded after forward"},
      {"fsdp2-keep", Family::kFsdp, "sharding/fsdp/zero3", {"grad_divided_twice"},
       "fully_shard with reshard_after_forward=False"},
      {"hsdp", Family::kFsdp, "sharding/fsdp/hsdp", {"grad_divided_twice"},
       "fully_shard on a 2-D (replicate, shard) mesh"},
      {"tp", Family::kSharding, "", {"fused_qkv_colwise"},
       "parallelize_module, torchtitan's Megatron plan"},
      {"sp", Family::kSharding, "", {"norm_grad_partial", "fused_qkv_colwise"},
       "parallelize_module with sequence parallelism"},
      {"checkpoint", Family::kCheckpointing, "checkpointing/full",
       {"recompute_without_rng_state"}, "torch.utils.checkpoint around every block"},
      {"sac", Family::kCheckpointing, "", {"recompute_without_rng_state"},
       "selective activation checkpointing: matmuls saved, the rest recomputed"},
      {"pipeline-gpipe", Family::kPipeline, "pipeline/gpipe", {"grads_scaled_by_microbatches"},
       "torch.distributed.pipelining's ScheduleGPipe, one stage a rank"},
      {"pipeline-1f1b", Family::kPipeline, "pipeline/1f1b", {"grads_scaled_by_microbatches"},
       "torch.distributed.pipelining's Schedule1F1B, one stage a rank"},
      {"pipeline-interleaved-1f1b", Family::kPipeline, "pipeline/interleaved-1f1b",
       {"grads_scaled_by_microbatches"}, "ScheduleInterleaved1F1B, two looped stages a rank"},
      {"pipeline-interleaved-zb", Family::kPipeline, "", {"grads_scaled_by_microbatches"},
       "ScheduleInterleavedZeroBubble (backward split into input and weight gradients), two "
       "looped stages a rank"},
      {"pipeline-zbv", Family::kPipeline, "", {"grads_scaled_by_microbatches"},
       "ScheduleZBVZeroBubble, two stages a rank in a V (rank r: stages r and 2 pp - 1 - r)"},
      {"pipeline-csv", Family::kPipeline, "pipeline/csv", {"grads_scaled_by_microbatches"},
       "a schedule from params.csv (torch.distributed.pipelining's compute-only CSV) run by "
       "_PipelineScheduleRuntime, which adds the sends and receives"},
      {"cp", Family::kContextParallel, "sharding/cp/ring/allgather", {},
       "context_parallel, where this PyTorch runs it"},
      {"compose", Family::kComposed, "",
       {"clip_norm_one_axis", "norm_grad_partial", "grads_scaled_by_microbatches",
        "loss_not_mean_scaled", "output_not_tp"},
       "torchtitan's composition: pipelining x TP/SP x checkpointing x FSDP2/HSDP on an N-D mesh"},
      {"ep", Family::kExpertParallel, "sharding/moe/ep",
       {"grads_scaled_by_ep", "router_grad_partial", "experts_reduced_over_dp"},
       "expert parallelism on a PyTorch MoE layer: the experts DTensors sharded over ep, the rows "
       "dispatched and combined by all_to_all_single"},
      {"file", Family::kSharding, "", {},
       "a user's own parallelize(model, mesh, ctx), from params.strategy_file"},
  };
  // clang-format on
  return table;
}

std::string envOr(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

std::string pythonPath() { return envOr("SB_TORCH_PYTHON", SB_TORCH_PYTHON_DEFAULT); }
std::string runnerPath() {
  return envOr("SB_TORCH_RUNNER", std::string(SB_SOURCE_DIR) + "/strategies/torch/rank_runner.py");
}
// SB_TORCH_TIMEOUT_S, read whole: a number of seconds in (0, 1e6]. Anything else is bad input
// (exit 2 before any row: applies() asks first), never a row's error or a timeout of "5abc".
double timeoutSec() {
  const std::string v = envOr("SB_TORCH_TIMEOUT_S", "600");
  size_t used = 0;
  double t = 0;
  try {
    t = std::stod(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != v.size() || !(t > 0) || t > 1e6) {
    throw harness::InputError("SB_TORCH_TIMEOUT_S='" + v +
                              "': expected a number of seconds in (0, 1e6]");
  }
  return t;
}

// Whether the Python named by SB_TORCH_PYTHON has the PyTorch these executors need; asked once.
struct Probe {
  bool ok = false;
  std::string version;  // torch.__version__
  std::string why;
};
const Probe& probe() {
  static Probe p;
  static std::once_flag once;
  std::call_once(once, [] {
    const std::string py = pythonPath();
    const CommandOutput out =
        runCommand({py, "-c",
                    "import torch\n"
                    "from torch.distributed.fsdp import fully_shard\n"
                    "from torch.distributed.tensor import DTensor\n"
                    "from torch.distributed.tensor.parallel import parallelize_module\n"
                    "print(torch.__version__)"},
                   120);
    std::string text = out.output;
    while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
    if (out.status == 0) {
      p.ok = true;
      p.version = text.substr(text.rfind('\n') + 1);
      return;
    }
    const size_t nl = text.rfind('\n');
    p.why =
        "the torch/* executors need PyTorch 2.x with fully_shard and DTensor in the Python "
        "SB_TORCH_PYTHON names (" +
        py + "), which " +
        (out.status < 0 && text.find("cannot start") != std::string::npos
             ? "cannot be started"
             : "says: " + (nl == std::string::npos ? text : text.substr(nl + 1)));
  });
  return p;
}

// The module the case's model was traced from, as "file.py:name": params.model, or the
// "python" entry trace_models.py writes into the JSON beside the TorchScript file; for the moe
// workload, a MoE layer (params.model, or strategies/torch/moe_layer.py's). Empty, with `why`,
// where there is none.
std::string modelSource(const CaseSpec& c, std::string& why) {
  if (c.params.contains("model")) {
    const auto& m = c.params.at("model");
    if (!m.is_string() || m.get<std::string>().find(':') == std::string::npos) {
      throw harness::InputError("params.model: expected \"file.py:name\", got " + m.dump());
    }
    return m.get<std::string>();
  }
  if (c.workload == "moe") return std::string(SB_SOURCE_DIR) + "/strategies/torch/moe_layer.py:MoE";
  const std::string file = c.shape.value("file", "");
  // A torch.export archive is its own source: the ranks load and unflatten the program.
  if (reference::torchscript::isExportArchive(file))
    return std::filesystem::absolute(file).string();
  const std::string sidecar = file.substr(0, file.rfind('.')) + ".json";
  std::ifstream in(sidecar);
  nlohmann::json j;
  try {
    if (in) j = nlohmann::json::parse(in);
  } catch (const std::exception&) {
  }
  if (!j.contains("python") || !j["python"].contains("source")) {
    why = "no Python module to build: " + sidecar +
          " has no \"python\" entry (trace_models.py writes one) and the case no params.model "
          "(\"file.py:name\")";
    return "";
  }
  return j["python"]["source"].get<std::string>() + ":" + j["python"]["model"].get<std::string>();
}

// The case's params as the ranks read them: a schedule file's path made absolute (the ranks
// may start in another folder).
nlohmann::json runnerParams(const CaseSpec& c) {
  nlohmann::json p = c.params;
  if (p.contains("csv") && p["csv"].is_string()) {
    p["csv"] = std::filesystem::absolute(p["csv"].get<std::string>()).string();
  }
  return p;
}

int64_t freePort() {
  const int s = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  if (s < 0 || bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      getsockname(s, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    if (s >= 0) close(s);
    throw std::runtime_error("cannot find a free port for the PyTorch ranks to meet at");
  }
  close(s);
  return ntohs(a.sin_port);
}

// The rank runners this process keeps between rows, one per local rank: starting Python and
// importing torch costs seconds a rank, a row's step milliseconds. A runner goes back to the
// pool after a row that raised nothing; the next row reuses the whole set only where every rank
// still has its runner of the same generation and world (decided together, RunnerPool::take),
// else every rank starts a new one. Each runner's log is its own, kept while it lives.
struct PooledRunner {
  std::unique_ptr<RankProcess> proc;
  std::string dir;  // its log's folder
  int64_t generation = 0;
  int64_t group = 0;  // the ranks started together share it (rank 0's draw, broadcast)
  int world = 0;
  std::string python;
};

class RunnerPool {
 public:
  static RunnerPool& instance() {
    static RunnerPool pool;
    return pool;
  }
  ~RunnerPool() {
    for (auto& [rank, r] : byRank_) drop(r);
  }
  // This rank's runner for `world` ranks: the pooled one where every rank has one of the same
  // generation, else a new one started with `env` (every rank's old one ended first). A
  // collective of the world: every rank calls it.
  PooledRunner take(harness::RankContext& ctx, std::map<std::string, std::string> env) {
    const int rank = ctx.rank(), world = ctx.mesh().size();
    PooledRunner mine;
    {
      std::lock_guard<std::mutex> lock(mu_);
      const auto it = byRank_.find(rank);
      if (it != byRank_.end()) {
        mine = std::move(it->second);
        byRank_.erase(it);
      }
    }
    at::Tensor gen = at::full({1}, mine.proc ? mine.generation : -1, at::kLong);
    ctx.world().broadcast(gen, 0);
    const bool usable = mine.proc && mine.generation == gen.item<int64_t>() &&
                        mine.world == world && mine.python == pythonPath();
    at::Tensor ok = at::full({1}, usable ? 1 : 0, at::kLong);
    ctx.world().allReduce(ok);
    if (ok.item<int64_t>() == world) return mine;
    drop(mine);
    // The ranks meet at a port rank 0 finds free, told to every rank before they start.
    at::Tensor port = at::zeros({2}, at::kLong);
    if (rank == 0) {
      port[0] = freePort();
      port[1] = ++groups_;
    }
    ctx.world().broadcast(port, 0);
    env["MASTER_PORT"] = std::to_string(port[0].item<int64_t>());
    PooledRunner fresh;
    fresh.group = port[1].item<int64_t>();
    char dirTemplate[] = "/tmp/sb-torch-rank-XXXXXX";
    if (!mkdtemp(dirTemplate)) throw std::runtime_error("cannot make a folder under /tmp");
    fresh.dir = dirTemplate;
    fresh.generation = std::max<int64_t>(gen.item<int64_t>(), 0) + 1;
    fresh.world = world;
    fresh.python = pythonPath();
    fresh.proc =
        std::make_unique<RankProcess>(std::vector<std::string>{fresh.python, "-u", runnerPath()},
                                      env, fresh.dir + "/rank" + std::to_string(rank) + ".log");
    return fresh;
  }
  // A rank of `group` failed (its runner answered an error, or none): its peers, blocked in a
  // collective with it, are abandoned at once rather than waiting out SB_TORCH_TIMEOUT_S.
  void fail(int64_t group, int rank, const std::string& why) {
    std::lock_guard<std::mutex> lock(mu_);
    failures_.emplace(group, std::make_pair(rank, why.substr(0, 400)));
  }
  // Why `rank` of `group` is abandoned: another rank's failure, or "".
  std::string abandoned(int64_t group, int rank) {
    std::lock_guard<std::mutex> lock(mu_);
    const auto it = failures_.find(group);
    if (it == failures_.end() || it->second.first == rank) return "";
    return "rank " + std::to_string(it->second.first) + " failed first (" + it->second.second + ")";
  }
  // Back after a row that raised nothing.
  void give(int rank, PooledRunner r) {
    std::lock_guard<std::mutex> lock(mu_);
    drop(byRank_[rank]);
    byRank_[rank] = std::move(r);
  }
  // Ends a runner: asks it to exit (killing it if it does not) and removes its log.
  static void drop(PooledRunner& r) {
    r.proc.reset();
    std::error_code ec;
    if (!r.dir.empty() && !std::getenv("SB_TORCH_KEEP")) std::filesystem::remove_all(r.dir, ec);
    r.dir.clear();
  }

 private:
  std::mutex mu_;
  std::map<int, PooledRunner> byRank_;
  int64_t groups_ = 0;
  std::map<int64_t, std::pair<int, std::string>> failures_;  // group -> its first failure
};

class TorchStrategy;

class TorchRankExecutor final : public harness::RankExecutor, public harness::OutOfProcessStep {
 public:
  TorchRankExecutor(const TorchStrategy& s, const Kind& kind, CaseSpec c, std::string fault)
      : strategy_(s), kind_(kind), case_(std::move(c)), fault_(std::move(fault)) {}
  ~TorchRankExecutor() override {
    // A runner that answered everything goes back to the pool; one that failed ends.
    if (runner_.proc && healthy_) {
      RunnerPool::instance().give(rank_, std::move(runner_));
    } else {
      RunnerPool::drop(runner_);
    }
    std::error_code ec;
    if (!dir_.empty() && !std::getenv("SB_TORCH_KEEP")) std::filesystem::remove_all(dir_, ec);
  }

  void prepare(harness::RankContext& ctx, const reference::WorkloadData& data) override;
  void step(harness::RankContext& ctx) override;
  void settle(harness::RankContext& ctx) override;
  std::map<std::string, at::Tensor> results() const override { return results_; }
  nlohmann::json details() const override {
    return {{"torch", version_},
            {"python", pythonPath()},
            {"runner_step_seconds", runnerSeconds_},
            {"twin", kind_.twin}};
  }
  OutOfProcessStep* outOfProcess() override { return this; }
  void measureNextStep() override { measureNext_ = true; }
  harness::OutOfProcessMeasures measures() const override { return measured_; }

 private:
  nlohmann::json call(const nlohmann::json& command) {
    healthy_ = false;  // until it answers
    RunnerPool& pool = RunnerPool::instance();
    const int64_t group = runner_.group;
    nlohmann::json reply;
    try {
      reply = runner_.proc->call(command, timeoutSec(),
                                 [&pool, group, this] { return pool.abandoned(group, rank_); });
    } catch (const std::exception& e) {
      pool.fail(group, rank_, e.what());
      throw;
    }
    if (reply.contains("error")) {
      const std::string what =
          "PyTorch rank " + std::to_string(rank_) + ": " + reply["error"].get<std::string>();
      pool.fail(group, rank_, what);
      throw std::runtime_error(what + " (its log: " + runner_.proc->logPath() +
                               ", kept with SB_TORCH_KEEP=1)");
    }
    healthy_ = true;
    return reply;
  }

  const TorchStrategy& strategy_;
  const Kind& kind_;
  CaseSpec case_;
  std::string fault_;
  int rank_ = 0;
  std::string dir_;  // the row's bundles
  PooledRunner runner_;
  bool healthy_ = false;
  std::string version_;
  double runnerSeconds_ = 0;
  bool measureNext_ = false;
  harness::OutOfProcessMeasures measured_;
  std::map<std::string, at::Tensor> results_;
  std::map<std::string, std::vector<int64_t>> shapes_;  // the reference's, by name
};

class TorchStrategy final : public harness::Strategy {
 public:
  TorchStrategy(const Kind& kind, std::string fault)
      : Strategy("torch/" + kind.name, "PyTorch " + kind.name, kind.family),
        kind_(kind),
        fault_(std::move(fault)) {}
  // DTensor's F.linear on operands laid out as `operands` says (input, weight[, bias]): id
  // torch/dtensor/linear/<input>x<weight>[x<bias>] in the compact spelling (placement.h).
  TorchStrategy(const Kind& kind, std::vector<std::pair<std::string, Layout>> operands,
                const std::string& suffix, std::string fault = "")
      : Strategy("torch/dtensor/linear/" + suffix, "DTensor linear " + suffix, kind.family),
        kind_(kind),
        fault_(std::move(fault)),
        operands_(std::move(operands)),
        suffix_(suffix) {}
  bool operatorVariant() const { return !operands_.empty(); }
  // The operands' placements on a mesh of `meshNdim` axes, as the runner reads them.
  nlohmann::json operandPlacements(int meshNdim) const {
    nlohmann::json j = nlohmann::json::object();
    for (const auto& [name, layout] : operands_) {
      for (const auto& p : layout.placements(meshNdim)) j[name].push_back(p.toString());
    }
    return j;
  }

  std::vector<std::pair<std::string, std::string>> params() const override {
    return {{"runs", kind_.summary + " (PyTorch's own, in Python ranks)"},
            {"twin", kind_.twin.empty() ? "none" : kind_.twin}};
  }
  std::vector<std::string> caseParams() const override {
    if (operatorVariant()) return {};
    if (kind_.name == "file") return {"model", "strategy_file"};
    if (kind_.name == "compose") return {"model", "axes", "sp", "schedule", "virtual_stages", "ac"};
    if (kind_.name == "ep") return {"model", "axes"};
    if (kind_.name == "sac") return {"model", "policy"};
    if (kind_.name == "pipeline-csv") return {"model", "csv"};
    if (fsdp2Kind()) return {"model", "param_dtype"};
    return {"model"};
  }
  bool trainsSteps() const override { return true; }
  bool judgesComm(const CaseSpec&) const override { return false; }
  // One rank running the module itself on the whole batch, the generator set to the
  // reference's seed before each step (drawSeed): the reference's draws, in its order.
  bool repeatsDraws(const CaseSpec& c) const override {
    return (kind_.name == "checkpoint" || kind_.name == "sac" || kind_.name == "file") &&
           c.meshSize() == 1 && !operatorVariant();
  }

  // Each key's form: what fits the model (a file's contents, the axes' sizes) is found when
  // the ranks run it.
  void checkParams(const CaseSpec& c) const override {
    if (operatorVariant()) return;
    if (c.params.contains("model")) {
      std::string why;
      modelSource(c, why);
    }
    if (kind_.name == "file" && c.params.contains("strategy_file") &&
        !c.params.at("strategy_file").is_string()) {
      throw harness::InputError("params.strategy_file " + c.params.at("strategy_file").dump() +
                                ": expected the path of a Python file defining "
                                "parallelize(model, mesh, ctx)");
    }
    if (kind_.name == "compose") checkComposeParams(c);
    if (kind_.name == "pipeline-csv" && c.params.contains("csv")) csvSchedule(c);
    if (kind_.name == "ep") moe::checkExpertAxes(c, "torch/ep", "[ep] or [dp, ep]");
    if (fsdp2Kind() && c.params.contains("param_dtype") && !paramDtype(c)) {
      throw harness::InputError("params.param_dtype " + c.params.at("param_dtype").dump() +
                                ": expected \"bfloat16\" (FSDP2's MixedPrecisionPolicy: units "
                                "gathered and computed in it, gradients reduced in float32) or "
                                "the case's dtype");
    }
    if (kind_.name == "sac" && c.params.contains("policy")) {
      // The policy by name: stratbench's checkpointing/sac/<name> decides the same per
      // operator (builtin_strategies.py's sac_policy); a policy object is stratbench's only
      // (unsupported here, applies()).
      const auto& p = c.params.at("policy");
      static const std::set<std::string> kNames = {"matmuls", "save-all", "recompute-all",
                                                   "torchtitan", "cheap"};
      if (p.is_object()) {
        try {
          sac::checkPolicySpec(p);  // checkpointing/sac/policy's form
        } catch (const std::invalid_argument& e) {
          throw harness::InputError(std::string("params.") + e.what());
        }
      } else if (!p.is_string() || !kNames.count(p.get<std::string>())) {
        throw harness::InputError("params.policy " + p.dump() +
                                  ": expected matmuls, save-all, recompute-all, torchtitan or "
                                  "cheap (torch/sac), or an object (checkpointing/sac/policy)");
      }
    }
  }

  Applicability applies(const CaseSpec& c) const override {
    if (operatorVariant()) {
      if (c.workload != "linear") return Applicability::notApplicable("the linear workload's");
      // Generated for another case (a generated strategy stays registered): its layouts must
      // fit this case's operands and mesh.
      const auto shape = reference::LinearShape::parse(c.shape);
      const std::map<std::string, int> ndim = {
          {"input", static_cast<int>(shape.input.size())}, {"weight", 2}, {"bias", 1}};
      if ((operands_.size() == 3) != shape.bias) {
        return Applicability::notApplicable("generated for a linear case with another bias");
      }
      for (const auto& [name, layout] : operands_) {
        if (layout.ndim() != ndim.at(name) || layout.maxAxis() >= static_cast<int>(c.mesh.size())) {
          return Applicability::notApplicable("generated for another shape or mesh");
        }
      }
      timeoutSec();
      const Probe& p = probe();
      if (!p.ok) return Applicability::unsupported(p.why);
      if (c.device != "cpu") {
        return Applicability::unsupported("torch/* ranks run on the CPU over gloo here");
      }
      return Applicability::yes();
    }
    if (kind_.name == "ep") return appliesEp(c);
    if (c.workload != "torchscript") {
      return Applicability::notApplicable(
          "torch/* runs imported models (workload torchscript), whose Python module it builds");
    }
    timeoutSec();  // a malformed SB_TORCH_TIMEOUT_S is the run's bad input, not a row's error
    if (kind_.name == "file" && !c.params.contains("strategy_file")) {
      return Applicability::notApplicable(
          "a case without params.strategy_file (a Python file defining parallelize(model, "
          "mesh, ctx))");
    }
    if (kind_.name == "pipeline-csv") {
      if (!c.params.contains("csv")) {
        return Applicability::notApplicable("a case without params.csv (the schedule file)");
      }
      // The file's ranks and micro-batches are the case's, or the case is bad input (as for
      // stratbench's pipeline/csv).
      const pipeline::Schedule s = csvSchedule(c);
      const int64_t mb = reference::torchscript::ImportSpec::fromJson(c.shape).microbatches;
      const std::string file = c.params.at("csv").get<std::string>();
      if (c.mesh.size() == 1 && s.ranks != c.mesh[0]) {
        throw harness::InputError("params.csv: " + file + " schedules " + std::to_string(s.ranks) +
                                  " ranks; the mesh has " + std::to_string(c.mesh[0]));
      }
      if (s.microbatches != mb) {
        throw harness::InputError("params.csv: " + file + " has " + std::to_string(s.microbatches) +
                                  " micro-batches; the case runs " + std::to_string(mb));
      }
    }
    if (kind_.name == "sac" && c.params.contains("policy") && c.params.at("policy").is_object()) {
      return Applicability::unsupported(
          "torch/sac runs a policy by name (matmuls, save-all, recompute-all, torchtitan, "
          "cheap); a policy object is checkpointing/sac/policy's");
    }
    std::string why;
    if (modelSource(c, why).empty()) return Applicability::unsupported(why);
    if (c.device != "cpu") {
      return Applicability::unsupported("torch/* ranks run on the CPU over gloo here; device " +
                                        c.device + " is not wired yet");
    }
    if (!pipeline() && kind_.name != "compose" &&
        reference::torchscript::ImportSpec::fromJson(c.shape).microbatches > 1) {
      return Applicability::unsupported("micro-batches are the pipelines'; torch/" + kind_.name +
                                        " runs each step on the whole batch");
    }
    if (staged(c) && c.backend != "threads") {
      // Which rank holds which stage is learnt from the ranks' reports, in this process.
      return Applicability::unsupported("torch/" + kind_.name +
                                        " (pipeline stages) runs on the threads backend");
    }
    const Probe& p = probe();
    if (!p.ok) return Applicability::unsupported(p.why);
    return Applicability::yes();
  }

  // torch/ep: the moe workload, dropless, on a mesh [ep] or [dp, ep] over which the experts
  // divide.
  Applicability appliesEp(const CaseSpec& c) const {
    if (c.workload != "moe") return Applicability::notApplicable("torch/ep runs the moe workload");
    timeoutSec();
    const auto s = reference::MoeShape::parse(c.shape);
    std::vector<std::string> axes = epAxes(c);
    if (axes != std::vector<std::string>{"ep"} && axes != std::vector<std::string>{"dp", "ep"}) {
      return Applicability::unsupported(
          "torch/ep runs on a mesh [ep] or [dp, ep] (EP x TP and EP x FSDP are "
          "sharding/moe/ep's here)");
    }
    if (s.capacity() >= 0) {
      return Applicability::unsupported(
          "torch/ep runs the layer dropless, as torchtitan's MoE: a capacity's drop order over "
          "the whole batch needs every rank's assignments (sharding/moe/ep runs it)");
    }
    const int64_t ep = c.mesh.back();
    if (s.experts % ep != 0) {
      return Applicability::unsupported(std::to_string(s.experts) + " experts do not divide over " +
                                        std::to_string(ep) + " EP ranks");
    }
    if (s.tokens() % c.meshSize() != 0) {
      return Applicability::unsupported(std::to_string(s.tokens()) +
                                        " tokens do not divide over the " +
                                        std::to_string(c.meshSize()) + " ranks");
    }
    std::string why;
    if (modelSource(c, why).empty()) return Applicability::unsupported(why);
    if (c.device != "cpu") {
      return Applicability::unsupported("torch/* ranks run on the CPU over gloo here; device " +
                                        c.device + " is not wired yet");
    }
    const Probe& p = probe();
    if (!p.ok) return Applicability::unsupported(p.why);
    return Applicability::yes();
  }
  // torch/ep's mesh axis names, as builtin_strategies.py's ExpertParallel names them.
  static std::vector<std::string> epAxes(const CaseSpec& c) {
    if (c.params.contains("axes") && c.params.at("axes").is_array()) {
      std::vector<std::string> out;
      for (const auto& v : c.params.at("axes"))
        out.push_back(v.is_string() ? v.get<std::string>() : "");
      return out;
    }
    if (c.mesh.size() == 1) return {"ep"};
    if (c.mesh.size() == 2) return {"dp", "ep"};
    return {};
  }

  std::unique_ptr<harness::RankExecutor> makeExecutor(const CaseSpec& c) const override {
    return std::make_unique<TorchRankExecutor>(*this, kind_, c, fault_);
  }

  // Boxes come from the placements the ranks reported (DTensor's own metadata), never from the
  // local tensors' shapes: a shard whose contents are not what its placement says mismatches.
  Box resultBox(const std::string& tensor, const CaseSpec& c, int rank) const override {
    throw std::logic_error("torch/*: a result box needs the tensor's full shape (resultBoxOf)");
  }
  // A tensor a rank did not report is not there (a pipeline stage's parameters live on its
  // rank only): an empty box. Ranks of another process (gloo) are boxed by any rank's report:
  // placements are the same on every rank of an SPMD strategy.
  Box resultBoxOf(const std::string& tensor, const CaseSpec& c, int rank,
                  at::IntArrayRef fullShape) const override {
    Reported layout;
    {
      std::lock_guard<std::mutex> lock(mu_);
      const auto mine = layouts_.find({key(c), rank});
      if (mine != layouts_.end()) {
        const auto it = mine->second.find(tensor);
        if (it == mine->second.end()) return nothing(fullShape);
        layout = it->second;
      } else {
        bool found = false;
        for (const auto& [k, byTensor] : layouts_) {
          const auto it = byTensor.find(tensor);
          if (k.first == key(c) && it != byTensor.end()) {
            layout = it->second;
            found = true;
            break;
          }
        }
        if (!found) return Box::whole(fullShape);  // reported by no rank: a missing result
      }
    }
    const auto coords = harness::DeviceMesh(c.mesh).coords(rank);
    if (layout.view.empty()) return layout.layout.box(fullShape.vec(), c.mesh, coords);
    Box b = layout.layout.box(layout.view, c.mesh, coords);
    b.view = layout.view;
    b.heldShape(fullShape);  // throws unless the view factors the tensor's shape
    return b;
  }
  std::optional<SpecifiedBox> specifiedBox(const std::string& tensor, const CaseSpec& c, int rank,
                                           at::IntArrayRef fullShape) const override;
  std::optional<SpecifiedBox> composeSpecifiedBox(const std::string& tensor, const CaseSpec& c,
                                                  int rank, at::IntArrayRef fullShape) const;

  CommStats predictComm(const CaseSpec& c, int rank) const override {
    const harness::Strategy* twin =
        kind_.twin.empty() ? nullptr : harness::StrategyRegistry::global().find(kind_.twin);
    if (!twin) return {};
    CaseSpec t = twinCase(c);
    if (harness::applicabilityOf(*twin, t).kind != Applicability::Kind::kApplies) return {};
    return twin->predictComm(t, rank);
  }

  // Bitwise where one rank runs the step (checkpointing recomputes the same operators); on
  // several ranks the step's sums are split (the batch's rows over data-parallel ranks, a
  // row-wise matmul's partial products over tensor-parallel ones) and added in PyTorch's order:
  // the tolerance stratbench's own FSDP rows state for the same reason (harness::stepsTolerance).
  // FSDP2's MixedPrecisionPolicy(param_dtype=bfloat16): the units compute in it.
  std::optional<at::ScalarType> arithmeticDtype(const CaseSpec& c) const override {
    const auto d = fsdp2Kind() ? paramDtype(c) : std::nullopt;
    return d && *d != c.dtype ? d : std::nullopt;
  }

  harness::Tolerance tolerance(const std::string& tensor, const CaseSpec& c,
                               const at::Tensor& expected) const override {
    if (kind_.name == "ep") {
      // The twin's: routing bitwise (integers), the rest sums split over the ranks' tokens.
      if (const auto* twin = harness::StrategyRegistry::global().find(kind_.twin)) {
        return twin->tolerance(tensor, twinCase(c), expected);
      }
    }
    const at::ScalarType computed = arithmeticDtype(c).value_or(c.dtype);
    if (c.meshSize() <= 1 && computed == c.dtype) return Strategy::tolerance(tensor, c, expected);
    const int steps = std::max(1, c.training.steps);
    harness::Tolerance t = harness::stepsTolerance(
        computed, steps, expected.numel() ? expected.abs().max().item<double>() : 0.0);
    t.reason = "the step's sums split over " + std::to_string(c.meshSize()) +
               " ranks and added in PyTorch's order" +
               (c.training.steps > 0 ? ", compounded over " + std::to_string(steps) + " steps"
                                     : std::string()) +
               ": 10 x steps x the dtype's tolerance, as stratbench's FSDP rows" +
               (computed != c.dtype ? std::string(" (bfloat16's: the units compute in it, "
                                                  "against a float32 reference)")
                                    : std::string());
    return t;
  }

  std::vector<std::string> plantableFaults() const override { return kind_.faults; }
  std::unique_ptr<harness::Strategy> withPlantedFault(const std::string& fault) const override {
    for (const auto& f : kind_.faults) {
      if (f != fault) continue;
      if (operatorVariant()) return std::make_unique<TorchStrategy>(kind_, operands_, suffix_, f);
      return std::make_unique<TorchStrategy>(kind_, fault);
    }
    return nullptr;
  }

  // What `rank` reported of its tensors' layouts.
  void noteLayouts(const CaseSpec& c, int rank,
                   const std::map<std::string, Reported>& layouts) const {
    std::lock_guard<std::mutex> lock(mu_);
    layouts_[{key(c), rank}] = layouts;
  }
  bool pipeline() const { return kind_.name.rfind("pipeline-", 0) == 0; }
  // torch/pipeline-csv's params.csv, read, parsed and dry-run (a string: checkParams): exit 2
  // naming the file and what is wrong.
  static pipeline::Schedule csvSchedule(const CaseSpec& c) {
    const auto& v = c.params.at("csv");
    if (!v.is_string()) {
      throw harness::InputError("params.csv " + v.dump() +
                                ": expected the path of a schedule CSV file");
    }
    try {
      return pipeline::readScheduleFile(v.get<std::string>());
    } catch (const pipeline::ScheduleError& e) {
      throw harness::InputError(std::string("params.csv: ") + e.what());
    }
  }
  bool fsdp2Kind() const {
    return kind_.name == "fsdp2" || kind_.name == "fsdp2-keep" || kind_.name == "hsdp";
  }
  // params.param_dtype as a dtype: bfloat16 or the case's own; std::nullopt when absent (the
  // case's) or anything else.
  static std::optional<at::ScalarType> paramDtype(const CaseSpec& c) {
    if (!c.params.contains("param_dtype")) return c.dtype;
    const auto& v = c.params.at("param_dtype");
    if (!v.is_string()) return std::nullopt;
    if (v.get<std::string>() == "bfloat16") return at::kBFloat16;
    if (v.get<std::string>() == harness::dtypeName(c.dtype)) return c.dtype;
    return std::nullopt;
  }
  // torch/compose's params, each with the value it must have: exit 2 naming the key.
  static void checkComposeParams(const CaseSpec& c) {
    const auto bad = [&](const std::string& key, const std::string& expected) {
      throw harness::InputError("torch/compose params." + key + " " + c.params.at(key).dump() +
                                ": expected " + expected);
    };
    if (c.params.contains("axes")) {
      static const std::vector<std::string> names = {"pp", "dp_replicate", "dp_shard", "cp", "tp"};
      const auto& a = c.params.at("axes");
      const std::string want = "a list of " + std::to_string(c.mesh.size()) +
                               " distinct axis names (one a mesh axis) from pp, dp_replicate, "
                               "dp_shard, cp, tp";
      if (!a.is_array() || a.size() != c.mesh.size()) bad("axes", want);
      std::vector<std::string> seen;
      for (const auto& n : a) {
        if (!n.is_string() ||
            std::find(names.begin(), names.end(), n.get<std::string>()) == names.end() ||
            std::find(seen.begin(), seen.end(), n.get<std::string>()) != seen.end()) {
          bad("axes", want);
        }
        seen.push_back(n.get<std::string>());
      }
    }
    if (c.params.contains("sp") && !c.params.at("sp").is_boolean()) bad("sp", "true or false");
    if (c.params.contains("schedule")) {
      const auto& v = c.params.at("schedule");
      static const std::vector<std::string> schedules = {
          "gpipe", "1f1b", "interleaved-1f1b", "interleaved-zb", "zbv", "dualpipev"};
      if (!v.is_string() ||
          std::find(schedules.begin(), schedules.end(), v.get<std::string>()) == schedules.end()) {
        bad("schedule", "gpipe, 1f1b, interleaved-1f1b, interleaved-zb, zbv or dualpipev");
      }
    }
    if (c.params.contains("virtual_stages")) {
      const auto& v = c.params.at("virtual_stages");
      if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() > 8) {
        bad("virtual_stages", "an integer from 1 to 8");
      }
    }
    if (c.params.contains("ac")) {
      const auto& v = c.params.at("ac");
      if (!v.is_string() || (v != "none" && v != "full" && v != "selective")) {
        bad("ac", "none, full or selective");
      }
    }
  }
  // The case splits the model into pipeline stages: a pipeline, or a composition with a pp axis
  // (params.axes, or by default every mesh of 3 axes or more, as builtin_strategies.py's Compose
  // names them).
  bool staged(const CaseSpec& c) const {
    if (pipeline()) return true;
    if (kind_.name != "compose") return false;
    const auto axes = composeAxes(c);
    return std::find(axes.begin(), axes.end(), "pp") != axes.end();
  }
  // torch/compose's mesh axis names, as builtin_strategies.py's Compose names them: params.axes
  // (checked by checkComposeParams), or by the mesh's rank [dp_shard], [dp_shard, tp],
  // [pp, dp_shard, tp], [pp, dp_replicate, dp_shard, tp]; empty for a mesh of more axes without
  // params.axes (the runner says the row is unsupported).
  static std::vector<std::string> composeAxes(const CaseSpec& c) {
    if (c.params.contains("axes")) return c.params.at("axes").get<std::vector<std::string>>();
    static const std::vector<std::vector<std::string>> byRank = {
        {"dp_shard"},
        {"dp_shard", "tp"},
        {"pp", "dp_shard", "tp"},
        {"pp", "dp_replicate", "dp_shard", "tp"}};
    if (c.mesh.empty() || c.mesh.size() > byRank.size()) return {};
    return byRank[c.mesh.size() - 1];
  }
  // The box of a tensor a rank does not hold.
  static Box nothing(at::IntArrayRef shape) {
    Box b = Box::whole(shape);
    if (!b.length.empty()) b.length[0] = 0;
    return b;
  }

 private:
  static std::string key(const CaseSpec& c) { return c.suite + "/" + c.name; }
  // The case as the twin reads it (fsdp2-keep is zero3 kept gathered).
  CaseSpec twinCase(const CaseSpec& c) const {
    CaseSpec t = c;
    t.params.erase("model");
    if (kind_.name == "fsdp2-keep") t.params["reshard_after_forward"] = false;
    return t;
  }

  Kind kind_;
  std::string fault_;
  std::vector<std::pair<std::string, Layout>> operands_;
  std::string suffix_;
  mutable std::mutex mu_;
  // (case, rank) -> tensor -> layout (DTensor's placements, or nested out of mesh order where
  // FSDP2 shards a tensor-parallel piece).
  mutable std::map<std::pair<std::string, int>, std::map<std::string, Reported>> layouts_;
};

// torch/compose's plan, per parameter (and its optimizer state): on its pipeline stage's ranks
// only (stage_cut in builtin_strategies.py: embedding, blocks, norm and output in contiguous
// runs as even as torch.chunk makes them, stage k on pp rank k % pp), torchtitan's tp plan
// (column-wise weights and the embedding Shard(0), row-wise Shard(1), norms replicated), then
// FSDP2's Shard(0) over dp_shard cut from the tp piece (DTensor's _StridedShard), replicated
// over dp_replicate. The mesh's axis names as Compose names them (composeAxes).
std::optional<harness::Strategy::SpecifiedBox> TorchStrategy::composeSpecifiedBox(
    const std::string& tensor, const CaseSpec& c, int rank, at::IntArrayRef fullShape) const {
  const int nd = static_cast<int>(fullShape.size());
  if (nd == 0) return std::nullopt;
  const std::vector<std::string> axes = composeAxes(c);
  if (axes.empty()) return std::nullopt;
  const auto axis = [&](const std::string& n) {
    const auto it = std::find(axes.begin(), axes.end(), n);
    return it == axes.end() ? -1 : static_cast<int>(it - axes.begin());
  };
  // The parameter's name, without "param/" or "state/" and the state's key.
  std::string name = tensor.substr(tensor.find('/') + 1);
  if (tensor.rfind("state/", 0) == 0) name = name.substr(0, name.rfind('/'));
  const auto coords = harness::DeviceMesh(c.mesh).coords(rank);
  std::string text = "torchtitan's composition: ";
  if (const int pp = axis("pp"); pp >= 0) {
    const auto spec = reference::torchscript::ImportSpec::fromJson(c.shape);
    int layers = 0;
    static const std::regex layerName(R"(layers\.(\d+)\..*)");
    for (const auto& [p, dims] : reference::torchscript::importModel(spec)->graph.parameters) {
      std::smatch m;
      if (std::regex_match(p, m, layerName)) layers = std::max(layers, std::stoi(m[1]) + 1);
    }
    const std::string schedule = c.params.value("schedule", "1f1b");
    const bool multi = schedule != "gpipe" && schedule != "1f1b";
    const bool vShape = schedule == "zbv" || schedule == "dualpipev";
    const int v = c.params.value("virtual_stages", multi ? 2 : 1);
    const int ppSize = static_cast<int>(c.mesh[pp]);
    const int stages = ppSize * v;
    const int units = layers + 2;
    if (stages > units) return std::nullopt;  // unsupported: the runner says why
    // The parameter's piece: 0 the embedding, 1 + i block i, units - 1 the norm and output.
    std::smatch m;
    int unit = units - 1;
    if (name.rfind("tok_embeddings.", 0) == 0) {
      unit = 0;
    } else if (std::regex_match(name, m, layerName)) {
      unit = 1 + std::stoi(m[1]);
    }
    int stage = 0;
    for (int k = 0, start = 0; k < stages; ++k) {
      const int size = units / stages + (k < units % stages ? 1 : 0);
      if (unit >= start && unit < start + size) stage = k;
      start += size;
    }
    text += "on its stage's pp rank only, ";
    // Looped: stage k on pp rank k mod pp; V-shaped (two a rank): rank r holds r and 2 pp - 1 - r.
    const int owner = vShape ? (stage < ppSize ? stage : 2 * ppSize - 1 - stage) : stage % ppSize;
    if (owner != coords[pp]) return SpecifiedBox{nothing(fullShape), text};
  }
  std::vector<std::vector<int>> dims(nd);
  static const std::regex colwise(R"(.*(attention\.w[qkv]|w1|w3)\.weight$|^output\.weight$)");
  static const std::regex rowwise(R"(.*(attention\.wo|w2)\.weight$)");
  if (const int tp = axis("tp"); tp >= 0) {
    if (std::regex_match(name, colwise) || name == "tok_embeddings.weight") {
      dims[0].push_back(tp);
      text += "tp Shard(0), ";
    } else if (std::regex_match(name, rowwise) && nd >= 2) {
      dims[1].push_back(tp);
      text += "tp Shard(1), ";
    } else {
      text += "tp replicated, ";
    }
  }
  if (const int dp = axis("dp_shard"); dp >= 0) {
    dims[0].push_back(dp);
    text += "FSDP2 Shard(0) over dp_shard inside it";
  }
  const Layout layout(dims, {});
  return SpecifiedBox{layout.box(fullShape.vec(), c.mesh, coords), text};
}

// The layout each built-in strategy documents, per result tensor; nullopt for one it leaves
// to the reported placements (a user's file, a replicated scalar).
std::optional<harness::Strategy::SpecifiedBox> TorchStrategy::specifiedBox(
    const std::string& tensor, const CaseSpec& c, int rank, at::IntArrayRef fullShape) const {
  // Parameters and their optimizer state: what a plan lays out. A gradient's placement is
  // DTensor's choice (the row-wise embedding's comes back replicated), checked by its values.
  const bool param = tensor.rfind("param/", 0) == 0 || tensor.rfind("state/", 0) == 0;
  if (!param || tensor == "state/step") return std::nullopt;
  const int nd = static_cast<int>(fullShape.size());
  const int axes = static_cast<int>(c.mesh.size());
  std::vector<Placement> spec(axes, Placement::replicate());
  std::string text;
  const std::string& k = kind_.name;
  if (k == "ddp" || k == "checkpoint" || k == "sac") {
    text = k + ": every parameter whole on every rank";
  } else if (k == "fsdp2" || k == "fsdp2-keep" || k == "hsdp") {
    spec.back() = Placement::shard(0);
    text = "FSDP2: every parameter sharded on dim 0 over the " +
           std::string(k == "hsdp" ? "shard axis, replicated over the replicate axis" : "mesh");
  } else if (k == "compose") {
    return composeSpecifiedBox(tensor, c, rank, fullShape);
  } else if (k == "ep") {
    // Expert parallelism: every expert's weights on its EP rank only (contiguous experts),
    // replicated over dp; the router replicated.
    std::string name = tensor.substr(tensor.find('/') + 1);
    if (tensor.rfind("state/", 0) == 0) name = name.substr(0, name.rfind('/'));
    if (name == "w1" || name == "w2" || name == "w3") {
      spec.back() = Placement::shard(0);
      text = "expert parallelism: the experts Shard(0) over ep, replicated over dp";
    } else {
      text = "expert parallelism: the router replicated";
    }
  } else if (k.rfind("pipeline-", 0) == 0 || k == "dtensor-linear") {
    return std::nullopt;  // whole on its stage's rank: what the reports say
  } else if (k == "tp" || k == "sp") {
    // torchtitan's plan: column-wise projections shard the weight's rows, row-wise ones its
    // columns, the embedding its rows (vocabulary); norms replicate.
    static const std::regex colwise(
        R"(.*(attention\.w[qkv]|\.w1|\.w3)\.weight(/.*)?$|.*/output\.weight(/.*)?$)");
    static const std::regex rowwise(R"(.*(attention\.wo|\.w2)\.weight(/.*)?$)");
    static const std::regex embedding(R"(.*/tok_embeddings\.weight(/.*)?$)");
    // GPT-2 (builtin_strategies.py's gpt2 plan): the MLP's c_fc column-wise (weight and bias),
    // the projections c_proj row-wise, the fused qkv c_attn column-wise per part (a rank's rows
    // of q, of k and of v: Shard(1) of the view [3, D, ...]), the tied embedding replicated.
    static const std::regex fused(R"(.*/h\.\d+\.attn\.c_attn\.(weight|bias)(/.*)?$)");
    static const std::regex gptColwise(R"(.*/h\.\d+\.mlp\.c_fc\.(weight|bias)(/.*)?$)");
    static const std::regex gptRowwise(R"(.*/h\.\d+\.(attn|mlp)\.c_proj\.weight(/.*)?$)");
    if (std::regex_match(tensor, fused) && nd >= 1 && fullShape[0] % 3 == 0) {
      std::vector<int64_t> view = fullShape.vec();
      view[0] /= 3;
      view.insert(view.begin(), 3);
      spec[0] = Placement::shard(1);
      Box b = Layout::fromPlacements(spec, nd + 1)
                  .box(view, c.mesh, harness::DeviceMesh(c.mesh).coords(rank));
      b.view = view;
      return SpecifiedBox{b,
                          "GPT-2's TP plan: the fused qkv projection column-wise per part, a "
                          "rank's rows of q, of k and of v (_StridedShard(0, split_factor=3))"};
    }
    if (std::regex_match(tensor, colwise) || std::regex_match(tensor, embedding) ||
        std::regex_match(tensor, gptColwise)) {
      spec[0] = Placement::shard(0);
      text = "torchtitan's TP plan: column-wise (or the embedding's rows): Shard(0)";
    } else if (std::regex_match(tensor, rowwise) || std::regex_match(tensor, gptRowwise)) {
      spec[0] = Placement::shard(1);
      text = "torchtitan's TP plan: row-wise: Shard(1)";
    } else {
      text =
          "torchtitan's TP plan: norms (and GPT-2's tied embedding, row-wise biases) "
          "replicated";
    }
  } else {
    return std::nullopt;
  }
  if (nd == 0) return std::nullopt;
  const Layout layout = Layout::fromPlacements(spec, nd);
  return SpecifiedBox{layout.box(fullShape.vec(), c.mesh, harness::DeviceMesh(c.mesh).coords(rank)),
                      text};
}

void TorchRankExecutor::prepare(harness::RankContext& ctx, const reference::WorkloadData& data) {
  rank_ = ctx.rank();
  char dirTemplate[] = "/tmp/sb-torch-XXXXXX";
  if (!mkdtemp(dirTemplate)) throw std::runtime_error("cannot make a folder under /tmp");
  dir_ = dirTemplate;
  TensorBundle in;
  in.tensors = data.inputs;
  const std::string bundle = dir_ + "/inputs.safetensors";
  writeBundle(bundle, in);

  std::vector<std::string> parameters, dataInputs;
  std::string why, source;
  int64_t microbatches = 1;
  nlohmann::json layerShape = nlohmann::json::object();
  if (case_.workload == "moe") {
    // The layer's shape with every default filled in: the Python side assumes none.
    const auto s = reference::MoeShape::parse(case_.shape);
    layerShape = {{"batch", s.batch},
                  {"seq", s.seq},
                  {"d_model", s.dModel},
                  {"ffn", s.ffn},
                  {"experts", s.experts},
                  {"top_k", s.topK},
                  {"score", s.sigmoid ? "sigmoid" : "softmax"},
                  {"norm_topk", s.normTopk},
                  {"aux_coef", s.auxCoef}};
    parameters = {"router", "w1", "w3", "w2"};
    dataInputs = {"input"};
    source = modelSource(case_, why);
  } else if (case_.workload == "torchscript") {
    const auto spec = reference::torchscript::ImportSpec::fromJson(case_.shape);
    const auto model = reference::torchscript::importModel(spec);
    for (const auto& [name, dims] : model->graph.parameters) parameters.push_back(name);
    dataInputs = model->dataInputs;
    source = modelSource(case_, why);
    microbatches = spec.microbatches;
  }
  nlohmann::json lrs = nlohmann::json::array();
  for (int k = 0; k < case_.training.steps; ++k) {
    lrs.push_back(case_.training.optimizer.lrAt(k, case_.training.steps));
  }
  nlohmann::json caseJson = {
      {"dtype", harness::dtypeName(case_.dtype)},
      {"seed", case_.seed},
      {"mesh", case_.mesh},
      {"params", runnerParams(case_)},
      {"fault", fault_},
      {"strategy", kind_.name},
      {"strategy_file", case_.params.value("strategy_file", "")},
      {"workload", case_.workload},
      {"shape", layerShape},
      {"placements", strategy_.operandPlacements(static_cast<int>(case_.mesh.size()))},
      {"data_inputs", dataInputs},
      {"parameters", parameters},
      {"steps", case_.training.steps},
      {"lrs", lrs},
      {"optimizer", case_.training.optimizer.toJson()},
      {"model_source", source},
      {"microbatches", microbatches}};
  if (kind_.name == "pipeline-csv") {
    // Which rank runs each stage, as stratbench read the file (the ranks build their stages
    // before PyTorch's runtime reads the same file).
    caseJson["csv_stage_rank"] = TorchStrategy::csvSchedule(case_).stageRank;
  }
  if (harness::drawsRandomNumbers(case_)) {
    nlohmann::json seeds = nlohmann::json::array();
    for (int k = 0; k < std::max(1, case_.training.steps); ++k) {
      seeds.push_back(reference::torchscript::drawSeed(case_.seed, k));
    }
    caseJson["draw_seeds"] = seeds;
  }
  for (const auto& name : data.checked) shapes_[name] = data.expected.at(name).sizes().vec();

  runner_ = RunnerPool::instance().take(
      ctx, {{"RANK", std::to_string(ctx.rank())},
            {"LOCAL_RANK", std::to_string(ctx.rank())},
            {"WORLD_SIZE", std::to_string(ctx.mesh().size())},
            {"MASTER_ADDR", envOr("MASTER_ADDR", "127.0.0.1")},
            // As torchrun does: one thread a rank unless the user says otherwise.
            {"OMP_NUM_THREADS", envOr("OMP_NUM_THREADS", "1")}});
  const nlohmann::json reply = call({{"cmd", "prepare"}, {"case", caseJson}, {"bundle", bundle}});
  if (reply.contains("unsupported")) {
    throw harness::UnsupportedCase(reply["unsupported"].get<std::string>());
  }
  version_ = reply.value("torch", "");
}

void TorchRankExecutor::step(harness::RankContext&) {
  const bool measure = measureNext_;
  measureNext_ = false;
  const nlohmann::json reply = call({{"cmd", "step"}, {"measure", measure}});
  runnerSeconds_ = reply.value("seconds", 0.0);
  if (!measure) return;
  measured_ = {};
  measured_.peakBytes = reply.at("peak_bytes").get<int64_t>();
  measured_.startBytes = reply.at("start_bytes").get<int64_t>();
  static const std::map<std::string, harness::Collective> byName = {
      {"all_reduce", harness::Collective::kAllReduce},
      {"all_gather", harness::Collective::kAllGather},
      {"reduce_scatter", harness::Collective::kReduceScatter},
      {"all_to_all", harness::Collective::kAllToAll},
      {"broadcast", harness::Collective::kBroadcast},
      {"barrier", harness::Collective::kBarrier},
      {"send_recv", harness::Collective::kSendRecv}};
  for (const auto& [name, counts] : reply.at("comm").items()) {
    const auto it = byName.find(name);
    if (it == byName.end()) throw std::logic_error("torch/*: the runner counted '" + name + "'");
    auto& e = measured_.comm[it->second];
    e.calls += counts.at(0).get<int64_t>();
    e.bytes += counts.at(1).get<int64_t>();
  }
}

void TorchRankExecutor::settle(harness::RankContext&) {
  const std::string path = dir_ + "/results.safetensors";
  call({{"cmd", "results"}, {"path", path}});
  TensorBundle b = readBundle(path);
  results_ = std::move(b.tensors);
  // Per tensor its placement on every mesh axis, or a ColossalAI sequence ("[S20, R]") where a
  // dimension's shards nest out of mesh order.
  // A strided shard (a fused projection's rows of each part) as {view, placements}: the
  // placements of a view that splits the sharded dimension (rank_runner.py's split_view).
  std::map<std::string, Reported> layouts;
  const auto j = nlohmann::json::parse(b.metadata.at("placements"));
  for (const auto& [name, entry] : j.items()) {
    std::string text;
    Reported& r = layouts[name];
    const nlohmann::json& list = entry.is_object() ? entry.at("placements") : entry;
    if (entry.is_object()) r.view = entry.at("view").get<std::vector<int64_t>>();
    if (list.is_string()) {
      text = list.get<std::string>();
    } else {
      text = "[";
      for (size_t i = 0; i < list.size(); ++i) text += (i ? ", " : "") + list[i].get<std::string>();
      text += "]";
    }
    const int nd = r.view.empty() ? static_cast<int>(results_.at(name).dim())
                                  : static_cast<int>(r.view.size());
    r.layout = Layout::parse(text, nd, static_cast<int>(case_.mesh.size()));
  }
  strategy_.noteLayouts(case_, rank_, layouts);
  // What this rank does not hold is handed back empty, in the empty box resultBoxOf gives it.
  for (const auto& [name, shape] : shapes_) {
    if (!results_.count(name)) {
      std::vector<int64_t> none = shape;
      if (!none.empty()) none[0] = 0;
      results_[name] = at::empty(none, at::TensorOptions().dtype(case_.dtype));
    }
  }
}

std::vector<std::unique_ptr<harness::Strategy>> registerTorch() {
  std::vector<std::unique_ptr<harness::Strategy>> out;
  for (const auto& k : kinds()) out.push_back(std::make_unique<TorchStrategy>(k, ""));
  return out;
}

// Every layout of a linear case's operands on its mesh (shards nested in mesh order, at most
// one axis of pending sums each): DTensor's F.linear on each combination, forward and backward.
std::vector<std::unique_ptr<harness::Strategy>> generateDTensorLinear(const CaseSpec& c) {
  std::vector<std::unique_ptr<harness::Strategy>> out;
  if (c.workload != "linear") return out;
  static const Kind kind{
      "dtensor-linear", Family::kSharding, "", {"partial_reported_whole"}, "DTensor's F.linear"};
  const auto s = reference::LinearShape::parse(c.shape);
  const int axes = static_cast<int>(c.mesh.size());
  const auto inputs = harness::enumerateLayouts(static_cast<int>(s.input.size()), axes, 1);
  const auto weights = harness::enumerateLayouts(2, axes, 1);
  const auto biases = s.bias ? harness::enumerateLayouts(1, axes, 1) : std::vector<Layout>{};
  for (const auto& x : inputs) {
    for (const auto& w : weights) {
      if (!s.bias) {
        out.push_back(std::make_unique<TorchStrategy>(
            kind, std::vector<std::pair<std::string, Layout>>{{"input", x}, {"weight", w}},
            x.compact() + "x" + w.compact()));
        continue;
      }
      for (const auto& b : biases) {
        out.push_back(std::make_unique<TorchStrategy>(
            kind,
            std::vector<std::pair<std::string, Layout>>{{"input", x}, {"weight", w}, {"bias", b}},
            x.compact() + "x" + w.compact() + "x" + b.compact()));
      }
    }
  }
  return out;
}

}  // namespace
}  // namespace sb::strategies::torchside

SB_REGISTER_STRATEGIES(sb::strategies::torchside::registerTorch);
SB_REGISTER_STRATEGY_GENERATOR((sb::harness::StrategyRegistry::GeneratorInfo{
    "torch/dtensor/linear/<input>x<weight>x<bias>", sb::harness::Family::kSharding,
    "DTensor's own F.linear, forward and backward, on every layout of a linear case's operands "
    "(at most one partial axis each), run by PyTorch in Python ranks",
    sb::strategies::torchside::generateDTensorLinear}));
