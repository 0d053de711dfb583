// Activation chunking of a transformer's regions along the sequence.
//
// A region of every block runs chunk by chunk over the tokens (dimension 1 of [batch, seq,
// d_model]), `params.chunk` tokens at a time (the last chunk may be shorter), each chunk's
// result written into a preallocated output at its offset, so that the region's
// intermediates exist for one chunk at a time:
//
//   chunking/attention/seq  the queries are chunked; keys and values are computed for the
//                           whole sequence once, so a chunk's scores are [chunk, keys]
//                           instead of [seq, seq]
//   chunking/ffn/seq        LN2 and the feed-forward block on chunks of tokens: the 4*d_model
//                           hidden activation exists for one chunk at a time
//   chunking/ln_residual/seq  the token-wise layer norms and residual adds (LN1, x + a, LN2,
//                           r + f), each chunk by chunk into its own preallocated output;
//                           attention and feed-forward whole. Same arithmetic: bitwise
//   chunking/block/seq      the whole block per chunk of queries: LN1 of the chunk's rows,
//                           attention to the whole sequence's keys and values, residual, LN2,
//                           feed-forward, residual
//
// Training: the chunked region is one custom autograd function. Its forward runs without a
// tape, its backward recomputes each chunk from the region's inputs with a tape and
// backpropagates that chunk's gradient, so the backward's peak is one chunk's tape too.
// Gradients that sum over tokens (the weights', and the keys' and values' in attention) are
// then added chunk by chunk, in another order than the unchunked backward: they are compared
// with the tolerance of a sum split in as many parts as there are chunks.
//
// Planted faults (tests only): "off_by_one" leaves the last row of every chunk uncomputed,
// "wrong_offset" writes each chunk one row further than its place, "per_chunk_reduction"
// softmaxes a chunk's queries over the chunk's own keys only.

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <array>
#include <cmath>
#include <functional>

#include "harness/capture_tape.h"
#include "harness/measure/memory.h"
#include "harness/measure/verify.h"
#include "harness/registry.h"
#include "reference/json_strict.h"
#include "reference/transformer.h"
#include "strategies/chunking/chunk_runner.h"
#include "strategies/chunking/estimator.h"

namespace sb::strategies::chunking {
namespace {

using harness::Applicability;
using harness::CaseSpec;
using reference::Transformer;
using reference::TransformerShape;

enum class Region { kAttention, kFfn, kBlock, kLnResidual, kAuto };

const char* regionName(Region r) {
  switch (r) {
    case Region::kAttention:
      return "attention";
    case Region::kFfn:
      return "ffn";
    case Region::kBlock:
      return "block";
    case Region::kLnResidual:
      return "ln_residual";
    case Region::kAuto:
      return "auto";
  }
  return "?";
}

Region regionOf(const std::string& name) {
  if (name == "ffn") return Region::kFfn;
  if (name == "block") return Region::kBlock;
  if (name == "ln_residual") return Region::kLnResidual;
  return Region::kAttention;  // "attention", and "none": attention in one chunk
}

// What a failure is located by (harness/run/divergence.h): each chunked region's output of
// each layer, chunk by chunk ("h0.attention tokens [8:16)"), and each layer's output.
std::vector<std::string> regionTaps(Region r) {
  switch (r) {
    case Region::kLnResidual:
      return {"ln_1", "residual_1", "ln_2", "residual_2"};
    case Region::kAuto:
      return {};
    default:
      return {regionName(r)};
  }
}
std::string chunkName(int layer, const std::string& tap, int64_t s, int64_t e) {
  return "h" + std::to_string(layer) + "." + tap + " tokens [" + std::to_string(s) + ":" +
         std::to_string(e) + ")";
}

class ChunkedStrategy final : public harness::SingleRankStrategy {
 public:
  // Steps: the chunked step N times, the reference's update after each (chunk_runner.h).
  bool trainsSteps() const override { return true; }
  std::vector<std::string> caseParams() const override {
    if (region_ != Region::kAuto) return {"chunk"};
    return {"chunk", "max_memory", "max_memory_fraction"};
  }
  // The estimator replays every allocation of the chunked step (estimator/).
  PredictionTolerance predictionTolerance() const override {
    return PredictionTolerance::exactMemory();
  }
  ChunkedStrategy(Region region, Fault fault)
      : SingleRankStrategy(
            region == Region::kAuto ? std::string("chunking/auto")
                                    : std::string("chunking/") + regionName(region) + "/seq",
            region == Region::kAuto
                ? std::string("chunk plan searched under params.max_memory")
                : std::string("chunked ") + regionName(region) + " over the sequence",
            harness::Family::kChunking),
        region_(region),
        fault_(fault) {}

