// Context parallelism: `sharding/cp/<variant>`, the sequence of a transformer stack (workloads
// gpt2_prefill, causal, and vit_encoder, bidirectional; inference or training) sharded over
// the ranks of a 1-D mesh. Every rank holds its tokens' activations; the parameters are
// replicated and their gradients, partial sums over each rank's tokens, all-reduced. Layer
// norms, projections, the MLP and the residuals are token-wise and run on the shards; only
// attention needs other ranks' tokens:
//
//   ring/p2p        each rank keeps its queries and passes its keys and values around the ring
//                   (w - 1 steps), folding each block into the online softmax
//                   (kernels::OnlineSoftmaxBlocks); the backward passes the keys and values
//                   around again with their gradients' running sums, which take one more step
//                   home to their owner (w - 1 exchanges of k, v, dk, dv, then one of dk, dv)
//   ring/allgather  keys and values all-gathered once (Llama 3's variant) and kept for the
//                   backward, walked in position order in blocks of T / w; their gradients
//                   reduce-scattered back to their owners
//   ulysses         DeepSpeed-Ulysses: one all-to-all turns sequence shards of q, k and v into
//                   head shards (heads / w heads over the whole sequence), attention runs whole
//                   per head, a second all-to-all turns the output back; the backward mirrors
//                   both (harness/comm/autograd_comm.h)
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
// Results: the output and input gradient gathered whole to every rank after the step (settle:
// uncounted, as the harness takes results), so that a token computed at the wrong position is
// a mismatch wherever the load balancing put it.
//
// Planted faults (tests): "stale_kv" (ring/p2p: the backward recomputes every step with its own
// keys and values, diffusers#14265), "dkv_not_returned" (ring/p2p: the last hop of dk, dv
// skipped, so each rank keeps its neighbour's), "mask_ignores_balance" (the causal mask built
// from contiguous positions while the tokens are load-balanced), "ulysses_swapped" (ulysses:
// the output's head and sequence dimensions swapped before the second all-to-all).

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>

#include "harness/comm/autograd_comm.h"
#include "harness/registry.h"
#include "kernels/attention.h"
#include "reference/autograd_engine.h"
#include "reference/transformer.h"

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

enum class Variant { kRingP2P, kRingAllGather, kUlysses };
enum class Fault { kNone, kStaleKv, kDkvNotReturned, kMaskIgnoresBalance, kUlyssesSwapped };

const char* variantId(Variant v) {
  switch (v) {
    case Variant::kRingP2P:
      return "ring/p2p";
    case Variant::kRingAllGather:
      return "ring/allgather";
    case Variant::kUlysses:
      return "ulysses";
  }
  return "?";
}

const char* faultName(Fault f) {
  switch (f) {
    case Fault::kNone:
      return "none";
    case Fault::kStaleKv:
      return "stale_kv";
    case Fault::kDkvNotReturned:
      return "dkv_not_returned";
    case Fault::kMaskIgnoresBalance:
      return "mask_ignores_balance";
    case Fault::kUlyssesSwapped:
      return "ulysses_swapped";
  }
  return "?";
}

// Which sequence positions each rank holds.
struct SeqLayout {
  int w = 1;
  int64_t T = 0;
  bool balanced = false;
  int64_t local() const { return T / w; }
  // Rank r's positions, in the order its activations hold them.
  std::vector<int64_t> positions(int r) const {
    std::vector<int64_t> p;
    if (!balanced) {
      for (int64_t i = 0; i < local(); ++i) p.push_back(r * local() + i);
      return p;
    }
    const int64_t c = T / (2 * w);
    for (int64_t chunk : {static_cast<int64_t>(r), static_cast<int64_t>(2 * w - 1 - r)}) {
      for (int64_t i = 0; i < c; ++i) p.push_back(chunk * c + i);
    }
    return p;
  }
  // (query, key) pairs rank r's queries see: causal counts key <= query.
  int64_t visiblePairs(int r, bool causal) const {
    int64_t n = 0;
    for (int64_t q : positions(r)) n += causal ? q + 1 : T;
    return n;
  }
};

