#pragma once

// Normalisation whose statistics span ranks (SplitNorm), shared by layer norm over a split
// hidden dimension (layer_norm.cpp) and synchronised batch norm (batch_norm.cpp), with the
// replay of its allocations.

#include <torch/csrc/autograd/custom_function.h>

#include <cstdint>
#include <vector>

#include "harness/comm/comm_site.h"
#include "strategies/sharding/ops/op_rule.h"

namespace sb::strategies {

// The normalisations' epsilon, as the reference's.
constexpr double kNormEps = 1e-5;

// Normalisation whose statistics span ranks: y = (x - mean) * rstd * w + b, with the mean and
// variance over `dims` of the whole tensor while each rank holds a piece of those dimensions
// (a layer norm over a split hidden dimension; a batch norm over a split batch, PyTorch's
// SyncBatchNorm). Forward: the sum, then the centred sum of squares, each all-reduced (two
// passes: no cancellation). Backward: the two sums the input gradient needs (of g = dy * w and
// of g * xhat), all-reduced together. Every buffer is allocated where the comments say, which
// the memory model (OpExecutor::modelPeak, splitNormReplay) replays.
struct SplitNorm : torch::autograd::Function<SplitNorm> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const at::Tensor& w, const at::Tensor& b, harness::Communicator* comm,
                            std::vector<int64_t> dims, std::vector<int64_t> paramView,
                            double count) {
    at::Tensor s = x.sum(dims, /*keepdim=*/true);  // R
    if (comm != nullptr) comm->allReduce(s);       // + scratch(R)
    s.div_(count);
    at::Tensor xhat = x - s;                       // X
    s.reset();                                     // - R
    at::Tensor v = (xhat * xhat).sum(dims, true);  // + X, + R, - X
    if (comm != nullptr) comm->allReduce(v);
    v.div_(count).add_(kNormEps).rsqrt_();  // rstd, in place
    xhat.mul_(v);
    at::Tensor y = at::addcmul(b.view(paramView), xhat, w.view(paramView));  // X
    ctx->save_for_backward({xhat, v, w});
    ctx->saved_data["comm"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(comm));
    harness::saveCommNode(ctx);
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
    auto* comm = reinterpret_cast<harness::Communicator*>(
        static_cast<intptr_t>(ctx->saved_data["comm"].toInt()));
    const auto dims = ctx->saved_data["dims"].toIntVector();
    const auto view = ctx->saved_data["view"].toIntVector();
    const double count = ctx->saved_data["count"].toDouble();
    const at::Tensor& dy = grads[0];
    // The sums over the statistics' dimensions that every rank needs whole, in one buffer.
    at::Tensor g = dy * w.view(view);  // X
    at::Tensor st = at::cat({g.sum(dims, true), (g * xhat).sum(dims, true)}, dims.back());
    if (comm != nullptr) {
      const auto site = harness::backwardCommSite(ctx);
      comm->allReduce(st);  // + scratch(2R)
    }
    st.div_(count);
    // dx = rstd * (g - mean(g) - xhat * mean(g * xhat))
    at::Tensor dx = xhat * st.narrow(dims.back(), 1, 1);  // X
    dx.add_(st.narrow(dims.back(), 0, 1)).neg_().add_(g).mul_(rstd);
    g.reset();
    st.reset();
    // The parameters' gradients: summed over the dimensions they were broadcast along (`view`
    // lines up with dy's trailing dimensions), not over those where `view` and dy both have
    // extent 1 (a rank's one channel or hidden unit is the parameter's own dimension), and
    // shaped as the parameter. (A sum over no dimensions would be over all of them.)
    std::vector<int64_t> paramDims;
    const int64_t offset = dy.dim() - static_cast<int64_t>(view.size());
    for (int64_t d = 0; d < dy.dim(); ++d) {
      if (d < offset || (view[d - offset] == 1 && dy.size(d) != 1)) paramDims.push_back(d);
    }
    const auto reduce = [&](const at::Tensor& t) {
      return (paramDims.empty() ? t.clone() : t.sum(paramDims)).view(w.sizes());
    };
    at::Tensor dw = reduce(dy * xhat);  // + X, + W, - X
    at::Tensor db = reduce(dy);         // + W
    return {dx, dw, db, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// SplitNorm's allocations, as its comments list its buffers: R bytes of statistics, W of each
// parameter's gradient.
void splitNormReplay(MemoryReplay& m, int64_t R, int64_t W);

}  // namespace sb::strategies