  Region region() const { return region_; }
  Fault fault() const { return fault_; }

  std::vector<std::pair<std::string, std::string>> params() const override {
    return {{"region", regionName(region_)}, {"dim", "seq"}, {"case params", "chunk (tokens)"}};
  }

  void checkParams(const CaseSpec& c) const override {
    if (c.workload == "torchscript") return;
    checkSequenceChunkParam(c);
    if (region_ != Region::kAuto) return;
    if (c.params.contains("max_memory") && c.params.contains("max_memory_fraction")) {
      throw harness::InputError(
          "chunking/auto takes params.max_memory (bytes) or params.max_memory_fraction (of the "
          "unchunked estimate), not both");
    }
    if (c.params.contains("max_memory") &&
        !reference::jsonWholeNumber(c.params["max_memory"], 1, int64_t{1} << 62)) {
      throw harness::InputError(
          "params.max_memory must be a whole number of bytes from 1 to "
          "2^62, got " +
          c.params["max_memory"].dump());
    }
    if (c.params.contains("max_memory_fraction")) {
      const auto& v = c.params["max_memory_fraction"];
      if (!v.is_number() || !(v.get<double>() > 0) || !(v.get<double>() <= 1e6)) {
        throw harness::InputError(
            "params.max_memory_fraction must be a positive number up to "
            "1e6, got " +
            v.dump());
      }
    }
  }

  Applicability applies(const CaseSpec& c) const override {
    if (auto refused = transformerCaseRefusal(c)) return *refused;
    if (region_ == Region::kAuto && !c.params.contains("max_memory") &&
        !c.params.contains("max_memory_fraction")) {
      return Applicability::unsupported(
          "chunking/auto needs params.max_memory (bytes) or params.max_memory_fraction (of "
          "the unchunked estimate), one of them");
    }
    return Applicability::yes();
  }

  int64_t chunkOf(const CaseSpec& c) const { return sequenceChunkOf(c); }

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
    // Gradients summed over tokens are added chunk by chunk.
    const auto s = TransformerShape::parse(c.shape, c.workload);
    int64_t parts = (s.seq + chunkOf(c) - 1) / chunkOf(c);
    // The block region reads LN1 twice, for its chunk's queries inside and for every token's
    // keys and values outside, so LN1's gradients add two partial sums even in one chunk.
    if (region_ == Region::kBlock) parts = std::max<int64_t>(parts, 2);
    return harness::splitReductionTolerance(base, c.dtype, s.batch * s.seq, parts, expected);
  }

  // The unchunked model's values of the same taps, each chunk's entry the whole value (the
  // comparison takes the chunk's rows).
  std::vector<harness::TraceValue> referenceTrace(const CaseSpec& c,
                                                  const reference::WorkloadData&) const override {
    const TransformerShape s = TransformerShape::parse(c.shape, c.workload);
    const Transformer m(s, c.dtype, c.seed);
    const int64_t chunk = chunkOf(c);
    std::vector<harness::TraceValue> out;
    at::NoGradGuard noGrad;
    at::Tensor x = m.input();
    for (int l = 0; l < m.layers(); ++l) {
      const at::Tensor h = m.ln1(l, x);
      const auto [k, v] = m.keysValues(l, h);
      const at::Tensor a = m.attention(l, h, 0, k, v, s.seq);
      const at::Tensor r = x + a;
      const at::Tensor h2 = m.ln2(l, r);
      const at::Tensor f = m.ffn(l, h2);
      const at::Tensor y = r + f;
      std::map<std::string, at::Tensor> values = {{"attention", a}, {"ffn", f},        {"block", y},
                                                  {"ln_1", h},      {"residual_1", r}, {"ln_2", h2},
                                                  {"residual_2", y}};
      for (const auto& tap : regionTaps(region_)) {
        for (int64_t b = 0; b < s.seq; b += chunk) {
          const std::string name = chunkName(l, tap, b, std::min(s.seq, b + chunk));
          out.push_back({"h" + std::to_string(l) + "." + tap, "forward", name, values.at(tap), {}});
        }
      }
      out.push_back({"h" + std::to_string(l), "forward", "h" + std::to_string(l) + " out", y, {}});
      x = y;
    }
    return out;
  }