// The dtype the attention's arithmetic runs in (kernels/attention.h).
at::ScalarType mathOf(at::ScalarType t) {
  return (t == at::kHalf || t == at::kBFloat16) ? at::kFloat : t;
}

at::Tensor longs(const std::vector<int64_t>& v) {
  return at::tensor(v, at::TensorOptions().dtype(at::kLong));
}

class CpStrategy;

class CpExecutor final : public harness::RankExecutor {
 public:
  CpExecutor(const CpStrategy& s, const CaseSpec& c);
  void prepare(RankContext& ctx, const reference::WorkloadData& data) override;
  void step(RankContext& ctx) override;
  void settle(RankContext& ctx) override;
  std::map<std::string, at::Tensor> results() const override { return results_; }
  std::vector<std::pair<std::string, std::string>> recordParams() const override;

  // The attention core's two halves, for the autograd functions below.
  kernels::AttentionResult ringForward(const at::Tensor& q, const at::Tensor& k,
                                       const at::Tensor& v, at::Tensor* keptKv);
  std::vector<at::Tensor> ringBackward(const at::Tensor& q, const at::Tensor& k,
                                       const at::Tensor& v, const at::Tensor& keptKv,
                                       const at::Tensor& out, const at::Tensor& lse,
                                       const at::Tensor& dout);

 private:
  at::Tensor ulysses(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v);
  // The mask between query positions and a block of key positions (undefined: none).
  at::Tensor maskFor(const at::Tensor& qpos, const at::Tensor& kpos) const {
    return shape_.causal ? kernels::maskByPosition(qpos, kpos) : at::Tensor();
  }
  bool blockVisible(const at::Tensor& qpos, const at::Tensor& kpos) const {
    return !shape_.causal || kpos.min().item<int64_t>() <= qpos.max().item<int64_t>();
  }

  const CpStrategy& strategy_;
  CaseSpec case_;
  TransformerShape shape_;
  Variant variant_;
  Fault fault_;
  SeqLayout layout_;
  double scale_ = 1;
  RankContext* ctx_ = nullptr;
  std::unique_ptr<Transformer> model_;
  std::vector<at::Tensor> rankPos_;  // every rank's positions
  at::Tensor pos_, maskPos_;         // this rank's positions; those its mask uses
  std::vector<at::Tensor> rankMaskPos_;
  at::Tensor allPos_, inverse_;  // positions in rank order, and the permutation back
  at::Tensor out_, gradIn_;
  std::map<std::string, at::Tensor> results_;
};

class CpStrategy final : public harness::Strategy {
 public:
  CpStrategy(Variant v, Fault f)
      : Strategy(std::string("sharding/cp/") + variantId(v),
                 std::string("context parallel ") + variantId(v), harness::Family::kSharding),
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

  static SeqLayout layoutOf(const CaseSpec& c) {
    const auto s = TransformerShape::parse(c.shape, c.workload);
    SeqLayout l;
    l.w = static_cast<int>(c.meshSize());
    l.T = s.seq;
    l.balanced = s.causal;
    if (c.params.contains("balance") && c.params["balance"].is_boolean()) {
      l.balanced = c.params["balance"].get<bool>();
    }
    return l;
  }

  Applicability applies(const CaseSpec& c) const override {
    if (c.workload != "gpt2_prefill" && c.workload != "vit_encoder") {
      return Applicability::notApplicable("not a transformer stack (gpt2_prefill, vit_encoder)");
    }
    if (c.mesh.size() != 1) {
      return Applicability::unsupported(
          "context parallelism shards the sequence over a 1-D "
          "mesh; the case has " +
          c.meshString() + " (CP x TP is not built yet)");
    }
    if (c.params.contains("balance") && !c.params["balance"].is_boolean()) {
      return Applicability::unsupported("params.balance must be true or false, got " +
                                        c.params["balance"].dump());
    }
    const auto s = TransformerShape::parse(c.shape, c.workload);
    const SeqLayout l = layoutOf(c);
    const int64_t parts = l.balanced ? 2 * l.w : l.w;
    if (s.seq % parts != 0) {
      return Applicability::unsupported("the sequence (" + std::to_string(s.seq) +
                                        ") does not cut into " + std::to_string(parts) +
                                        (l.balanced ? " load-balanced chunks" : " equal shards"));
    }
    if (variant_ == Variant::kUlysses && s.heads % l.w != 0) {
      return Applicability::unsupported("ulysses splits the " + std::to_string(s.heads) +
                                        " heads over " + std::to_string(l.w) +
                                        " ranks: they must divide");
    }
    return Applicability::yes();
  }

