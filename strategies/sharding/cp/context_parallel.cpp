// Context parallelism: `sharding/cp/<variant>`, the sequence of a transformer stack (workloads
// gpt2_prefill, causal, and vit_encoder, bidirectional; inference or training) sharded over
// the ranks of a 1-D mesh. Every rank holds its tokens' activations; the parameters are
// replicated and their gradients, partial sums over each rank's tokens, all-reduced. Layer
// norms, projections, the MLP and the residuals are token-wise and run on the shards; only
// attention needs other ranks' tokens: ring/p2p (keys and values passed around the ring into
// the online softmax), ring/allgather (gathered once, Llama 3's) or ulysses (all-to-all to head
// shards), each on one mesh axis (sequence_attention.h).
//
// CP x TP (a 2-D mesh: axis 0 the context-parallel ring, axis 1 Megatron's tensor parallelism):
// each tensor-parallel rank takes heads / tp of the heads (its rows of q, k and v, its columns of
// the output projection) and 4d / tp of the MLP's hidden units, the row-parallel products
// all-reduced over axis 1 (Megatron's g) and the gradient of the column-parallel inputs too (f);
// the ring, the all-gather or Ulysses' all-to-alls run over axis 0 on the rank's heads. Sharded
// parameters' gradients are all-reduced over axis 0 on the rank's slice only, replicated ones
// (layer norms, the biases after g) whole.
//
// Causal load balancing (`balance`, on by default where the workload is causal): the sequence
// cut in 2w chunks, rank r holding chunks r and 2w - 1 - r, so every rank sees the same number
// of (query, key) pairs; `balance: false` gives rank r the contiguous r-th w-th, and the record
// shows the imbalance (details.case.attention_pairs_per_rank). Fully masked blocks are skipped.
//
// Not bitwise: this LibTorch's BLAS orders a product's sums by its row count, so a rank's
// projections of its T / w tokens are not the rows of the whole sequence's
// (kernels/test/attention_test.cpp), and the ring adds each key block's gradient over the
// ranks' queries in ring order. Every tensor is compared within the bound of a sum split over
// the ranks (splitReductionTolerance, the longest sum: a parameter's gradient over every
// token).
//
// Memory: every rank's peak predicted to the byte by a replay of the step's allocations
// (cp_memory.h) above the bytes live when the step began, judged with tolerance 0; with
// SB_MEMORY_TRACE the replay is printed into the trace ("model" lines) for
// reports/memory_trace.py --model to line up against the measurement.
//
// Results: the output and input gradient gathered whole to every rank after the step (settle:
// uncounted, as the harness takes results), so that a token computed at the wrong position is
// a mismatch wherever the load balancing put it.
//
// Planted faults (tests): "stale_kv" (ring/p2p: the backward recomputes every step with its own
// keys and values, diffusers#14265), "dkv_not_returned" (ring/p2p: the last hop of dk, dv
// skipped, so each rank keeps its neighbour's), "mask_ignores_balance" (the causal mask built
// from contiguous positions while the tokens are load-balanced), "ulysses_swapped" (ulysses:
// the output's head and sequence dimensions swapped before the second all-to-all),
// "tp_input_grad_unsummed" (CP x TP: the attention's input gradient not all-reduced over the
// tensor-parallel ranks, Megatron's f forgotten: each keeps its own heads' share).

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <optional>
#include <tuple>

#include "harness/capture_tape.h"
#include "harness/comm/autograd_comm.h"
#include "harness/comm/comm_site.h"
#include "harness/error.h"
#include "harness/measure/memory.h"
#include "harness/registry.h"
#include "reference/autograd_engine.h"
#include "reference/transformer.h"
#include "strategies/sharding/cp/cp_memory.h"
#include "strategies/sharding/cp/sequence_attention.h"