  std::vector<std::string> plantableFaults() const override {
    if (region_ == Region::kAuto) return {};
    std::vector<std::string> f = {faultName(Fault::kOffByOne), faultName(Fault::kWrongOffset)};
    // Only attention reduces over the sequence.
    if (region_ == Region::kAttention || region_ == Region::kBlock) {
      f.push_back(faultName(Fault::kPerChunkReduction));
    }
    return f;
  }
  std::unique_ptr<harness::Strategy> withPlantedFault(const std::string& name) const override {
    const auto f = parseFault(name, plantableFaults());
    return f ? std::make_unique<ChunkedStrategy>(region_, *f) : nullptr;
  }

 private:
  Region region_;
  Fault fault_;
};

class ChunkedExecutor final : public ChunkedStepExecutor<Transformer> {
 public:
  ChunkedExecutor(const ChunkedStrategy& s, const CaseSpec& c)
      : ChunkedStepExecutor(TransformerShape::parse(c.shape, c.workload).training, c.training),
        strategy_(s),
        case_(c),
        shape_(TransformerShape::parse(c.shape, c.workload)) {}

  void prepare(harness::RankContext&, const reference::WorkloadData&) override {
    model_ = std::make_unique<Transformer>(shape_, case_.dtype, case_.seed);
    chunking_.seq = shape_.seq;
    region_ = strategy_.region();
    chunking_.chunk = strategy_.chunkOf(case_);
    if (region_ == Region::kAuto) plan();
    // The plan is fixed from here: its estimate too.
    estimate_ = estimateActivationPeak(shape_, {regionName(region_), chunking_.chunk},
                                       c10::elementSize(case_.dtype));
    chunking_.fault = strategy_.fault();
    const int64_t B = shape_.batch, T = shape_.seq, D = shape_.dModel;
    const bool perChunk = strategy_.fault() == Fault::kPerChunkReduction;
    regions_.resize(model_->layers());
    tokenwise_.resize(model_->layers());
    for (int l = 0; l < model_->layers(); ++l) {
      // ln_residual: LN1, the attention's residual, LN2 and the feed-forward's residual, each
      // token-wise, chunk by chunk (inputs x, or the two summands).
      auto& t = tokenwise_[l];
      const Transformer& tm = *model_;
      const auto rows = [](const at::Tensor& v, int64_t s, int64_t e) {
        return v.narrow(1, s, e - s);
      };
      for (auto& c : t) {
        c.chunking = chunking_;
        c.outShape = {B, T, D};
      }
      t[0].fn = [&tm, l, rows](const std::vector<at::Tensor>& in, int64_t s, int64_t e) {
        return tm.ln1(l, rows(in[0], s, e));
      };
      t[1].fn = [rows](const std::vector<at::Tensor>& in, int64_t s, int64_t e) {
        return rows(in[0], s, e) + rows(in[1], s, e);
      };
      t[2].fn = [&tm, l, rows](const std::vector<at::Tensor>& in, int64_t s, int64_t e) {
        return tm.ln2(l, rows(in[0], s, e));
      };
      t[3].fn = t[1].fn;
      auto& r = regions_[l];
      r.chunking = chunking_;
      r.outShape = {B, T, D};
      const Transformer& m = *model_;
      switch (region_) {
        case Region::kAuto:
          TORCH_INTERNAL_ASSERT(false, "the plan names a region");
        case Region::kLnResidual:
          break;                  // tokenwise_ above
        case Region::kAttention:  // inputs: ln1 output h, keys, values
          r.fn = [&m, l, perChunk](const std::vector<at::Tensor>& in, int64_t s, int64_t e) {
            if (perChunk) {
              return m.attention(l, in[0].narrow(1, s, e - s), 0, in[1].narrow(2, s, e - s),
                                 in[2].narrow(2, s, e - s), e - s);
            }
            return m.attention(l, in[0].narrow(1, s, e - s), s, in[1], in[2], m.keyEnd(e));
          };
          break;
        case Region::kFfn:  // input: the residual stream after attention
          r.fn = [&m, l](const std::vector<at::Tensor>& in, int64_t s, int64_t e) {
            return m.ffn(l, m.ln2(l, in[0].narrow(1, s, e - s)));
          };
          break;
        case Region::kBlock:  // inputs: the block's input x, keys, values
          r.fn = [&m, l, perChunk](const std::vector<at::Tensor>& in, int64_t s, int64_t e) {
            const at::Tensor xs = in[0].narrow(1, s, e - s);
            const at::Tensor a = perChunk
                                     ? m.attention(l, m.ln1(l, xs), 0, in[1].narrow(2, s, e - s),
                                                   in[2].narrow(2, s, e - s), e - s)
                                     : m.attention(l, m.ln1(l, xs), s, in[1], in[2], m.keyEnd(e));
            const at::Tensor rs = xs + a;
            return rs + m.ffn(l, m.ln2(l, rs));
          };
          break;
      }
    }
  }

