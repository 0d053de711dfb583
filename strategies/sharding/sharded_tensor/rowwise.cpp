// ShardedTensor row-wise sharded Linear (PyTorch's ChunkShardingSpec on dim 1 of the weight).
//
// The weight W [N, K] is chunked along its columns, that is along in_features: the rows of
// W^T, hence "row-wise". Chunk i holds ceil(K / n) columns (13 over 4 ranks: 4, 4, 4, 1) and
// lives on rank placements[i]. Every rank brings its own batch x_r [b, K] and wants its own
// output y_r [b, N]. A rank's chunk can only contract the matching in_features of each input,
// so the inputs, not the weight, travel:
//   1. each rank transposes its input to [K, b] and, if placements are not in rank order,
//      permutes its rows so that the in_features of the chunk on rank 0 come first, then those
//      of rank 1, and so on;
//   2. all-to-all: rank r receives from every rank s the K_c rows (features) that its chunk
//      covers, stacked in rank order  [n*K_c, b];
//   3. each rank multiplies every received block by its chunk: partial outputs for every
//      rank's rows, each a sum over only K_c of the K features  [n*b, N];
//   4. reduce-scatter: rank r receives the sum over all chunks of the partial output of its own
//      rows  [b, N];
//   5. the bias, which every rank holds whole, is added once.
// Backward runs it back: the reduce-scatter's adjoint all-gathers dy, dW_c = sum over blocks
// needs no communication, the input gradients of the blocks go back by the reverse all-to-all,
// and db (each rank's own rows only) is all-reduced, as DDP would for a replicated parameter.
//
// Per rank, with element size e: all-to-all K*b*e forward and n*K_c*b*e backward,
// reduce-scatter n*b*N*e, all-gather n*b*N*e, all-reduce N*e.

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include "harness/comm/autograd_comm.h"
#include "harness/registry.h"
#include "strategies/sharding/sharded_tensor/common.h"

namespace sb::strategies {
namespace {

using harness::chunkOffsets;
using harness::chunkOfRank;
using harness::chunkSizes;
using harness::Collective;
using reference::LinearShape;

class RowwiseStrategy;

class RowwiseExecutor final : public ShardedTensorExecutorBase {
 public:
  using ShardedTensorExecutorBase::ShardedTensorExecutorBase;
  void prepare(harness::RankContext& ctx, const reference::WorkloadData& data) override;
  void step(harness::RankContext& ctx) override;

 private:
  std::vector<int64_t> sendRows_;  // features sent to each rank
  at::Tensor featureOrder_;        // chunk order -> rank-order blocks; undefined if identity
};

class RowwiseStrategy final : public ShardedTensorLinearStrategy {
 public:
  RowwiseStrategy(std::vector<int> placements, PlantedFault fault, const std::string& prefix)
      : ShardedTensorLinearStrategy("rowwise", 1, std::move(placements), fault, prefix) {}

  std::unique_ptr<harness::Strategy> withPlantedFault(const std::string& name) const override {
    const auto f = parsePlantedFault(name, supportedFaults());
    if (!f) return nullptr;
    return std::make_unique<RowwiseStrategy>(explicitPlacements(), *f, "");
  }

  nlohmann::json communication() const override {
    return nlohmann::json::array(
        {{{"phase", "forward"}, {"collective", "all_to_all"}, {"operand", "input features"}},
         {{"phase", "forward"}, {"collective", "reduce_scatter"}, {"operand", "partial outputs"}},
         {{"phase", "backward"}, {"collective", "all_gather"}, {"operand", "grad_output"}},
         {{"phase", "backward"}, {"collective", "all_to_all"}, {"operand", "grad_input features"}},
         {{"phase", "backward"}, {"collective", "all_reduce"}, {"operand", "grad_bias"}}});
  }

  std::unique_ptr<harness::RankExecutor> makeExecutor(const harness::CaseSpec& c) const override {
    return std::make_unique<RowwiseExecutor>(*this, c);
  }

  // The three local matmuls over all n x b gathered rows and this rank's chunk.
  std::optional<double> predictFlops(const harness::CaseSpec& c, int rank) const override {
    const auto s = LinearShape::parse(c.shape);
    const int n = static_cast<int>(c.mesh[0]);
    const int64_t b = localRows(s, n);
    const int64_t kc = chunkSizes(s.inFeatures, n)[chunkOfRank(placements(n), rank)];
    return 6.0 * n * b * kc * s.outFeatures;
  }