namespace sb::strategies::cp {
namespace {

using harness::Applicability;
using harness::Box;
using harness::CaseSpec;
using harness::Collective;
using harness::CommStats;
using harness::Communicator;
using harness::RankContext;
using reference::Transformer;
using reference::TransformerShape;

class CpStrategy;

class CpExecutor final : public harness::RankExecutor {
 public:
  CpExecutor(const CpStrategy& s, const CaseSpec& c);
  void prepare(RankContext& ctx, const reference::WorkloadData& data) override;
  void step(RankContext& ctx) override;
  void settle(RankContext& ctx) override;
  std::map<std::string, at::Tensor> results() const override { return results_; }
  std::vector<std::pair<std::string, std::string>> recordParams() const override;
  // After the measured step (the runner asks before the timed steps, which move entryLive_).
  std::optional<int64_t> predictedPeakBytes() const override {
    if (!stepPeak_) return std::nullopt;
    return entryLive_ + *stepPeak_;
  }
  nlohmann::json details() const override {
    nlohmann::json d;
    d["memory_model"]["step_entry_live_bytes"] = entryLive_;
    if (stepPeak_) {
      d["memory_model"]["step_peak_above_entry_bytes"] = *stepPeak_;
    } else {
      d["memory_model"]["not_predicted"] = notPredicted_;
    }
    return d;
  }
  // Locating a failure: the next step keeps this rank's tokens of each layer's residual after
  // attention and of its output, and their gradients (one piece per run of consecutive
  // positions: a load-balanced rank holds two).
  bool capturesValues() const override { return true; }
  void setCapture(bool on) override {
    captureOn_ = on;
    if (on) captured_.clear();
    if (!on) tape_.reset();
  }
  std::vector<harness::TraceValue> captured() const override { return captured_; }

 private:
  bool captureOn_ = false;
  std::unique_ptr<harness::CaptureTape> tape_;
  std::vector<harness::TraceValue> captured_;
  // Capture: `t` ([batch, this rank's tokens, d_model]) under `name`, a piece per run.
  void tap(int l, const std::string& name, const at::Tensor& t);
  // The memory model's replay of a step (cp_memory.h), once the ranks' layout is known.
  void modelMemory(RankContext& ctx);
  // CP x TP: one layer with this rank's heads and hidden units (Megatron's f and g over axis 1).
  at::Tensor tensorParallelLayer(int l, const at::Tensor& x);
  // This tensor-parallel rank's blocks of a parameter (views): rows or columns it holds, q, k
  // and v's rows apart; the whole tensor where it is replicated.
  std::vector<at::Tensor> tpBlocks(size_t param, const at::Tensor& t) const;
  CaseSpec case_;
  TransformerShape shape_;
  Variant variant_;
  Fault fault_;
  SeqLayout layout_;
  int64_t tp_ = 1, t_ = 0;  // tensor-parallel ranks (mesh axis 1) and this rank's index
  // Per parameter (the model's order), from its name once: this tensor-parallel rank's blocks
  // as (dim, offset, length); empty where it is replicated.
  struct Block {
    int64_t dim, offset, length;
  };
  std::vector<std::vector<Block>> blocks_;
  std::vector<at::Tensor> params_;
  // Per layer, its parameters' indices: fused q/k/v weight and bias, output projection and its
  // bias, the MLP's two weights, its first bias and its output bias.
  struct LayerParams {
    size_t qkvW, qkvB, projW, projB, fcW, fcB, mlpW, mlpB;
  };
  std::vector<LayerParams> layers_;
  at::Tensor input_, target_;  // this rank's tokens of the workload's input and target
  RankContext* ctx_ = nullptr;
  std::unique_ptr<Transformer> model_;
  std::unique_ptr<SequenceAttention> attention_;
  at::Tensor out_, gradIn_;
  std::map<std::string, at::Tensor> results_;
  int64_t entryLive_ = 0;  // the rank's live bytes when the step began (measured)
  std::optional<int64_t> stepPeak_;
  std::string notPredicted_;
};

class CpStrategy final : public harness::Strategy {
 public:
  CpStrategy(Variant v, Fault f)
      : Strategy(std::string("sharding/cp/") + variantId(v),
                 std::string("context parallel ") + variantId(v),
                 harness::Family::kContextParallel),
        variant_(v),
        fault_(f) {}
  Variant variant() const { return variant_; }
  Fault fault() const { return fault_; }

  std::vector<std::string> caseParams() const override { return {"balance"}; }
  std::vector<std::pair<std::string, std::string>> params() const override {
    return {{"sequence", "sharded over a 1-D mesh"},
            {"attention", variant_ == Variant::kRingP2P         ? "keys and values around a ring"
                          : variant_ == Variant::kRingAllGather ? "keys and values all-gathered"
                                                                : "all-to-all to head shards"},
            {"case params", "balance (causal load balancing, default on when causal)"}};
  }

  static int64_t tpOf(const CaseSpec& c) { return c.mesh.size() == 2 ? c.mesh[1] : 1; }