  // Locating a failure: the next step's first forward keeps each chunked region's output
  // chunk by chunk and each layer's output (the names regionTaps and chunkName give).
  bool capturesValues() const override { return strategy_.region() != Region::kAuto; }
  void setCapture(bool on) override {
    captureOn_ = on;
    if (on) captured_.clear();
    if (!on) tape_.reset();
  }
  std::vector<harness::TraceValue> captured() const override { return captured_; }

  std::vector<std::pair<std::string, std::string>> recordParams() const override {
    std::vector<std::pair<std::string, std::string>> out;
    if (strategy_.region() == Region::kAuto) {
      out = {{"max_memory", std::to_string(maxMemory_)},
             {"plan", search_.plan ? search_.plan->region : "none"},
             {"unchunked_estimate_bytes", std::to_string(search_.unchunked)},
             {"plans_tried", std::to_string(search_.plansTried)}};
    }
    std::vector<std::pair<std::string, std::string>> own = {
        {"region", regionName(region_)},
        {"chunk", std::to_string(chunking_.chunk)},
        {"chunks", std::to_string(chunking_.chunks())}};
    out.insert(out.end(), own.begin(), own.end());
    const auto peak = peakParams();
    out.insert(out.end(), peak.begin(), peak.end());
    return out;
  }

 protected:
  at::Tensor forward(const at::Tensor& input) override {
    if (captureOn_ && !tape_ && captured_.empty()) tape_ = std::make_unique<harness::CaptureTape>();
    at::Tensor x = input;
    for (int l = 0; l < model_->layers(); ++l) {
      x = layer(l, x);
      if (tape_) keep("h" + std::to_string(l), "h" + std::to_string(l) + " out", x, 0, shape_.seq);
    }
    if (tape_) {  // one forward a capture: a training case's first
      captured_ = tape_->take();
      tape_.reset();
    }
    return x;
  }

 private:
  at::Tensor region(int l, const at::Tensor& a, const at::Tensor& b, const at::Tensor& c) {
    return tapChunks(l, regionName(region_),
                     ChunkedRegion::apply(a, b, c, reinterpret_cast<int64_t>(&regions_[l])));
  }
  // Capture: a region's output, chunk by chunk, as the chunks wrote it.
  at::Tensor tapChunks(int l, const std::string& tap, const at::Tensor& out) {
    if (!tape_) return out;
    for (int64_t s = 0; s < shape_.seq; s += chunking_.chunk) {
      const int64_t e = std::min(shape_.seq, s + chunking_.chunk);
      keep("h" + std::to_string(l) + "." + tap, chunkName(l, tap, s, e), out.narrow(1, s, e - s), s,
           e);
    }
    return out;
  }
  void keep(const std::string& node, const std::string& name, const at::Tensor& rows, int64_t s,
            int64_t e) {
    if (!tape_) return;
    harness::Box box = harness::Box::whole(rows.sizes());
    box.offset[1] = s;
    box.length[1] = e - s;
    tape_->keep(node, "forward", name, rows, box);
  }
  bool captureOn_ = false;
  std::unique_ptr<harness::CaptureTape> tape_;
  std::vector<harness::TraceValue> captured_;

