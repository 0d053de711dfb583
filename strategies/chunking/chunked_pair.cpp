// Chunking an Evoformer-style triangle multiplicative update along either of its two
// chunkable dimensions (reference/evoformer.h):
//
//   chunking/triangle/row  chunks of rows i (dimension 1): a for the chunk's rows, b for all,
//                          x[i0:i1, :] = sum_k a[i, k] b[j, k], gated by zn's rows
//   chunking/triangle/col  chunks of columns j (dimension 2): a for all rows, b for the
//                          chunk's rows j, x[:, j0:j1], gated by zn's columns
//
// Each chunk writes its slice of the update into a preallocated [batch, n, n, c] output; the
// [batch, n, n, hidden] products a, b and x exist for one chunk at a time (but for the one
// computed whole). The pair transition, token-wise, is chunked along the same dimension. Training
// recomputes each chunk in the backward (chunk_runner.h); the gradients of zn, read whole for one
// projection and in chunks for the other, and of every weight add partial sums, compared with the
// split-sum tolerance.
//
// Planted faults: off_by_one, wrong_offset, and per_chunk_reduction, which sums x over the
// chunk's own k only.

#include "harness/error.h"
#include "harness/measure/memory.h"
#include "harness/measure/verify.h"
#include "harness/registry.h"
#include "reference/evoformer.h"
#include "strategies/chunking/chunk_runner.h"
#include "strategies/chunking/estimator.h"

namespace sb::strategies::chunking {
namespace {

using harness::Applicability;
using harness::CaseSpec;
using reference::PairShape;
using reference::PairStack;

class PairStrategy final : public harness::SingleRankStrategy {
 public:
  std::string singleNode(const harness::CaseSpec&) const override { return "triangle"; }
  // Steps: the chunked step N times, the reference's update after each (chunk_runner.h).
  bool trainsSteps() const override { return true; }
  std::vector<std::string> caseParams() const override { return {"chunk"}; }
  // The estimator replays every allocation of the chunked step (estimator/).
  PredictionTolerance predictionTolerance() const override {
    return PredictionTolerance::exactMemory();
  }
  PairStrategy(int dim, Fault fault)
      : SingleRankStrategy(
            std::string("chunking/triangle/") + (dim == 1 ? "row" : "col"),
            std::string("triangle update chunked over ") + (dim == 1 ? "rows" : "columns"),
            harness::Family::kChunking),
        dim_(dim),
        fault_(fault) {}

  int dim() const { return dim_; }
  Fault fault() const { return fault_; }

  std::vector<std::pair<std::string, std::string>> params() const override {
    return {{"region", "triangle"},
            {"dim", dim_ == 1 ? "1 (rows)" : "2 (columns)"},
            {"case params", "chunk"}};
  }

  void checkParams(const CaseSpec& c) const override {
    if (c.workload == "torchscript") return;
    checkChunkParam(c, c.workload == "evoformer_pair" ? PairShape::parse(c.shape).n : -1,
                    std::string("the pair's ") + (dim_ == 1 ? "rows" : "columns"));
  }

  Applicability applies(const CaseSpec& c) const override {
    if (c.workload == "torchscript") return importedModelRefusal();
    if (c.workload != "evoformer_pair") return Applicability::notApplicable("not evoformer_pair");
    if (c.meshSize() != 1) return Applicability::unsupported("chunking runs on one rank");
    if (auto refused = stepsRefusal(c, PairShape::parse(c.shape).training)) return *refused;
    return Applicability::yes();
  }

  int64_t chunkOf(const CaseSpec& c) const {
    const auto s = PairShape::parse(c.shape);
    const int64_t chunk = c.params.contains("chunk") ? c.params["chunk"].get<int64_t>()
                                                     : std::max<int64_t>(1, s.n / 4);
    return std::min(chunk, s.n);
  }

  std::unique_ptr<harness::RankExecutor> makeExecutor(const CaseSpec& c) const override;
  harness::Tolerance tolerance(const std::string& tensor, const CaseSpec& c,
                               const at::Tensor& expected) const override {
    if (auto t = trainingTolerance(tensor, c, expected, [&](const std::string& from) {
          return tolerance(from, c, expected);
        })) {
      return *t;
    }
    const auto base = harness::Tolerance::defaultFor(c.dtype);
    if (tensor.rfind("grad", 0) != 0) return base;
    const auto s = PairShape::parse(c.shape);
    const int64_t parts = std::max<int64_t>(2, (s.n + chunkOf(c) - 1) / chunkOf(c));
    return harness::splitReductionTolerance(base, c.dtype, s.batch * s.n * s.n, parts, expected);
  }
  std::vector<std::string> plantableFaults() const override {
    return {faultName(Fault::kOffByOne), faultName(Fault::kWrongOffset),
            faultName(Fault::kPerChunkReduction)};
  }
  std::unique_ptr<harness::Strategy> withPlantedFault(const std::string& name) const override {
    const auto f = parseFault(name, plantableFaults());
    return f ? std::make_unique<PairStrategy>(dim_, *f) : nullptr;
  }