  static SeqLayout layoutOf(const CaseSpec& c) {
    const auto s = TransformerShape::parse(c.shape, c.workload);
    SeqLayout l;
    l.w = static_cast<int>(c.mesh.at(0));
    l.T = s.seq;
    l.balanced = s.causal;
    if (c.params.contains("balance") && c.params["balance"].is_boolean()) {
      l.balanced = c.params["balance"].get<bool>();
    }
    return l;
  }

  void checkParams(const CaseSpec& c) const override {
    if (c.params.contains("balance") && !c.params["balance"].is_boolean()) {
      throw harness::InputError("params.balance must be true or false, got " +
                                c.params["balance"].dump());
    }
  }

  Applicability applies(const CaseSpec& c) const override {
    if (c.workload == "torchscript") {
      // An `unsupported` row, not an absent one: a user sharding an imported transformer asks
      // for this family by name or pattern and must see why it did not run.
      return Applicability::unsupported(
          "context parallelism runs the transformer stacks written here (gpt2_prefill, "
          "vit_encoder), whose attention it knows by construction; an imported model's attention "
          "is a pattern of graph nodes (matmuls, a mask, a softmax) that this family does not "
          "find yet, and its token-wise layers would need the graph cut by the sequence");
    }
    if (c.workload != "gpt2_prefill" && c.workload != "vit_encoder") {
      return Applicability::notApplicable("not a transformer stack (gpt2_prefill, vit_encoder)");
    }
    if (c.mesh.size() > 2) {
      return Applicability::unsupported(
          "context parallelism runs on a 1-D mesh, or 2-D with tensor parallelism on axis 1; "
          "the case has " +
          c.meshString());
    }
    const auto s = TransformerShape::parse(c.shape, c.workload);
    const SeqLayout l = layoutOf(c);
    const int64_t parts = l.balanced ? 2 * l.w : l.w;
    if (s.seq % parts != 0) {
      return Applicability::unsupported("the sequence (" + std::to_string(s.seq) +
                                        ") does not cut into " + std::to_string(parts) +
                                        (l.balanced ? " load-balanced chunks" : " equal shards"));
    }
    const int64_t tp = tpOf(c);
    if (s.heads % tp != 0) {
      return Applicability::unsupported("tensor parallelism splits the " + std::to_string(s.heads) +
                                        " heads over " + std::to_string(tp) +
                                        " ranks: they must divide");
    }
    if (variant_ == Variant::kUlysses && (s.heads / tp) % l.w != 0) {
      return Applicability::unsupported("ulysses splits the " + std::to_string(s.heads / tp) +
                                        " heads of a rank over " + std::to_string(l.w) +
                                        " ranks: they must divide");
    }
    return Applicability::yes();
  }

  // The unsharded transformer's same values (CpExecutor::tap), whole, and in training their
  // gradients from the target.
  std::vector<harness::TraceValue> referenceTrace(const CaseSpec& c,
                                                  const reference::WorkloadData&) const override;
  std::unique_ptr<harness::RankExecutor> makeExecutor(const CaseSpec& c) const override {
    return std::make_unique<CpExecutor>(*this, c);
  }

  Box resultBox(const std::string&, const CaseSpec&, int) const override {
    TORCH_INTERNAL_ASSERT(false, "cp results are boxed by resultBoxOf");
  }
  Box resultBoxOf(const std::string&, const CaseSpec&, int, at::IntArrayRef shape) const override {
    return Box::whole(shape);  // gathered (output, grad_input) or all-reduced (parameters)
  }