  at::Tensor layer(int l, const at::Tensor& x) {
    const Transformer& m = *model_;
    switch (region_) {
      case Region::kAuto:
        TORCH_INTERNAL_ASSERT(false, "the plan names a region");
      case Region::kAttention: {
        const at::Tensor h = m.ln1(l, x);
        const auto [k, v] = m.keysValues(l, h);
        const at::Tensor r = x + region(l, h, k, v);
        return r + m.ffn(l, m.ln2(l, r));
      }
      case Region::kFfn: {
        const at::Tensor h = m.ln1(l, x);
        const auto [k, v] = m.keysValues(l, h);
        const at::Tensor r = x + m.attention(l, h, 0, k, v, shape_.seq);
        const at::Tensor none = at::empty({0}, r.options());  // the function takes three inputs
        return r + region(l, r, none, none);
      }
      case Region::kBlock: {
        const auto [k, v] = m.keysValues(l, m.ln1(l, x));
        return region(l, x, k, v);
      }
      case Region::kLnResidual: {
        const at::Tensor none = at::empty({0}, x.options());
        const auto apply = [&](int i, const at::Tensor& a, const at::Tensor& b) {
          return tapChunks(
              l, regionTaps(region_)[i],
              ChunkedRegion::apply(a, b, none, reinterpret_cast<int64_t>(&tokenwise_[l][i])));
        };
        const at::Tensor h = apply(0, x, none);
        const auto [k, v] = m.keysValues(l, h);
        const at::Tensor a = m.attention(l, h, 0, k, v, shape_.seq);
        const at::Tensor r = apply(1, x, a);
        const at::Tensor h2 = apply(2, r, none);
        const at::Tensor f = m.ffn(l, h2);
        return apply(3, r, f);
      }
    }
    TORCH_INTERNAL_ASSERT(false);
  }

  const ChunkedStrategy& strategy_;
  CaseSpec case_;
  TransformerShape shape_;
  Chunking chunking_;
  std::vector<RegionContext> regions_;
  std::vector<std::array<RegionContext, 4>> tokenwise_;  // ln_residual's four, a layer
  Region region_ = Region::kAttention;
  ChunkSearch search_;
  int64_t maxMemory_ = 0;

  // chunking/auto: the search's plan under the case's limit; none fits: unsupported.
  void plan() {
    const int64_t es = c10::elementSize(case_.dtype);
    if (case_.params.contains("max_memory")) {
      maxMemory_ = *reference::jsonWholeNumber(case_.params["max_memory"], 1, int64_t{1} << 62);
    } else {
      const int64_t unchunked = *estimateActivationPeak(shape_, {"none", shape_.seq}, es);
      maxMemory_ =
          static_cast<int64_t>(std::min(0x1p62, case_.params["max_memory_fraction"].get<double>() *
                                                    static_cast<double>(unchunked)));
    }
    search_ = searchChunkPlan(shape_, es, maxMemory_);
    if (!search_.plan) {
      throw harness::UnsupportedCase("no chunk plan fits max_memory " + std::to_string(maxMemory_) +
                                     " bytes: the smallest of " +
                                     std::to_string(search_.plansTried) + " plans needs " +
                                     std::to_string(search_.smallest) + " (unchunked " +
                                     std::to_string(search_.unchunked) + ")");
    }
    region_ = regionOf(search_.plan->region);
    chunking_.chunk = search_.plan->chunk;
  }
};

std::unique_ptr<harness::RankExecutor> ChunkedStrategy::makeExecutor(const CaseSpec& c) const {
  return std::make_unique<ChunkedExecutor>(*this, c);
}

std::vector<std::unique_ptr<harness::Strategy>> registerChunking() {
  std::vector<std::unique_ptr<harness::Strategy>> out;
  for (Region r :
       {Region::kAttention, Region::kFfn, Region::kBlock, Region::kLnResidual, Region::kAuto}) {
    out.push_back(std::make_unique<ChunkedStrategy>(r, Fault::kNone));
  }
  return out;
}

}  // namespace
}  // namespace sb::strategies::chunking

SB_REGISTER_STRATEGIES(sb::strategies::chunking::registerChunking);
