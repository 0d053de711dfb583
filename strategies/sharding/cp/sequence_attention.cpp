// Attention over a sharded sequence (see sequence_attention.h).

#include "strategies/sharding/cp/sequence_attention.h"
#include "harness/comm/comm_site.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cmath>

#include "harness/comm/autograd_comm.h"

namespace sb::strategies::cp {
namespace {

using harness::Communicator;

at::Tensor longs(const std::vector<int64_t>& v) {
  return at::tensor(v, at::TensorOptions().dtype(at::kLong));
}

// The ring variants' attention core as one autograd node per layer.
struct RingAttention : public torch::autograd::Function<RingAttention> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q,
                            const at::Tensor& k, const at::Tensor& v, int64_t attention,
                            int64_t axis) {
    const auto* a = reinterpret_cast<const SequenceAttention*>(attention);
    at::Tensor kept;
    const kernels::AttentionResult r =
        a->ringForward(*reinterpret_cast<Communicator*>(axis), q, k, v, &kept);
    ctx->save_for_backward({q, k, v, r.out, r.lse, kept});
    ctx->saved_data["attention"] = attention;
    ctx->saved_data["axis"] = axis;
    harness::saveCommNode(ctx);
    return r.out;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto* a =
        reinterpret_cast<const SequenceAttention*>(ctx->saved_data["attention"].toInt());
    auto* axis = reinterpret_cast<Communicator*>(ctx->saved_data["axis"].toInt());
    const auto s = ctx->get_saved_variables();
    const auto site = harness::backwardCommSite(ctx);
    std::vector<at::Tensor> g =
        a->ringBackward(*axis, s[0], s[1], s[2], s[5], s[3], s[4], grads[0]);
    g.resize(5);  // nothing for the two pointers
    return g;
  }
};

}  // namespace

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
    case Fault::kTpInputGradUnsummed:
      return "tp_input_grad_unsummed";
  }
  return "?";
}