  std::unique_ptr<harness::RankExecutor> makeExecutor(const CaseSpec& c) const override {
    return std::make_unique<CpExecutor>(*this, c);
  }

  Box resultBox(const std::string&, const CaseSpec&, int) const override {
    TORCH_INTERNAL_ASSERT(false, "cp results are boxed by resultBoxOf");
  }
  Box resultBoxOf(const std::string&, const CaseSpec&, int, at::IntArrayRef shape) const override {
    return Box::whole(shape);  // gathered (output, grad_input) or all-reduced (parameters)
  }

  CommStats predictComm(const CaseSpec& c, int) const override {
    const auto s = TransformerShape::parse(c.shape, c.workload);
    const SeqLayout l = layoutOf(c);
    const int64_t es = static_cast<int64_t>(c10::elementSize(c.dtype));
    const int64_t act = s.batch * l.local() * s.dModel * es;  // one of q, k, v on a rank
    const int64_t w = l.w;
    CommStats out;
    for (int64_t layer = 0; layer < s.layers; ++layer) {
      switch (variant_) {
        case Variant::kRingP2P:
          for (int64_t i = 0; i + 1 < w; ++i) out.add(Collective::kSendRecv, 2 * act);
          if (s.training) {
            for (int64_t i = 0; i + 1 < w; ++i) out.add(Collective::kSendRecv, 4 * act);
            if (fault_ != Fault::kDkvNotReturned) out.add(Collective::kSendRecv, 2 * act);
          }
          break;
        case Variant::kRingAllGather:
          out.add(Collective::kAllGather, 2 * act * w);
          if (s.training) out.add(Collective::kReduceScatter, 2 * act * w);
          break;
        case Variant::kUlysses:
          out.add(Collective::kAllToAll, 3 * act);
          out.add(Collective::kAllToAll, act);
          if (s.training) {
            out.add(Collective::kAllToAll, act);
            out.add(Collective::kAllToAll, 3 * act);
          }
          break;
      }
    }
    if (s.training) {  // every parameter's gradient, once (reference/transformer.h's layer)
      const int64_t D = s.dModel;
      for (int64_t layer = 0; layer < s.layers; ++layer) {
        for (int64_t n : {D, D, 3 * D * D, 3 * D, D * D, D, D, D, 4 * D * D, 4 * D, 4 * D * D, D}) {
          out.add(Collective::kAllReduce, n * es);
        }
      }
    }
    if (w == 1) {  // a group of one moves nothing
      for (auto& e : out.entries) e.bytes = 0;
    }
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

  std::vector<std::string> plantableFaults() const override {
    switch (variant_) {
      case Variant::kRingP2P:
        return {faultName(Fault::kStaleKv), faultName(Fault::kDkvNotReturned),
                faultName(Fault::kMaskIgnoresBalance)};
      case Variant::kRingAllGather:
        return {faultName(Fault::kMaskIgnoresBalance)};
      case Variant::kUlysses:
        return {faultName(Fault::kUlyssesSwapped)};
    }
    return {};
  }
  std::unique_ptr<harness::Strategy> withPlantedFault(const std::string& name) const override {
    for (Fault f : {Fault::kStaleKv, Fault::kDkvNotReturned, Fault::kMaskIgnoresBalance,
                    Fault::kUlyssesSwapped}) {
      const auto ok = plantableFaults();
      if (name == faultName(f) && std::find(ok.begin(), ok.end(), name) != ok.end()) {
        return std::make_unique<CpStrategy>(variant_, f);
      }
    }
    return nullptr;
  }

 private:
  Variant variant_;
  Fault fault_;
};

// The ring variants' attention core as one autograd node per layer.
struct RingAttention : public torch::autograd::Function<RingAttention> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q,
                            const at::Tensor& k, const at::Tensor& v, int64_t executor) {
    auto* e = reinterpret_cast<CpExecutor*>(executor);
    at::Tensor kept;
    const kernels::AttentionResult r = e->ringForward(q, k, v, &kept);
    ctx->save_for_backward({q, k, v, r.out, r.lse, kept});
    ctx->saved_data["executor"] = executor;
    return r.out;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* e = reinterpret_cast<CpExecutor*>(ctx->saved_data["executor"].toInt());
    const auto s = ctx->get_saved_variables();
    std::vector<at::Tensor> g = e->ringBackward(s[0], s[1], s[2], s[5], s[3], s[4], grads[0]);
    g.emplace_back();
    return g;
  }
};

