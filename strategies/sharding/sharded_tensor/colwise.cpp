// ShardedTensor column-wise sharded Linear (PyTorch's ChunkShardingSpec on dim 0 of the weight).
//
// The weight W [N, K] is chunked along its rows, that is along out_features: the columns of
// W^T, hence "column-wise". Chunk i holds ceil(N / n) rows (the last non-empty one fewer: 13
// rows over 4 ranks are 4, 4, 4, 1) and lives on rank placements[i]. Every rank brings its own
// batch x_r [b, K] and wants its own output y_r [b, N].
//
// Forward works as follows:
//   1. all-gather the inputs, so every rank holds X = [x_0; ...; x_{n-1}]  [n*b, K];
//   2. each rank multiplies by its chunk: P = W_c X^T  [N_c, n*b], the columns of every
//      rank's output that its chunk covers;
//   3. all-to-all: block r of P (the N_c columns of rank r's rows) goes to rank r, which
//      receives from every rank s the N_{c(s)} columns that s computed, stacked in rank order;
//   4. if placements are not in rank order, the received column blocks are permuted into
//      chunk order (ShardedTensor's "column rearrange");
//   5. the bias, which every rank holds whole, is added.
// Backward runs the same way back: the all-to-all is reversed (the gradient of each column
// block returns to the rank that computed it), dW_c = dP X needs no communication, dX is a
// sum over the chunks and is reduce-scattered back to each rank's rows (the adjoint of the
// all-gather), and db, summed over each rank's own rows only, is all-reduced (as DDP would for
// a replicated parameter).
//
// Per rank, with element size e: all-gather n*b*K*e, all-to-all n*N_c*b*e forward and N*b*e
// backward, reduce-scatter n*b*K*e, all-reduce N*e.

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

class ColwiseStrategy;

class ColwiseExecutor final : public ShardedTensorExecutorBase {
 public:
  using ShardedTensorExecutorBase::ShardedTensorExecutorBase;
  void prepare(harness::RankContext& ctx, const reference::WorkloadData& data) override;
  void step(harness::RankContext& ctx) override;

 private:
  std::vector<int64_t> recvRows_;  // columns received from each rank
  at::Tensor columnOrder_;         // rank-order blocks -> chunk order; undefined if identity
};

class ColwiseStrategy final : public ShardedTensorLinearStrategy {
 public:
  ColwiseStrategy(std::vector<int> placements, PlantedFault fault, const std::string& prefix)
      : ShardedTensorLinearStrategy("colwise", 0, std::move(placements), fault, prefix) {}

  std::unique_ptr<harness::Strategy> withPlantedFault(const std::string& name) const override {
    const auto f = parsePlantedFault(name, supportedFaults());
    if (!f) return nullptr;
    return std::make_unique<ColwiseStrategy>(explicitPlacements(), *f, "");
  }

  nlohmann::json communication() const override {
    return nlohmann::json::array(
        {{{"phase", "forward"}, {"collective", "all_gather"}, {"operand", "input"}},
         {{"phase", "forward"}, {"collective", "all_to_all"}, {"operand", "output columns"}},
         {{"phase", "backward"}, {"collective", "all_to_all"}, {"operand", "grad_output columns"}},
         {{"phase", "backward"}, {"collective", "reduce_scatter"}, {"operand", "grad_input"}},
         {{"phase", "backward"}, {"collective", "all_reduce"}, {"operand", "grad_bias"}}});
  }

  std::unique_ptr<harness::RankExecutor> makeExecutor(const harness::CaseSpec& c) const override {
    return std::make_unique<ColwiseExecutor>(*this, c);
  }

