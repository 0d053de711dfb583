// PyTorch ShardedTensor's reshard and reshuffle (seed 004): a tensor chunked along dimension a
// with chunk i on rank P[i] (ChunkShardingSpec(dim=a, placements=P)) becomes one chunked along
// dimension b with chunk j on rank Q[j], in one all-to-all over the group.
//
// reshard_local_shard (a != b): every rank holds the whole of dimension b. It splits its chunk
// along b by the sizes of build_reshard_metadata, indexed by destination rank (so when Q is not
// in rank order the pieces are rearranged first, as the seed's index_select does), sends piece r
// to rank r, and concatenates what arrives along a in the order of the source placements.
// reshuffle_local_shard (a == b, P != Q): each rank sends its whole chunk i to rank Q[i] and
// receives chunk j = Q^-1(me) from rank P[j]. (The seed receives from Q[i], the rank it sends
// to, which is only right when the permutation is its own inverse: for P in rank order and
// Q = [2, 0, 3, 1], rank 0 waits for rank 2, which sends to rank 3. Here the receive follows
// the data.)
// Both are the same exchange of boxes (harness/redistribute_exec.h: exchangeBoxes): send each
// rank the part of my chunk that lies in its new chunk. The backward is the reverse exchange.
// Each rank sends its chunk once: all-to-all bytes = its chunk, forward and backward.

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <numeric>
#include <optional>

#include "harness/comm/comm_site.h"
#include "harness/registry.h"
#include "reference/autograd_engine.h"
#include "strategies/sharding/layout/redistribute_exec.h"
#include "strategies/sharding/layout/spec_boxes.h"
#include "strategies/sharding/linear/linear_strategies.h"