  CommStats predictComm(const CaseSpec& c, int rank) const override {
    return harness::totalOf(*predictCommByNode(c, rank));
  }
  // Per layer ("h0", ...) and phase: its attention's sequence collectives and its tensor-
  // parallel f and g, forward and backward; every parameter's gradient all-reduced over the
  // sequence axis after the backward, in the update, at its layer.
  std::optional<std::vector<harness::NodeComm>> predictCommByNode(const CaseSpec& c,
                                                                  int) const override {
    const auto s = TransformerShape::parse(c.shape, c.workload);
    const SeqLayout l = layoutOf(c);
    const int64_t tp = tpOf(c), w = l.w;
    const int64_t es = static_cast<int64_t>(c10::elementSize(c.dtype));
    const int64_t D = s.dModel;
    const int64_t tokens = s.batch * l.local() * D * es;  // a rank's [B, T/w, D]
    const int64_t act = tokens / tp;                      // one of its q, k, v (its heads)
    std::vector<harness::NodeComm> fwd, bwd, update;
    // A collective over a group of one counts its call and no bytes.
    const auto onCp = [&](CommStats& into, Collective k, int64_t bytes) {
      into.add(k, w > 1 ? bytes : 0);
    };
    const auto onTp = [&](CommStats& into, Collective k, int64_t bytes) {
      into.add(k, tp > 1 ? bytes : 0);
    };
    for (int64_t layer = 0; layer < s.layers; ++layer) {
      const std::string name = "h" + std::to_string(layer);
      CommStats& f = fwd.emplace_back(harness::NodeComm{name, "forward", {}}).comm;
      CommStats& b = bwd.emplace_back(harness::NodeComm{name, "backward", {}}).comm;
      switch (variant_) {
        case Variant::kRingP2P:
          for (int64_t i = 0; i + 1 < w; ++i) onCp(f, Collective::kSendRecv, 2 * act);
          if (s.training) {
            for (int64_t i = 0; i + 1 < w; ++i) onCp(b, Collective::kSendRecv, 4 * act);
            if (fault_ != Fault::kDkvNotReturned) onCp(b, Collective::kSendRecv, 2 * act);
          }
          break;
        case Variant::kRingAllGather:
          onCp(f, Collective::kAllGather, 2 * act * w);
          if (s.training) onCp(b, Collective::kReduceScatter, 2 * act * w);
          break;
        case Variant::kUlysses:
          onCp(f, Collective::kAllToAll, 3 * act);
          onCp(f, Collective::kAllToAll, act);
          if (s.training) {
            onCp(b, Collective::kAllToAll, act);
            onCp(b, Collective::kAllToAll, 3 * act);
          }
          break;
      }
      if (tp > 1) {  // g after the attention's and the MLP's row-parallel products; f backward
        for (int k = 0; k < 2; ++k) onTp(f, Collective::kAllReduce, tokens);
        if (s.training) {
          const int calls = fault_ == Fault::kTpInputGradUnsummed ? 1 : 2;
          for (int k = 0; k < calls; ++k) onTp(b, Collective::kAllReduce, tokens);
        }
      }
      if (s.training) {
        // Every parameter's gradient over axis 0 (reference/transformer.h's layer): with tensor
        // parallelism a sharded one's slice (q, k and v's rows apart), a replicated one whole.
        CommStats& u = update.emplace_back(harness::NodeComm{name, "update", {}}).comm;
        const int64_t dl = D / tp, F = 4 * D / tp;
        const std::vector<int64_t> sizes =
            tp == 1 ? std::vector<int64_t>{D, D, 3 * D * D, 3 * D, D * D,     D,
                                           D, D, 4 * D * D, 4 * D, 4 * D * D, D}
                    : std::vector<int64_t>{D,      D, dl * D, dl * D, dl * D, dl, dl,    dl,
                                           D * dl, D, D,      D,      F * D,  F,  D * F, D};
        for (int64_t n : sizes) onCp(u, Collective::kAllReduce, n * es);
      }
    }
    std::vector<harness::NodeComm> out = std::move(fwd);
    out.insert(out.end(), std::make_move_iterator(bwd.rbegin()),
               std::make_move_iterator(bwd.rend()));
    out.insert(out.end(), std::make_move_iterator(update.begin()),
               std::make_move_iterator(update.end()));
    return out;
  }

  harness::Tolerance tolerance(const std::string&, const CaseSpec& c,
                               const at::Tensor& expected) const override {
    const auto s = TransformerShape::parse(c.shape, c.workload);
    harness::Tolerance t = harness::splitReductionTolerance(
        harness::Tolerance::defaultFor(c.dtype), c.dtype, s.batch * s.seq,
        std::max<int64_t>(2, c.meshSize()), expected);
    t.reason = "sums split over " + std::to_string(c.meshSize()) +
               " sequence shards (a parameter's gradient over every token, the longest) and "
               "products on a shard's rows, which this BLAS orders by row count: " +
               t.reason;
    return t;
  }