CpExecutor::CpExecutor(const CpStrategy& s, const CaseSpec& c)
    : strategy_(s),
      case_(c),
      shape_(TransformerShape::parse(c.shape, c.workload)),
      variant_(s.variant()),
      fault_(s.fault()),
      layout_(CpStrategy::layoutOf(c)) {}

void CpExecutor::prepare(RankContext& ctx, const reference::WorkloadData&) {
  ctx_ = &ctx;
  model_ = std::make_unique<Transformer>(shape_, case_.dtype, case_.seed);
  scale_ = 1.0 / std::sqrt(static_cast<double>(shape_.dModel / shape_.heads));
  SeqLayout contiguous = layout_;
  contiguous.balanced = false;
  std::vector<int64_t> all;
  for (int r = 0; r < layout_.w; ++r) {
    const auto p = layout_.positions(r);
    rankPos_.push_back(longs(p));
    rankMaskPos_.push_back(
        longs(fault_ == Fault::kMaskIgnoresBalance ? contiguous.positions(r) : p));
    all.insert(all.end(), p.begin(), p.end());
  }
  pos_ = rankPos_[ctx.rank()];
  maskPos_ = rankMaskPos_[ctx.rank()];
  allPos_ = longs(all);
  inverse_ = at::argsort(allPos_);
}

kernels::AttentionResult CpExecutor::ringForward(const at::Tensor& q, const at::Tensor& k,
                                                 const at::Tensor& v, at::Tensor* keptKv) {
  Communicator& comm = ctx_->world();
  const int r = comm.rank(), w = comm.size();
  kernels::OnlineSoftmaxBlocks acc(q, scale_);
  if (variant_ == Variant::kRingP2P) {
    at::Tensor kv = at::stack({k, v}).contiguous();
    for (int s = 0; s < w; ++s) {
      const int src = (r - s + w) % w;
      if (s > 0) kv = comm.ringShift(kv);
      if (blockVisible(maskPos_, rankMaskPos_[src])) {
        acc.add(kv[0], kv[1], maskFor(maskPos_, rankMaskPos_[src]));
      }
    }
    return acc.finish();
  }
  // all-gather: [Tl, 2, B, H, dh] rows from every rank, then in position order.
  const at::Tensor mine = at::stack({k, v}).permute({3, 0, 1, 2, 4}).contiguous();
  const at::Tensor gathered =
      comm.allGather(mine, std::vector<int64_t>(w, layout_.local())).index_select(0, inverse_);
  *keptKv = gathered;
  const int64_t block = layout_.local();
  const at::Tensor maskPositions = fault_ == Fault::kMaskIgnoresBalance
                                       ? at::arange(layout_.T, at::kLong).index_select(0, inverse_)
                                       : at::arange(layout_.T, at::kLong);
  for (int64_t s = 0; s < layout_.T; s += block) {
    const at::Tensor kpos = maskPositions.narrow(0, s, block);
    if (!blockVisible(maskPos_, kpos)) continue;
    const at::Tensor kvb = gathered.narrow(0, s, block).permute({1, 2, 3, 0, 4});
    acc.add(kvb[0], kvb[1], maskFor(maskPos_, kpos));
  }
  return acc.finish();
}