namespace sb::strategies {
namespace {

using harness::Box;
using harness::CaseSpec;
using harness::Collective;
using harness::CommStats;

std::string joined(const std::vector<int>& v) {
  std::string s;
  for (int x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
  return s;
}

std::vector<int> rankOrder(int n) {
  std::vector<int> p(n);
  std::iota(p.begin(), p.end(), 0);
  return p;
}

// The exchange as an autograd function: forward sends `mine` into the new boxes, backward the
// gradient back.
struct Exchange {
  std::vector<Box> oldBoxes, newBoxes;  // per group rank
  harness::Communicator* comm = nullptr;
  harness::RedistFault fault = harness::RedistFault::kNone;
};

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct ExchangeFn : torch::autograd::Function<ExchangeFn> {
  static at::Tensor forward(AutogradContext* actx, const at::Tensor& x, int64_t ex) {
    actx->saved_data["ex"] = ex;
    harness::saveCommNode(actx);
    const auto& e = *reinterpret_cast<const Exchange*>(static_cast<intptr_t>(ex));
    const int me = e.comm->rank();
    return harness::exchangeBoxes(x, e.oldBoxes[me], e.newBoxes, e.oldBoxes, e.newBoxes[me],
                                  *e.comm, e.fault);
  }
  static variable_list backward(AutogradContext* actx, variable_list grads) {
    const auto& e =
        *reinterpret_cast<const Exchange*>(static_cast<intptr_t>(actx->saved_data["ex"].toInt()));
    const int me = e.comm->rank();
    const auto site = harness::backwardCommSite(actx);
    return {harness::exchangeBoxes(grads[0].contiguous(), e.newBoxes[me], e.oldBoxes, e.newBoxes,
                                   e.oldBoxes[me], *e.comm),
            at::Tensor()};
  }
};

class ReshardStrategy;

class ReshardExecutor final : public harness::RankExecutor {
 public:
  ReshardExecutor(const ReshardStrategy& s, const CaseSpec& c) : strategy_(s), case_(c) {}
  void prepare(harness::RankContext& ctx, const reference::WorkloadData& data) override;
  void step(harness::RankContext& ctx) override;
  std::map<std::string, at::Tensor> results() const override { return results_; }
  std::optional<int64_t> predictedPeakBytes() const override { return predictedPeak_; }

 private:
  const ReshardStrategy& strategy_;
  const CaseSpec& case_;
  Exchange exchange_;
  at::Tensor x_, gradOut_;
  std::map<std::string, at::Tensor> results_;
  int64_t predictedPeak_ = 0;
};

class ReshardStrategy final : public harness::Strategy {
 public:
  std::string singleNode(const harness::CaseSpec&) const override { return "reshard"; }
  ReshardStrategy(int fromDim, int toDim, std::vector<int> from, std::vector<int> to,
                  PlantedFault fault = PlantedFault::kNone)
      : Strategy("sharding/sharded_tensor/" +
                     std::string(fromDim == toDim ? "reshuffle" : "reshard") +
                     "/dim=" + std::to_string(fromDim) + "->" + std::to_string(toDim) +
                     "/placements=" + joined(from) + "->" + joined(to),
                 "ShardedTensor " + std::string(fromDim == toDim ? "reshuffle" : "reshard") +
                     " ChunkShardingSpec(dim=" + std::to_string(fromDim) + ", [" + joined(from) +
                     "]) -> (dim=" + std::to_string(toDim) + ", [" + joined(to) + "])",
                 harness::Family::kSharding),
        fromDim_(fromDim),
        toDim_(toDim),
        from_(std::move(from)),
        to_(std::move(to)),
        fault_(fault) {}

  int size() const { return static_cast<int>(from_.size()); }

  std::vector<std::pair<std::string, std::string>> params() const override {
    return {{"from_dim", std::to_string(fromDim_)},
            {"to_dim", std::to_string(toDim_)},
            {"from_placements", joined(from_)},
            {"to_placements", joined(to_)},
            {"meshes", "1-D of " + std::to_string(size())}};
  }

  nlohmann::json describe() const override {
    return {{"from", {{"dim", fromDim_}, {"placements", from_}}},
            {"to", {{"dim", toDim_}, {"placements", to_}}},
            {"communication",
             {{{"phase", "forward"}, {"collective", "all_to_all"}, {"operand", "input"}},
              {{"phase", "backward"}, {"collective", "all_to_all"}, {"operand", "grad_output"}}}}};
  }

  harness::Applicability applies(const CaseSpec& c) const override {
    using harness::Applicability;
    if (c.workload != "tensor") return Applicability::notApplicable("not a tensor workload");
    if (c.mesh.size() != 1 || c.mesh[0] != size()) {
      return Applicability::notApplicable("placements are for a 1-D mesh of " +
                                          std::to_string(size()));
    }
    const auto dims = reference::TensorShape::parse(c.shape).dims;
    if (std::max(fromDim_, toDim_) >= static_cast<int>(dims.size())) {
      return Applicability::notApplicable("the tensor has no dimension " +
                                          std::to_string(std::max(fromDim_, toDim_)));
    }
    return Applicability::yes();
  }

  std::unique_ptr<harness::RankExecutor> makeExecutor(const CaseSpec& c) const override {
    return std::make_unique<ReshardExecutor>(*this, c);
  }

  // The box of chunk placements^-1(rank) along `dim`.
  static Box boxOf(const std::vector<int64_t>& shape, int dim, const std::vector<int>& placements,
                   int rank) {
    return harness::chunkBox(shape, dim, static_cast<int64_t>(placements.size()),
                             harness::chunkOfRank(placements, rank));
  }
  std::vector<Box> oldBoxes(const std::vector<int64_t>& shape) const {
    std::vector<Box> b;
    for (int r = 0; r < size(); ++r) b.push_back(boxOf(shape, fromDim_, from_, r));
    return b;
  }
  // The new chunks' placements, as the executor and the declared layout both place them: the
  // planted kConsistentWrongLayout rotates them (chunk i on the rank of chunk i + 1), a wrong
  // layout consistent with itself that only the check against the name's spec catches.
  std::vector<int> targetPlacements() const {
    std::vector<int> p = to_;
    if (fault_ == PlantedFault::kConsistentWrongLayout)
      std::rotate(p.begin(), p.begin() + 1, p.end());
    return p;
  }
  // The planted ignore_placements sends as if the new chunks were in rank order.
  std::vector<Box> newBoxes(const std::vector<int64_t>& shape) const {
    const bool ignore = fault_ == PlantedFault::kIgnorePlacements;
    std::vector<Box> b;
    for (int r = 0; r < size(); ++r) {
      b.push_back(boxOf(shape, toDim_, ignore ? rankOrder(size()) : targetPlacements(), r));
    }
    return b;
  }

  Box resultBox(const std::string& tensor, const CaseSpec& c, int rank) const override {
    const auto shape = reference::TensorShape::parse(c.shape).dims;
    if (tensor == "output") return boxOf(shape, toDim_, targetPlacements(), rank);
    if (tensor == "grad_input") return boxOf(shape, fromDim_, from_, rank);
    TORCH_INTERNAL_ASSERT(false, "no layout for tensor ", tensor);
  }

  // The boxes of the two ChunkShardingSpecs in the strategy's name as displayed
  // ("... ChunkShardingSpec(dim=0, [0,1,2,3]) -> (dim=1, [2,0,3,1])"), never from its members:
  // the output has the target spec's; the input's gradient, the input's, the source spec's.
  std::optional<SpecifiedBox> specifiedBox(const std::string& tensor, const CaseSpec&, int rank,
                                           at::IntArrayRef fullShape) const override {
    if (tensor != "output" && tensor != "grad_input") return std::nullopt;
    const std::string& name = displayName();
    const size_t source = name.find("ChunkShardingSpec("), arrow = name.find(" -> ");
    TORCH_CHECK(source != std::string::npos && arrow != std::string::npos && source < arrow, "`",
                name, "` does not name two ChunkShardingSpecs");
    const std::string text =
        tensor == "output" ? name.substr(arrow + 4) : name.substr(source, arrow - source);
    const auto spec = harness::parseChunkShardingSpec(text);
    TORCH_CHECK(spec.has_value(), "`", text, "` in `", name, "` is not a ChunkShardingSpec");
    return SpecifiedBox{harness::chunkSpecBox(spec->dim, spec->placements, fullShape, rank),
                        "ShardedTensor `" + text + "` (" + tensor + ")"};
  }

  // Memory judged exactly: the exchange's model (prepare) predicts the tracker's peak to the
  // byte (ShardedTensorReshard.UnevenReshardsAndReshufflesPassWithTheirMemoryPredicted).
  PredictionTolerance predictionTolerance() const override {
    return PredictionTolerance::exactMemory();
  }

  CommStats predictComm(const CaseSpec& c, int rank) const override {
    const auto shape = reference::TensorShape::parse(c.shape).dims;
    const int64_t es = c10::elementSize(c.dtype);
    CommStats s;
    s.add(Collective::kAllToAll, boxOf(shape, fromDim_, from_, rank).numel() * es);
    s.add(Collective::kAllToAll, boxOf(shape, toDim_, targetPlacements(), rank).numel() * es);
    return s;
  }
  // The exchange forward, sending this rank's old box; backward, sending its new one back.
  std::optional<std::vector<harness::NodeComm>> predictCommByNode(const CaseSpec& c,
                                                                  int rank) const override {
    const auto shape = reference::TensorShape::parse(c.shape).dims;
    const int64_t es = c10::elementSize(c.dtype);
    harness::NodeComm f{"reshard", "forward", {}}, b{"reshard", "backward", {}};
    f.comm.add(Collective::kAllToAll, boxOf(shape, fromDim_, from_, rank).numel() * es);
    b.comm.add(Collective::kAllToAll, boxOf(shape, toDim_, targetPlacements(), rank).numel() * es);
    return std::vector<harness::NodeComm>{f, b};
  }
  std::optional<double> predictFlops(const CaseSpec&, int) const override { return 0.0; }
  // Each exchange copies every block out of its input and every received block into place.
  std::optional<harness::LocalWork> predictLocalWork(const CaseSpec& c, int rank) const override {
    const auto shape = reference::TensorShape::parse(c.shape).dims;
    const int64_t es = c10::elementSize(c.dtype);
    const int64_t in = boxOf(shape, fromDim_, from_, rank).numel() * es;
    const int64_t out = boxOf(shape, toDim_, targetPlacements(), rank).numel() * es;
    return harness::LocalWork{4 * size(), 2 * (in + out)};
  }

  // Only new chunks placed out of rank order can be mistaken for rank order; any can be rotated.
  std::vector<PlantedFault> supportedFaults() const {
    if (to_ == rankOrder(size())) return {PlantedFault::kConsistentWrongLayout};
    return {PlantedFault::kIgnorePlacements, PlantedFault::kConsistentWrongLayout};
  }
  std::vector<std::string> plantableFaults() const override {
    return plantedFaultNames(supportedFaults());
  }
  std::unique_ptr<Strategy> withPlantedFault(const std::string& name) const override {
    const auto f = parsePlantedFault(name, supportedFaults());
    if (!f) return nullptr;
    return std::make_unique<ReshardStrategy>(fromDim_, toDim_, from_, to_, *f);
  }

 private:
  int fromDim_, toDim_;
  std::vector<int> from_, to_;
  PlantedFault fault_;
};

void ReshardExecutor::prepare(harness::RankContext& ctx, const reference::WorkloadData& data) {
  const auto shape = reference::TensorShape::parse(case_.shape).dims;
  exchange_.oldBoxes = strategy_.oldBoxes(shape);
  exchange_.newBoxes = strategy_.newBoxes(shape);
  exchange_.comm = &ctx.world();
  const int me = exchange_.comm->rank();
  // The executor's own idea of where the new chunk is (the harness checks it against the
  // strategy's declared layout, which a planted fault does not change).
  const Box& outBox = exchange_.newBoxes[me];
  x_ = harness::sliceBox(data.inputs.at("input"), exchange_.oldBoxes[me])
           .clone()
           .set_requires_grad(true);
  gradOut_ = harness::sliceBox(data.inputs.at("grad_output"), outBox).clone();
  // Held: the chunk and its gradient's chunk, then the previous step's results; each exchange
  // stages a send buffer of its input and receives its output, then assembles the output.
  const int64_t es = c10::elementSize(case_.dtype);
  const int64_t in = x_.numel() * es, out = gradOut_.numel() * es, base = in + out;
  const auto exchangePeak = [](int64_t i, int64_t o) { return std::max(i + o, 2 * o); };
  predictedPeak_ =
      std::max({base + out + in, base + exchangePeak(in, out), base + out + exchangePeak(out, in)});
}

void ReshardExecutor::step(harness::RankContext&) {
  results_.clear();
  x_.mutable_grad().reset();
  // One node: the exchange forward, its transpose backward (comm_site.h).
  const harness::CommSiteScope site("reshard");
  at::Tensor y =
      ExchangeFn::apply(x_, static_cast<int64_t>(reinterpret_cast<intptr_t>(&exchange_)));
  reference::backward({y}, {gradOut_});
  results_["output"] = y.detach();
  results_["grad_input"] = x_.grad();
}

std::vector<std::unique_ptr<harness::Strategy>> registerReshards() {
  const std::vector<int> rank = {0, 1, 2, 3}, p1 = {2, 0, 3, 1}, p2 = {1, 3, 0, 2};
  const std::vector<std::pair<std::vector<int>, std::vector<int>>> pairs = {
      {rank, rank}, {rank, p1}, {p1, rank}, {p1, p2}};
  std::vector<std::unique_ptr<harness::Strategy>> out;
  for (int a : {0, 1}) {
    for (int b : {0, 1}) {
      for (const auto& [from, to] : pairs) {
        if (a == b && from == to) continue;  // nothing moves
        out.push_back(std::make_unique<ReshardStrategy>(a, b, from, to));
      }
    }
  }
  return out;
}

}  // namespace
}  // namespace sb::strategies

SB_REGISTER_STRATEGIES(sb::strategies::registerReshards);