 private:
  int dim_;
  Fault fault_;
};

class PairExecutor final : public ChunkedStepExecutor<PairStack> {
 public:
  PairExecutor(const PairStrategy& s, const CaseSpec& c)
      : ChunkedStepExecutor(PairShape::parse(c.shape).training, c.training),
        strategy_(s),
        case_(c),
        shape_(PairShape::parse(c.shape)) {}

  void prepare(harness::RankContext&, const reference::WorkloadData&) override {
    model_ = std::make_unique<PairStack>(shape_, case_.dtype, case_.seed);
    estimate_ = estimatePairActivationPeak(shape_, strategy_.dim(), strategy_.chunkOf(case_),
                                           c10::elementSize(case_.dtype));
    const bool perChunk = strategy_.fault() == Fault::kPerChunkReduction;
    const PairStack& m = *model_;
    regions_.resize(model_->layers());
    transitions_.resize(model_->layers());
    for (int l = 0; l < model_->layers(); ++l) {
      // The transition is token-wise: chunked along the same dimension, it needs nothing else.
      RegionContext& t = transitions_[l];
      t.chunking.seq = shape_.n;
      t.chunking.chunk = strategy_.chunkOf(case_);
      t.chunking.dim = strategy_.dim();
      t.outShape = {shape_.batch, shape_.n, shape_.n, shape_.c};
      const int64_t dim = strategy_.dim();
      t.fn = [&m, l, dim](const std::vector<at::Tensor>& in, int64_t s, int64_t e) {
        return m.transition(l, in[0].narrow(dim, s, e - s));
      };
      RegionContext& r = regions_[l];
      r.chunking.seq = shape_.n;
      r.chunking.chunk = strategy_.chunkOf(case_);
      r.chunking.dim = strategy_.dim();
      r.chunking.fault = strategy_.fault();
      r.outShape = {shape_.batch, shape_.n, shape_.n, shape_.c};
      if (strategy_.dim() == 1) {  // inputs: zn, b (whole)
        r.fn = [&m, l, perChunk](const std::vector<at::Tensor>& in, int64_t s, int64_t e) {
          const at::Tensor zr = in[0].narrow(1, s, e - s);
          at::Tensor a = m.projA(l, zr), b = in[1];
          if (perChunk) {
            a = a.narrow(2, s, e - s);
            b = b.narrow(2, s, e - s);
          }
          return m.triangleOut(l, a, b, zr);
        };
      } else {  // inputs: zn, a (whole)
        r.fn = [&m, l, perChunk](const std::vector<at::Tensor>& in, int64_t s, int64_t e) {
          at::Tensor b = m.projB(l, in[0].narrow(1, s, e - s)), a = in[1];
          if (perChunk) {
            a = a.narrow(2, s, e - s);
            b = b.narrow(2, s, e - s);
          }
          return m.triangleOut(l, a, b, in[0].narrow(2, s, e - s));
        };
      }
    }
  }

  std::vector<std::pair<std::string, std::string>> recordParams() const override {
    std::vector<std::pair<std::string, std::string>> out = {
        {"region", "triangle"},
        {"dim", std::to_string(strategy_.dim())},
        {"chunk", std::to_string(regions_.front().chunking.chunk)},
        {"chunks", std::to_string(regions_.front().chunking.chunks())}};
    const auto peak = peakParams();
    out.insert(out.end(), peak.begin(), peak.end());
    return out;
  }

 protected:
  at::Tensor forward(const at::Tensor& input) override {
    at::Tensor z = input;
    for (int l = 0; l < model_->layers(); ++l) {
      const at::Tensor zn = model_->normIn(l, z);
      const at::Tensor whole = strategy_.dim() == 1 ? model_->projB(l, zn) : model_->projA(l, zn);
      const at::Tensor none = at::empty({0}, zn.options());
      const at::Tensor u =
          z + ChunkedRegion::apply(zn, whole, none, reinterpret_cast<int64_t>(&regions_[l]));
      z = ChunkedRegion::apply(u, none, none, reinterpret_cast<int64_t>(&transitions_[l]));
    }
    return z;
  }

 private:
  const PairStrategy& strategy_;
  CaseSpec case_;
  PairShape shape_;
  // One a layer, as each layer's backward recomputes that layer's chunks.
  std::vector<RegionContext> regions_, transitions_;
};

std::unique_ptr<harness::RankExecutor> PairStrategy::makeExecutor(const CaseSpec& c) const {
  return std::make_unique<PairExecutor>(*this, c);
}

std::vector<std::unique_ptr<harness::Strategy>> registerPair() {
  std::vector<std::unique_ptr<harness::Strategy>> out;
  out.push_back(std::make_unique<PairStrategy>(1, Fault::kNone));
  out.push_back(std::make_unique<PairStrategy>(2, Fault::kNone));
  return out;
}

}  // namespace
}  // namespace sb::strategies::chunking

SB_REGISTER_STRATEGIES(sb::strategies::chunking::registerPair);