  harness::CommStats predictComm(const harness::CaseSpec& c, int rank) const override {
    return harness::totalOf(*predictCommByNode(c, rank));
  }
  // One node (singleNode): the forward's collectives, then the backward's (their transposes
  // and the bias gradient's all-reduce).
  std::optional<std::vector<harness::NodeComm>> predictCommByNode(const harness::CaseSpec& c,
                                                                  int rank) const override {
    const auto s = LinearShape::parse(c.shape);
    const int n = static_cast<int>(c.mesh[0]);
    const int64_t e = c10::elementSize(c.dtype);
    const int64_t b = localRows(s, n);
    const int64_t kc = chunkSizes(s.inFeatures, n)[chunkOfRank(placements(n), rank)];
    const auto bytes = [&](int64_t elems) { return n > 1 ? elems * e : 0; };
    harness::CommStats f, p;
    f.add(Collective::kAllToAll, bytes(s.inFeatures * b));
    f.add(Collective::kReduceScatter, bytes(n * b * s.outFeatures));
    p.add(Collective::kAllGather, bytes(n * b * s.outFeatures));
    p.add(Collective::kAllToAll, bytes(n * kc * b));
    if (s.bias) p.add(Collective::kAllReduce, bytes(s.outFeatures));
    return std::vector<harness::NodeComm>{{"linear", "forward", f}, {"linear", "backward", p}};
  }
};

void RowwiseExecutor::prepare(harness::RankContext& ctx, const reference::WorkloadData& data) {
  prepareCommon(ctx, data);
  const int64_t k = LinearShape::parse(case_.shape).inFeatures;
  const auto sizes = chunkSizes(k, n_);
  const auto offsets = chunkOffsets(k, n_);
  // Rank d must receive the features of its chunk place^-1(d); blocks go out in rank order.
  sendRows_.resize(n_);
  bool rankOrder = true;
  for (int dst = 0; dst < n_; ++dst) sendRows_[dst] = sizes[chunkOfRank(place_, dst)];
  for (int i = 0; i < n_; ++i) rankOrder = rankOrder && place_[i] == i;
  if (!rankOrder && strategy_.fault() != PlantedFault::kIgnorePlacements) {
    std::vector<int64_t> order;
    for (int dst = 0; dst < n_; ++dst) {
      const int c = chunkOfRank(place_, dst);
      for (int64_t f = 0; f < sizes[c]; ++f) order.push_back(offsets[c] + f);
    }
    featureOrder_ = at::tensor(order, at::kLong).to(reference::caseDevice());
  }
  predictPeak("rowwise", featureOrder_);
}

void RowwiseExecutor::step(harness::RankContext&) {
  resetStep();
  at::Tensor xt = x_.t();  // [K, b]
  if (featureOrder_.defined()) xt = xt.index_select(0, featureOrder_);
  const int64_t kc = w_.size(1);
  at::Tensor got = harness::allToAllFwdAllToAllBwd(xt.contiguous(), *world_, sendRows_,
                                                   std::vector<int64_t>(n_, kc));  // [n*K_c, b]
  // Block s: rank s's rows restricted to my features, as [b, K_c].
  at::Tensor blocks = got.reshape({n_, kc, b_}).permute({0, 2, 1}).reshape({n_ * b_, kc});
  at::Tensor partial = at::matmul(blocks, w_.t());  // [n*b, N]
  finishStep(harness::reduceScatterFwdAllGatherBwd(partial, *world_,
                                                   std::vector<int64_t>(n_, b_)));  // [b, N]
}

}  // namespace

std::unique_ptr<harness::Strategy> makeShardedTensorRowwise(std::vector<int> placements,
                                                            PlantedFault fault,
                                                            const std::string& idPrefix) {
  return std::make_unique<RowwiseStrategy>(std::move(placements), fault, idPrefix);
}

namespace {
std::vector<std::unique_ptr<harness::Strategy>> registerRowwise() {
  std::vector<std::unique_ptr<harness::Strategy>> out;
  out.push_back(makeShardedTensorRowwise({}));
  out.push_back(makeShardedTensorRowwise({2, 0, 3, 1}));
  return out;
}
}  // namespace
}  // namespace sb::strategies

SB_REGISTER_STRATEGIES(sb::strategies::registerRowwise);