std::vector<at::Tensor> CpExecutor::ringBackward(const at::Tensor& q, const at::Tensor& k,
                                                 const at::Tensor& v, const at::Tensor& keptKv,
                                                 const at::Tensor& out, const at::Tensor& lse,
                                                 const at::Tensor& dout) {
  Communicator& comm = ctx_->world();
  const int r = comm.rank(), w = comm.size();
  kernels::OnlineSoftmaxBackwardBlocks grad(q, out, lse, dout, scale_);
  const at::ScalarType input = q.scalar_type();
  if (variant_ == Variant::kRingP2P) {
    const at::Tensor own = at::stack({k, v}).contiguous();
    at::Tensor kv = own;
    at::Tensor dkv;  // the running sums of the block this rank holds
    for (int s = 0; s < w; ++s) {
      const int src = (r - s + w) % w;
      if (s > 0) {
        at::Tensor kvIn = at::empty_like(kv), dkvIn = at::empty_like(dkv);
        using Op = Communicator::P2POp;
        comm.exchange({{Op::Kind::kSend, kv, (r + 1) % w},
                       {Op::Kind::kSend, dkv, (r + 1) % w},
                       {Op::Kind::kRecv, kvIn, (r + w - 1) % w},
                       {Op::Kind::kRecv, dkvIn, (r + w - 1) % w}});
        kv = kvIn;
        dkv = dkvIn;
      }
      const at::Tensor& used = fault_ == Fault::kStaleKv ? own : kv;
      at::Tensor contribution;
      if (blockVisible(maskPos_, rankMaskPos_[src])) {
        const auto [dk, dv] = grad.add(used[0], used[1], maskFor(maskPos_, rankMaskPos_[src]));
        contribution = at::stack({dk, dv});
      }
      if (s == 0) {
        dkv = contribution.defined() ? contribution.contiguous()
                                     : at::zeros(own.sizes(), own.options().dtype(mathOf(input)));
      } else if (contribution.defined()) {
        dkv.add_(contribution);
      }
    }
    // The sums of block r + 1 go home; this rank's come from rank r - 1.
    if (fault_ != Fault::kDkvNotReturned) dkv = comm.ringShift(dkv);
    return {grad.dq(), dkv[0].to(input), dkv[1].to(input)};
  }
  // all-gather: every block's gradient from this rank's queries, then reduce-scattered.
  const int64_t block = layout_.local();
  const at::Tensor maskPositions = fault_ == Fault::kMaskIgnoresBalance
                                       ? at::arange(layout_.T, at::kLong).index_select(0, inverse_)
                                       : at::arange(layout_.T, at::kLong);
  at::Tensor dkvAll = at::zeros(keptKv.sizes(), keptKv.options().dtype(mathOf(input)));
  for (int64_t s = 0; s < layout_.T; s += block) {
    const at::Tensor kpos = maskPositions.narrow(0, s, block);
    if (!blockVisible(maskPos_, kpos)) continue;
    const at::Tensor kvb = keptKv.narrow(0, s, block).permute({1, 2, 3, 0, 4});
    const auto [dk, dv] = grad.add(kvb[0], kvb[1], maskFor(maskPos_, kpos));
    dkvAll.narrow(0, s, block).copy_(at::stack({dk, dv}).permute({3, 0, 1, 2, 4}));
  }
  // Back to rank order, then each rank's rows summed over the ranks.
  const at::Tensor mine = comm.reduceScatter(dkvAll.index_select(0, allPos_).contiguous(),
                                             std::vector<int64_t>(w, layout_.local()));
  const at::Tensor dkv = mine.permute({1, 2, 3, 0, 4});
  return {grad.dq(), dkv[0].to(input), dkv[1].to(input)};
}