std::vector<int64_t> SeqLayout::positions(int r) const {
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

int64_t SeqLayout::visiblePairs(int r, bool causal) const {
  int64_t n = 0;
  for (int64_t q : positions(r)) n += causal ? q + 1 : T;
  return n;
}

SequenceAttention::SequenceAttention(Variant variant, Fault fault, const SeqLayout& layout,
                                     bool causal, double scale, int ringRank)
    : variant_(variant), fault_(fault), layout_(layout), causal_(causal), scale_(scale) {
  // The positions the masks use: the layout's, or, planted, contiguous ones whatever the layout.
  SeqLayout masked = layout_;
  if (fault_ == Fault::kMaskIgnoresBalance) masked.balanced = false;
  std::vector<int64_t> all;
  std::vector<at::Tensor> maskPos;  // per rank
  for (int r = 0; r < layout_.w; ++r) {
    const auto p = layout_.positions(r);
    all.insert(all.end(), p.begin(), p.end());
    maskPos.push_back(longs(masked.positions(r)));
  }
  pos_ = longs(layout_.positions(ringRank));
  allPos_ = longs(all);
  inverse_ = at::argsort(allPos_);
  const at::Tensor& queries = maskPos[ringRank];
  const auto visible = [&](const at::Tensor& keys) {
    return !causal_ || keys.min().item<int64_t>() <= queries.max().item<int64_t>();
  };
  const auto mask = [&](const at::Tensor& keys) {
    return causal_ ? kernels::maskByPosition(queries, keys) : at::Tensor();
  };
  if (variant_ == Variant::kRingP2P) {
    for (const at::Tensor& keys : maskPos) {
      ringVisible_.push_back(visible(keys));
      ringMask_.push_back(mask(keys));
    }
  } else if (variant_ == Variant::kRingAllGather) {
    // Keys in position order; planted, each believed at its rank's contiguous place.
    const at::Tensor keyPos =
        fault_ == Fault::kMaskIgnoresBalance ? inverse_.clone() : at::arange(layout_.T, at::kLong);
    for (int64_t s = 0; s < layout_.T; s += layout_.local()) {
      const at::Tensor keys = keyPos.narrow(0, s, layout_.local());
      blockVisible_.push_back(visible(keys));
      blockMask_.push_back(mask(keys));
    }
  } else if (causal_) {
    const at::Tensor p = at::arange(layout_.T, at::kLong);
    wholeMask_ = kernels::maskByPosition(p, p);
  }
}

at::Tensor SequenceAttention::attend(Communicator& axis, const at::Tensor& q, const at::Tensor& k,
                                     const at::Tensor& v) const {
  if (variant_ == Variant::kUlysses) return ulysses(axis, q, k, v);
  if (at::GradMode::is_enabled()) {
    return RingAttention::apply(q, k, v, reinterpret_cast<int64_t>(this),
                                reinterpret_cast<int64_t>(&axis));
  }
  at::Tensor kept;
  return ringForward(axis, q, k, v, &kept).out;
}

kernels::AttentionResult SequenceAttention::ringForward(Communicator& comm, const at::Tensor& q,
                                                        const at::Tensor& k, const at::Tensor& v,
                                                        at::Tensor* keptKv) const {
  const int r = comm.rank(), w = comm.size();
  kernels::OnlineSoftmaxBlocks acc(q, scale_);
  if (variant_ == Variant::kRingP2P) {
    at::Tensor kv = at::stack({k, v}).contiguous();
    for (int s = 0; s < w; ++s) {
      const int src = (r - s + w) % w;
      if (s > 0) kv = comm.ringShift(kv);
      if (ringVisible_[src]) acc.add(kv[0], kv[1], ringMask_[src]);
    }
    return acc.finish();
  }
  // all-gather: [Tl, 2, B, H, dh] rows from every rank, then in position order.
  const at::Tensor mine = at::stack({k, v}).permute({3, 0, 1, 2, 4}).contiguous();
  const at::Tensor gathered =
      comm.allGather(mine, std::vector<int64_t>(w, layout_.local())).index_select(0, inverse_);
  *keptKv = gathered;
  for (size_t b = 0; b < blockMask_.size(); ++b) {
    if (!blockVisible_[b]) continue;
    const at::Tensor kvb =
        gathered.narrow(0, b * layout_.local(), layout_.local()).permute({1, 2, 3, 0, 4});
    acc.add(kvb[0], kvb[1], blockMask_[b]);
  }
  return acc.finish();
}

std::vector<at::Tensor> SequenceAttention::ringBackward(Communicator& comm, const at::Tensor& q,
                                                        const at::Tensor& k, const at::Tensor& v,
                                                        const at::Tensor& keptKv,
                                                        const at::Tensor& out,
                                                        const at::Tensor& lse,
                                                        const at::Tensor& dout) const {
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
      if (ringVisible_[src]) {
        const auto [dk, dv] = grad.add(used[0], used[1], ringMask_[src]);
        contribution = at::stack({dk, dv});
      }
      if (s == 0) {
        dkv = contribution.defined()
                  ? contribution.contiguous()
                  : at::zeros(own.sizes(), own.options().dtype(kernels::attentionMathType(input)));
      } else if (contribution.defined()) {
        dkv.add_(contribution);
      }
    }
    // The sums of block r + 1 go home; this rank's come from rank r - 1.
    if (fault_ != Fault::kDkvNotReturned) dkv = comm.ringShift(dkv);
    return {grad.dq(), dkv[0].to(input), dkv[1].to(input)};
  }
  // all-gather: every block's gradient from this rank's queries, then reduce-scattered.
  at::Tensor dkvAll =
      at::zeros(keptKv.sizes(), keptKv.options().dtype(kernels::attentionMathType(input)));
  for (size_t b = 0; b < blockMask_.size(); ++b) {
    if (!blockVisible_[b]) continue;
    const int64_t start = b * layout_.local();
    const at::Tensor kvb = keptKv.narrow(0, start, layout_.local()).permute({1, 2, 3, 0, 4});
    const auto [dk, dv] = grad.add(kvb[0], kvb[1], blockMask_[b]);
    dkvAll.narrow(0, start, layout_.local()).copy_(at::stack({dk, dv}).permute({3, 0, 1, 2, 4}));
  }
  // Back to rank order, then each rank's rows summed over the ranks.
  const at::Tensor mine = comm.reduceScatter(dkvAll.index_select(0, allPos_).contiguous(),
                                             std::vector<int64_t>(w, layout_.local()));
  const at::Tensor dkv = mine.permute({1, 2, 3, 0, 4});
  return {grad.dq(), dkv[0].to(input), dkv[1].to(input)};
}

at::Tensor SequenceAttention::ulysses(Communicator& comm, const at::Tensor& q, const at::Tensor& k,
                                      const at::Tensor& v) const {
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
  if (causal_) att = att.masked_fill(wholeMask_, -INFINITY);
  at::Tensor o = at::matmul(at::softmax(att, -1), heads[2]);  // [B, Hl, T, dh]
  if (fault_ == Fault::kUlyssesSwapped) o = o.transpose(1, 2).reshape({B, Hl, T, dh});
  // Back to sequence shards: rank s's tokens, every head of this rank's group.
  const at::Tensor send =
      o.index_select(2, allPos_).view({B, Hl, w, Tl, dh}).permute({2, 0, 1, 3, 4}).contiguous();
  return harness::allToAllFwdAllToAllBwd(send, comm, ones, ones)
      .permute({1, 0, 2, 3, 4})
      .reshape({B, H, Tl, dh});
}

}  // namespace sb::strategies::cp