  nlohmann::json caseDetails(const CaseSpec& c) const override {
    const auto s = TransformerShape::parse(c.shape, c.workload);
    const SeqLayout l = layoutOf(c);
    std::vector<int64_t> pairs;
    for (int r = 0; r < l.w; ++r) pairs.push_back(l.visiblePairs(r, s.causal));
    const double mean =
        static_cast<double>(std::accumulate(pairs.begin(), pairs.end(), int64_t{0})) /
        static_cast<double>(l.w);
    return {{"load_balanced", l.balanced},
            {"attention_pairs_per_rank", pairs},
            {"attention_imbalance", *std::max_element(pairs.begin(), pairs.end()) / mean}};
  }

  // The memory model replays every allocation of the step (cp_memory.h): to the byte.
  PredictionTolerance predictionTolerance() const override {
    return PredictionTolerance::exactMemory();
  }

  std::vector<std::string> plantableFaults() const override {
    switch (variant_) {
      case Variant::kRingP2P:
        return {faultName(Fault::kStaleKv), faultName(Fault::kDkvNotReturned),
                faultName(Fault::kMaskIgnoresBalance), faultName(Fault::kTpInputGradUnsummed)};
      case Variant::kRingAllGather:
        return {faultName(Fault::kMaskIgnoresBalance), faultName(Fault::kTpInputGradUnsummed)};
      case Variant::kUlysses:
        return {faultName(Fault::kUlyssesSwapped), faultName(Fault::kTpInputGradUnsummed)};
    }
    return {};
  }
  std::unique_ptr<harness::Strategy> withPlantedFault(const std::string& name) const override {
    const auto ok = plantableFaults();
    if (std::find(ok.begin(), ok.end(), name) == ok.end()) return nullptr;
    for (Fault f : {Fault::kStaleKv, Fault::kDkvNotReturned, Fault::kMaskIgnoresBalance,
                    Fault::kUlyssesSwapped, Fault::kTpInputGradUnsummed}) {
      if (name == faultName(f)) return std::make_unique<CpStrategy>(variant_, f);
    }
    return nullptr;
  }