  // The three local matmuls over all n x b gathered rows and this rank's chunk.
  std::optional<double> predictFlops(const harness::CaseSpec& c, int rank) const override {
    const auto s = LinearShape::parse(c.shape);
    const int n = static_cast<int>(c.mesh[0]);
    const int64_t b = localRows(s, n);
    const int64_t nc = chunkSizes(s.outFeatures, n)[chunkOfRank(placements(n), rank)];
    return 6.0 * n * b * s.inFeatures * nc;
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
    const int64_t nc = chunkSizes(s.outFeatures, n)[chunkOfRank(placements(n), rank)];
    const auto bytes = [&](int64_t elems) { return n > 1 ? elems * e : 0; };
    harness::CommStats f, p;
    f.add(Collective::kAllGather, bytes(n * b * s.inFeatures));
    f.add(Collective::kAllToAll, bytes(n * nc * b));
    p.add(Collective::kAllToAll, bytes(s.outFeatures * b));
    p.add(Collective::kReduceScatter, bytes(n * b * s.inFeatures));
    if (s.bias) p.add(Collective::kAllReduce, bytes(s.outFeatures));
    return std::vector<harness::NodeComm>{{"linear", "forward", f}, {"linear", "backward", p}};
  }
};

void ColwiseExecutor::prepare(harness::RankContext& ctx, const reference::WorkloadData& data) {
  prepareCommon(ctx, data);
  const auto sizes = chunkSizes(LinearShape::parse(case_.shape).outFeatures, n_);
  // Rank s sends the columns of chunk place^-1(s); they arrive stacked in rank order.
  recvRows_.resize(n_);
  bool rankOrder = true;
  for (int src = 0; src < n_; ++src) recvRows_[src] = sizes[chunkOfRank(place_, src)];
  for (int i = 0; i < n_; ++i) rankOrder = rankOrder && place_[i] == i;
  if (!rankOrder && strategy_.fault() != PlantedFault::kIgnorePlacements) {
    // Start of each rank's block in the received tensor; chunk i comes from rank place[i].
    std::vector<int64_t> start(n_, 0);
    for (int src = 1; src < n_; ++src) start[src] = start[src - 1] + recvRows_[src - 1];
    std::vector<int64_t> order;
    for (int i = 0; i < n_; ++i) {
      for (int64_t k = 0; k < sizes[i]; ++k) order.push_back(start[place_[i]] + k);
    }
    columnOrder_ = at::tensor(order, at::kLong).to(reference::caseDevice());
  }
  predictPeak("colwise", columnOrder_);
}

void ColwiseExecutor::step(harness::RankContext&) {
  resetStep();
  const std::vector<int64_t> rows(n_, b_);
  at::Tensor all = harness::allGatherFwdReduceScatterBwd(x_, *world_, rows);  // [n*b, K]
  at::Tensor part = at::matmul(w_, all.t());                                  // [N_c, n*b]
  const int64_t nc = w_.size(0);
  // Block r: my columns of rank r's rows.
  at::Tensor send = part.reshape({nc, n_, b_}).permute({1, 0, 2}).reshape({n_ * nc, b_});
  at::Tensor recv = harness::allToAllFwdAllToAllBwd(send, *world_, std::vector<int64_t>(n_, nc),
                                                    recvRows_);  // [N, b]
  if (columnOrder_.defined()) recv = recv.index_select(0, columnOrder_);
  finishStep(recv.t());
}

}  // namespace

std::unique_ptr<harness::Strategy> makeShardedTensorColwise(std::vector<int> placements,
                                                            PlantedFault fault,
                                                            const std::string& idPrefix) {
  return std::make_unique<ColwiseStrategy>(std::move(placements), fault, idPrefix);
}

namespace {
std::vector<std::unique_ptr<harness::Strategy>> registerColwise() {
  std::vector<std::unique_ptr<harness::Strategy>> out;
  out.push_back(makeShardedTensorColwise({}));
  out.push_back(makeShardedTensorColwise({2, 0, 3, 1}));
  return out;
}
}  // namespace
}  // namespace sb::strategies

SB_REGISTER_STRATEGIES(sb::strategies::registerColwise);