at::Tensor CpExecutor::ulysses(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  Communicator& comm = ctx_->world();
  const int w = comm.size();
  const int64_t B = q.size(0), H = q.size(1), Tl = q.size(2), dh = q.size(3), T = layout_.T;
  const int64_t Hl = H / w;
  const std::vector<int64_t> ones(w, 1);
  // Sequence shards to head shards: block g of the heads to rank g.
  const at::Tensor qkv =
      at::stack({q, k, v}).view({3, B, w, Hl, Tl, dh}).permute({2, 0, 1, 3, 4, 5}).contiguous();
  const at::Tensor heads = harness::allToAllFwdAllToAllBwd(qkv, comm, ones, ones)
                               .permute({1, 2, 3, 0, 4, 5})
                               .reshape({3, B, Hl, T, dh})
                               .index_select(3, inverse_);  // position order
  // Whole-sequence attention on this rank's heads, as the reference computes it.
  at::Tensor att = at::matmul(heads[0], heads[1].transpose(-2, -1)) / std::sqrt(double(dh));
  if (shape_.causal) {
    const at::Tensor p = at::arange(T, at::kLong);
    att = att.masked_fill(p.unsqueeze(0).gt(p.unsqueeze(1)), -INFINITY);
  }
  at::Tensor o = at::matmul(at::softmax(att, -1), heads[2]);  // [B, Hl, T, dh]
  if (fault_ == Fault::kUlyssesSwapped) o = o.transpose(1, 2).reshape({B, Hl, T, dh});
  // Back to sequence shards: rank s's tokens, every head of this rank's group.
  const at::Tensor send =
      o.index_select(2, allPos_).view({B, Hl, w, Tl, dh}).permute({2, 0, 1, 3, 4}).contiguous();
  return harness::allToAllFwdAllToAllBwd(send, comm, ones, ones)
      .permute({1, 0, 2, 3, 4})
      .reshape({B, H, Tl, dh});
}

void CpExecutor::step(RankContext& ctx) {
  ctx_ = &ctx;
  const Transformer& m = *model_;
  if (shape_.training) m.zeroGrad();
  at::Tensor x0 = m.input().index_select(1, pos_);
  if (shape_.training) x0.requires_grad_(true);
  std::optional<at::NoGradGuard> noGrad;
  if (!shape_.training) noGrad.emplace();
  at::Tensor x = x0;
  for (int l = 0; l < m.layers(); ++l) {
    const at::Tensor h = m.ln1(l, x);
    const auto [k, v] = m.keysValues(l, h);
    const at::Tensor q = m.queries(l, h);
    at::Tensor heads;
    if (variant_ == Variant::kUlysses) {
      heads = ulysses(q, k, v);
    } else if (shape_.training) {
      heads = RingAttention::apply(q, k, v, reinterpret_cast<int64_t>(this));
    } else {
      at::Tensor kept;
      heads = ringForward(q, k, v, &kept).out;
    }
    const at::Tensor y =
        heads.transpose(1, 2).reshape({heads.size(0), heads.size(2), shape_.dModel});
    const at::Tensor r = x + m.project(l, y);
    x = r + m.ffn(l, m.ln2(l, r));
  }
  out_ = x.detach();
  gradIn_ = at::Tensor();
  if (!shape_.training) return;
  reference::backward({x}, {m.target().index_select(1, pos_)});
  gradIn_ = x0.grad();
  for (const auto& [name, p] : m.parameters()) {
    at::Tensor g = p.grad();
    ctx.world().allReduce(g);
  }
}

void CpExecutor::settle(RankContext& ctx) {
  results_.clear();
  const int w = layout_.w;
  const auto whole = [&](const at::Tensor& t) {  // [B, Tl, D] shards to [B, T, D]
    return ctx.world()
        .allGather(t.transpose(0, 1).contiguous(), std::vector<int64_t>(w, layout_.local()))
        .index_select(0, inverse_)
        .transpose(0, 1)
        .contiguous();
  };
  results_["output"] = whole(out_);
  if (!shape_.training) return;
  results_["grad_input"] = whole(gradIn_);
  for (const auto& [name, p] : model_->parameters()) results_["grad/" + name] = p.grad();
}

std::vector<std::pair<std::string, std::string>> CpExecutor::recordParams() const {
  return {{"variant", variantId(variant_)},
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