 private:
  Variant variant_;
  Fault fault_;
};

CpExecutor::CpExecutor(const CpStrategy& s, const CaseSpec& c)
    : case_(c),
      shape_(TransformerShape::parse(c.shape, c.workload)),
      variant_(s.variant()),
      fault_(s.fault()),
      layout_(CpStrategy::layoutOf(c)) {}

void CpExecutor::prepare(RankContext& ctx, const reference::WorkloadData&) {
  ctx_ = &ctx;
  model_ = std::make_unique<Transformer>(shape_, case_.dtype, case_.seed);
  tp_ = CpStrategy::tpOf(case_);
  t_ = tp_ > 1 ? ctx.group({1}).rank() : 0;
  attention_ = std::make_unique<SequenceAttention>(
      variant_, fault_, layout_, shape_.causal,
      1.0 / std::sqrt(static_cast<double>(shape_.dModel / shape_.heads)),
      ctx.group({0}).rank());  // this rank's place on the ring (mesh axis 0)
  input_ = model_->input().index_select(1, attention_->positions());
  target_ = model_->target().index_select(1, attention_->positions());
  // Megatron's split of each parameter: the rows or columns this tensor-parallel rank holds
  // (q, k and v's rows apart); the layer norms and the biases added after g whole.
  const int64_t D = shape_.dModel, dl = D / tp_, F = 4 * D / tp_;
  std::map<std::string, size_t> index;
  for (const auto& [name, p] : model_->parameters()) {
    const auto ends = [&](const std::string& s) {
      return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
    };
    const auto split = [&]() -> std::vector<Block> {
      if (tp_ == 1) return {};
      if (ends("attn.c_attn.weight") || ends("attn.c_attn.bias")) {
        return {{0, t_ * dl, dl}, {0, D + t_ * dl, dl}, {0, 2 * D + t_ * dl, dl}};
      }
      if (ends("attn.c_proj.weight")) return {{1, t_ * dl, dl}};
      if (ends("mlp.c_fc.weight") || ends("mlp.c_fc.bias")) return {{0, t_ * F, F}};
      if (ends("mlp.c_proj.weight")) return {{1, t_ * F, F}};
      return {};
    };
    index[name] = params_.size();
    params_.push_back(p);
    blocks_.push_back(split());
  }
  for (int l = 0; l < model_->layers(); ++l) {
    const std::string n = "h" + std::to_string(l) + ".";
    layers_.push_back({index.at(n + "attn.c_attn.weight"), index.at(n + "attn.c_attn.bias"),
                       index.at(n + "attn.c_proj.weight"), index.at(n + "attn.c_proj.bias"),
                       index.at(n + "mlp.c_fc.weight"), index.at(n + "mlp.c_fc.bias"),
                       index.at(n + "mlp.c_proj.weight"), index.at(n + "mlp.c_proj.bias")});
  }
  modelMemory(ctx);
}

void CpExecutor::modelMemory(RankContext& ctx) {
  if (reference::caseDevice().is_cuda()) {
    notPredicted_ =
        "the model replays LibTorch's CPU allocations; CUDA's kernels allocate their own";
    return;
  }
  if (case_.dtype != at::kFloat && case_.dtype != at::kDouble) {
    notPredicted_ = "the model was read off float32 and float64 steps";
    return;
  }
  if (layout_.local() == 1 && variant_ != Variant::kRingP2P) {
    notPredicted_ =
        "one token per rank: LibTorch makes views where the model has copies (not "
        "modelled)";
    return;
  }
  if (variant_ == Variant::kUlysses && layout_.w == 1) {
    notPredicted_ =
        "ulysses on one rank (its all-to-alls and reshapes copy nothing) is not modelled";
    return;
  }
  CpStepSizes s;
  s.variant = variant_;
  s.fault = fault_;
  s.training = shape_.training;
  s.causal = shape_.causal;
  s.batch = shape_.batch;
  s.seq = shape_.seq;
  s.dModel = shape_.dModel;
  s.heads = shape_.heads;
  s.layers = shape_.layers;
  s.w = layout_.w;
  s.tp = tp_;
  s.ringRank = ctx.group({0}).rank();
  s.es = static_cast<int64_t>(c10::elementSize(case_.dtype));
  s.visible = attention_->visible();
  const at::ScalarType dtype = case_.dtype;
  const auto scratchOf = [dtype](harness::Communicator& c) {
    return [&c, dtype](Collective k, int64_t mine, int64_t most) {
      return c.scratchBytes(k, mine, most, dtype);
    };
  };
  s.cpScratch = scratchOf(ctx.group({0}));
  s.tpScratch = tp_ > 1 ? scratchOf(ctx.group({1})) : s.cpScratch;
  auto& mem = harness::MemoryTracker::instance();
  std::vector<CpMemoryEvent> log;
  stepPeak_ = cpStepPeak(s, mem.tracing(ctx.rank()) ? &log : nullptr);
  for (const auto& e : log) {
    fprintf(stderr, "model %+lld %s\n", static_cast<long long>(e.bytes), e.what);
  }
}

std::vector<harness::TraceValue> CpStrategy::referenceTrace(const CaseSpec& c,
                                                            const reference::WorkloadData&) const {
  const TransformerShape s = TransformerShape::parse(c.shape, c.workload);
  const Transformer m(s, c.dtype, c.seed);
  std::optional<at::NoGradGuard> noGrad;
  if (!s.training) noGrad.emplace();
  std::vector<std::pair<std::string, at::Tensor>> taps;  // (name, value), in forward order
  at::Tensor x = m.input().detach().clone().requires_grad_(s.training);
  for (int l = 0; l < m.layers(); ++l) {
    const at::Tensor h = m.ln1(l, x);
    const auto [k, v] = m.keysValues(l, h);
    const at::Tensor r = x + m.attention(l, h, 0, k, v, s.seq);
    if (c.mesh.size() < 2 || c.mesh[1] == 1) {
      taps.emplace_back("h" + std::to_string(l) + ".attn.residual", r);
    }
    x = r + m.ffn(l, m.ln2(l, r));
    taps.emplace_back("h" + std::to_string(l) + " out", x);
  }
  std::vector<harness::TraceValue> out;
  const auto nodeOf = [](const std::string& name) {
    const std::string layer = name.substr(0, name.find_first_of(". "));
    return name.find("residual") != std::string::npos ? layer + ".attn" : layer;
  };
  for (const auto& [name, t] : taps) out.push_back({nodeOf(name), "forward", name, t.detach(), {}});
  if (!s.training) return out;
  std::vector<at::Tensor> wrt;
  for (const auto& [name, t] : taps) wrt.push_back(t);
  const auto grads = torch::autograd::grad({x}, wrt, {m.target()}, false, false, true);
  // A gradient is made by the backward of what read its value: a layer's output by the next
  // layer's attention (and residual), the residual after attention by the layer's MLP.
  const auto madeBy = [&](const std::string& name) {
    const int l = std::stoi(name.substr(1));
    if (name.find("residual") != std::string::npos) return "h" + std::to_string(l) + ".mlp";
    return l + 1 < m.layers() ? "h" + std::to_string(l + 1) + ".attn" : std::string("loss");
  };
  for (size_t i = 0; i < taps.size(); ++i) {
    if (grads[i].defined()) {
      out.push_back({madeBy(taps[i].first), "backward", "grad " + taps[i].first, grads[i], {}});
    }
  }
  return out;
}

void CpExecutor::tap(int l, const std::string& name, const at::Tensor& t) {
  if (!tape_) return;
  const at::Tensor pos = attention_->positions().to(at::kCPU, at::kLong).contiguous();
  const int64_t* p = pos.data_ptr<int64_t>();
  const int64_t n = pos.numel();
  const std::string node =
      "h" + std::to_string(l) + (name.find("residual") != std::string::npos ? ".attn" : "");
  // (local start, length, box) of each run of consecutive positions.
  std::vector<std::tuple<int64_t, int64_t, harness::Box>> runs;
  for (int64_t i = 0; i < n;) {
    int64_t j = i + 1;
    while (j < n && p[j] == p[j - 1] + 1) ++j;
    harness::Box box = harness::Box::whole(t.sizes());
    box.offset[1] = p[i];
    box.length[1] = j - i;
    runs.emplace_back(i, j - i, box);
    i = j;
  }
  for (const auto& [i, len, box] : runs)
    tape_->keep(node, "forward", name, t.narrow(1, i, len), box);
  if (!t.requires_grad()) return;
  // The gradient as the backward completes it, cut into the same runs.
  harness::CaptureTape* tape = tape_.get();
  t.register_hook([tape, node, name, runs](const at::Tensor& grad) {
    for (const auto& [i, len, box] : runs) {
      tape->keep(node, "backward", "grad " + name, grad.narrow(1, i, len), box);
    }
  });
}

void CpExecutor::step(RankContext& ctx) {
  ctx_ = &ctx;
  if (captureOn_) tape_ = std::make_unique<harness::CaptureTape>();
  entryLive_ = harness::MemoryTracker::instance().current(ctx.rank());
  const Transformer& m = *model_;
  if (shape_.training) m.zeroGrad();
  at::Tensor x0 = input_;
  if (shape_.training) {
    x0.requires_grad_(true);
    x0.mutable_grad() = at::Tensor();  // the last step's
  }
  std::optional<at::NoGradGuard> noGrad;
  if (!shape_.training) noGrad.emplace();
  at::Tensor x = x0;
  for (int l = 0; l < m.layers(); ++l) {
    // The layer's collectives are its own (comm_site.h), forward and, saved, backward.
    const harness::CommSiteScope site("h" + std::to_string(l));
    if (tp_ > 1) {
      x = tensorParallelLayer(l, x);
      tap(l, "h" + std::to_string(l) + " out", x);
      continue;
    }
    const at::Tensor h = m.ln1(l, x);
    const auto [k, v] = m.keysValues(l, h);
    const at::Tensor q = m.queries(l, h);
    const at::Tensor heads = attention_->attend(ctx.group({0}), q, k, v);
    const at::Tensor y =
        heads.transpose(1, 2).reshape({heads.size(0), heads.size(2), shape_.dModel});
    const at::Tensor r = x + m.project(l, y);
    tap(l, "h" + std::to_string(l) + ".attn.residual", r);
    x = r + m.ffn(l, m.ln2(l, r));
    tap(l, "h" + std::to_string(l) + " out", x);
  }
  out_ = x.detach();
  gradIn_ = at::Tensor();
  const auto endCapture = [&] {
    if (!tape_) return;
    captured_ = tape_->take();
    tape_.reset();
  };
  if (!shape_.training) {
    endCapture();
    return;
  }
  reference::backward({x}, {target_});
  endCapture();
  gradIn_ = x0.grad();
  Communicator& cp = ctx.group({0});
  for (size_t i = 0; i < params_.size(); ++i) {
    // At its layer ("h3.attn.qkv.weight": h3), in the update.
    const std::string& name = model_->parameters()[i].first;
    const harness::CommSiteScope site(name.substr(0, name.find('.')), harness::StepPhase::kUpdate);
    at::Tensor g = params_[i].grad();
    if (blocks_[i].empty()) {
      cp.allReduce(g);
      continue;
    }
    for (at::Tensor block : tpBlocks(i, g)) {
      at::Tensor sum = block.contiguous();
      cp.allReduce(sum);
      if (!sum.is_same(block)) block.copy_(sum);
    }
  }
}

std::vector<at::Tensor> CpExecutor::tpBlocks(size_t param, const at::Tensor& t) const {
  if (blocks_[param].empty()) return {t};
  std::vector<at::Tensor> out;
  for (const Block& b : blocks_[param]) out.push_back(t.narrow(b.dim, b.offset, b.length));
  return out;
}

at::Tensor CpExecutor::tensorParallelLayer(int l, const at::Tensor& x) {
  Communicator& tp = ctx_->group({1});
  const Transformer& m = *model_;
  const LayerParams& L = layers_[l];
  const auto one = [&](size_t i) { return tpBlocks(i, params_[i]).front(); };
  const int64_t D = shape_.dModel, H = shape_.heads / tp_, dh = D / shape_.heads;
  const auto heads = [&](const at::Tensor& t) {
    return t.reshape({t.size(0), t.size(1), H, dh}).transpose(1, 2);
  };
  const auto w = tpBlocks(L.qkvW, params_[L.qkvW]);
  const auto b = tpBlocks(L.qkvB, params_[L.qkvB]);
  const at::Tensor h = fault_ == Fault::kTpInputGradUnsummed
                           ? m.ln1(l, x)
                           : harness::identityFwdAllReduceBwd(m.ln1(l, x), tp);  // f
  const at::Tensor out =
      attention_->attend(ctx_->group({0}), heads(at::linear(h, w[0], b[0])),
                         heads(at::linear(h, w[1], b[1])), heads(at::linear(h, w[2], b[2])));
  const at::Tensor y = out.transpose(1, 2).reshape({out.size(0), out.size(2), H * dh});
  const at::Tensor proj = at::linear(y, one(L.projW));
  const at::Tensor r = x + (harness::allReduceFwdIdentityBwd(proj, tp) + params_[L.projB]);  // g
  const at::Tensor h2 = harness::identityFwdAllReduceBwd(m.ln2(l, r), tp);                   // f
  const at::Tensor u = at::gelu(at::linear(h2, one(L.fcW), one(L.fcB)), "tanh");
  const at::Tensor mlp = at::linear(u, one(L.mlpW));
  return r + (harness::allReduceFwdIdentityBwd(mlp, tp) + params_[L.mlpB]);
}

void CpExecutor::settle(RankContext& ctx) {
  results_.clear();
  const int w = layout_.w;
  const auto whole = [&](const at::Tensor& t) {  // [B, Tl, D] shards to [B, T, D]
    return ctx.group({0})
        .allGather(t.transpose(0, 1).contiguous(), std::vector<int64_t>(w, layout_.local()))
        .index_select(0, attention_->inverse())
        .transpose(0, 1)
        .contiguous();
  };
  results_["output"] = whole(out_);
  if (!shape_.training) return;
  results_["grad_input"] = whole(gradIn_);
  for (size_t i = 0; i < params_.size(); ++i) {
    const std::string& name = model_->parameters()[i].first;
    at::Tensor g = params_[i].grad();
    if (!blocks_[i].empty()) {
      // A sharded parameter's gradient is this rank's slice, zero elsewhere: the slices of the
      // tensor-parallel ranks summed are the whole gradient.
      g = g.clone();
      ctx.group({1}).allReduce(g);
    }
    results_["grad/" + name] = g;
  }
}

std::vector<std::pair<std::string, std::string>> CpExecutor::recordParams() const {
  return {{"variant", variantId(variant_)},
          {"tensor_parallel", std::to_string(tp_)},
          {"load_balanced", layout_.balanced ? "yes" : "no"},
          {"tokens_per_rank", std::to_string(layout_.local())}};
}

std::vector<std::unique_ptr<harness::Strategy>> registerContextParallel() {
  std::vector<std::unique_ptr<harness::Strategy>> out;
  for (Variant v : {Variant::kRingP2P, Variant::kRingAllGather, Variant::kUlysses}) {
    out.push_back(std::make_unique<CpStrategy>(v, Fault::kNone));
  }
  return out;
}

}  // namespace
}  // namespace sb::strategies::cp

SB_REGISTER_STRATEGIES(sb::strategies::cp::registerContextParallel);
