#include <gtest/gtest.h>

#include "harness/registry.h"
#include "reference/training.h"
#include "strategies/test/test_util.h"

namespace sb::strategies {
namespace {

using test::param;
using test::strategy;

harness::CaseSpec prefillCase(int64_t seq, int64_t chunk, bool training) {
  harness::CaseSpec c = test::linearCase({1, 1}, 1, {1});
  c.workload = "gpt2_prefill";
  c.shape = {{"batch", 2}, {"seq", seq},  {"d_model", 32},
             {"heads", 4}, {"layers", 2}, {"mode", training ? "training" : "inference"}};
  c.params["chunk"] = chunk;
  return c;
}

class ChunkedRegion : public ::testing::TestWithParam<std::tuple<std::string, int64_t, bool>> {};

// Every region, chunks that divide the sequence (16 of 96) and chunks that leave a shorter
// last one (40 of 96: 40, 40, 16), inference and training: equal to the unchunked reference
// within the dtype's tolerance (and the split-sum tolerance for gradients summed over tokens).
TEST_P(ChunkedRegion, MatchesTheUnchunkedReference) {
  const auto& [region, chunk, training] = GetParam();
  const auto rec =
      test::run(prefillCase(96, chunk, training), strategy("chunking/" + region + "/seq"));
  ASSERT_EQ(rec.status, harness::Status::kPass) << rec.message;
  bool sawGrad = false;
  for (const auto& t : rec.details["tensors"]) {
    sawGrad |= std::string(t["tensor"]).rfind("grad/", 0) == 0;
  }
  EXPECT_EQ(sawGrad, training);
}

INSTANTIATE_TEST_SUITE_P(
    RegionsChunksModes, ChunkedRegion,
    ::testing::Combine(::testing::Values("attention", "ffn", "block", "ln_residual"),
                       ::testing::Values(int64_t{16}, int64_t{40}), ::testing::Bool()),
    [](const auto& info) {
      return std::get<0>(info.param) + "_chunk" + std::to_string(std::get<1>(info.param)) +
             (std::get<2>(info.param) ? "_training" : "_inference");
    });

TEST(ChunkedRegionVit, EveryRegionMatchesOnABidirectionalEncoderAndPerChunkSoftmaxFails) {
  for (bool training : {false, true}) {
    auto c = prefillCase(97, 40, training);  // 97 patches: chunks of 40, 40, 17
    c.workload = "vit_encoder";
    for (const char* region : {"attention", "ffn", "block"}) {
      const auto rec = test::run(c, strategy(std::string("chunking/") + region + "/seq"));
      EXPECT_EQ(rec.status, harness::Status::kPass) << region << ": " << rec.message;
    }
    // Without a causal mask every query reads every key: a chunk's own keys are not enough.
    const auto faulty = strategy("chunking/attention/seq").withPlantedFault("per_chunk_reduction");
    EXPECT_EQ(test::run(c, *faulty).status, harness::Status::kFail);
  }
}

// The online-softmax attention: key blocks that divide the sequence, leave a shorter last one
// (40 of 96), one key a block, and one block of every key; causal (GPT-2) and not (ViT). The
// scores of one block are all that exist, and the output equals the reference's within the
// split-sum tolerance. Forgetting the mask or the 1/sqrt(d) is a failed row; a training case
// is unsupported, saying why.
TEST(OnlineAttention, MatchesTheReferenceAndPlantedFaultsFail) {
  for (int64_t chunk : {16, 40, 1, 96}) {
    const auto rec =
        test::run(prefillCase(96, chunk, false), strategy("chunking/attention/online"));
    EXPECT_EQ(rec.status, harness::Status::kPass) << "chunk " << chunk << ": " << rec.message;
  }
  auto vit = prefillCase(97, 40, false);
  vit.workload = "vit_encoder";
  EXPECT_EQ(test::run(vit, strategy("chunking/attention/online")).status, harness::Status::kPass);
  for (const char* fault : {"no_mask", "wrong_scale"}) {
    const auto faulty = strategy("chunking/attention/online").withPlantedFault(fault);
    ASSERT_TRUE(faulty) << fault;
    EXPECT_EQ(test::run(prefillCase(96, 40, false), *faulty).status, harness::Status::kFail)
        << fault;
  }
  // Without causality ViT has nothing to forget: its scale fault still fails.
  const auto scale = strategy("chunking/attention/online").withPlantedFault("wrong_scale");
  EXPECT_EQ(test::run(vit, *scale).status, harness::Status::kFail);
}

// Training: the output and every gradient (input, every parameter) against the plain step, in
// float32 and float64, causal and not, key blocks that divide the sequence and one that leaves a
// shorter last block; the planted faults fail in training too.
TEST(OnlineAttention, TrainsWithTheBlockWalkBackward) {
  for (auto dtype : {at::kFloat, at::kDouble}) {
    for (const char* workload : {"gpt2_prefill", "vit_encoder"}) {
      for (int64_t chunk : {16, 40, 96}) {
        auto c = prefillCase(96, chunk, true);
        c.workload = workload;
        c.dtype = dtype;
        const auto rec = test::run(c, strategy("chunking/attention/online"));
        ASSERT_EQ(rec.status, harness::Status::kPass)
            << workload << " chunk " << chunk << " " << c10::toString(dtype) << ": " << rec.message;
        int grads = 0;
        for (const auto& t : rec.details["tensors"]) {
          grads += t["tensor"].get<std::string>().rfind("grad", 0) == 0;
        }
        EXPECT_GT(grads, 10) << rec.details["tensors"].dump();
        EXPECT_EQ(param(rec, "mode"), "training");
      }
    }
  }
  for (const char* fault : {"no_mask", "wrong_scale"}) {
    const auto faulty = strategy("chunking/attention/online").withPlantedFault(fault);
    EXPECT_EQ(test::run(prefillCase(96, 40, true), *faulty).status, harness::Status::kFail)
        << fault;
  }
}

// Its memory: the estimator's replay of the walk equals the measured activation peak to the
// byte, over batches 1 and 2 (where folding [B, H] copies the head views), causal and not,
// float32 and float64, one and two layers, and blocks from one key to the whole sequence; and
// smaller blocks hold less. bfloat16 is not modelled, and the record says so.
TEST(OnlineAttention, ItsMemoryModelIsExactAndSmallerBlocksHoldLess) {
  int compared = 0;
  for (int64_t batch : {1, 2}) {
    for (const char* workload : {"gpt2_prefill", "vit_encoder"}) {
      for (auto dtype : {at::kFloat, at::kDouble}) {
        for (int64_t layers : {1, 2}) {
          int64_t previous = 0;
          for (int64_t chunk : {1, 7, 40, 97}) {
            auto c = prefillCase(97, chunk, false);
            c.workload = workload;
            c.dtype = dtype;
            c.shape["batch"] = batch;
            c.shape["layers"] = layers;
            const auto rec = test::run(c, strategy("chunking/attention/online"));
            ASSERT_EQ(rec.status, harness::Status::kPass) << rec.message;
            const int64_t measured = std::stoll(param(rec, "activation_peak_bytes"));
            EXPECT_EQ(std::stoll(param(rec, "estimated_activation_peak_bytes")), measured)
                << workload << " batch " << batch << " " << c10::toString(dtype) << " layers "
                << layers << " chunk " << chunk;
            EXPECT_TRUE(rec.mispredicted.empty()) << rec.mispredicted;
            EXPECT_GE(measured, previous) << "chunk " << chunk;
            previous = measured;
            ++compared;
          }
        }
      }
    }
  }
  EXPECT_EQ(compared, 64);

  // Training: the step's peak (in the backward walk, or the feed-forward's for small blocks)
  // replayed with OnlineAttentionFn's saved tensors and its backward walk's temporaries.
  int trained = 0;
  for (int64_t batch : {1, 2}) {
    for (const char* workload : {"gpt2_prefill", "vit_encoder"}) {
      for (auto dtype : {at::kFloat, at::kDouble}) {
        for (int64_t chunk : {1, 40, 97}) {
          auto c = prefillCase(97, chunk, true);
          c.workload = workload;
          c.dtype = dtype;
          c.shape["batch"] = batch;
          const auto rec = test::run(c, strategy("chunking/attention/online"));
          ASSERT_EQ(rec.status, harness::Status::kPass) << rec.message;
          EXPECT_EQ(param(rec, "estimated_activation_peak_bytes"),
                    param(rec, "activation_peak_bytes"))
              << "training " << workload << " batch " << batch << " " << c10::toString(dtype)
              << " chunk " << chunk;
          ++trained;
        }
      }
    }
  }
  EXPECT_EQ(trained, 24);
  auto bf16 = prefillCase(96, 40, false);
  bf16.dtype = at::kBFloat16;
  const auto rec = test::run(bf16, strategy("chunking/attention/online"));
  EXPECT_EQ(rec.status, harness::Status::kPass) << rec.message;
  EXPECT_EQ(param(rec, "estimated_activation_peak_bytes"), "n/a");
  EXPECT_NE(rec.details["executor"]["memory_model"].get<std::string>().find("none for bfloat16"),
            std::string::npos);
}

harness::CaseSpec pairCase(int64_t n, int64_t chunk, bool training) {
  harness::CaseSpec c = test::linearCase({1, 1}, 1, {1});
  c.workload = "evoformer_pair";
  c.shape = {{"batch", 2},  {"n", n},      {"c", 8},
             {"hidden", 8}, {"layers", 2}, {"mode", training ? "training" : "inference"}};
  c.params["chunk"] = chunk;
  return c;
}

// The pair update chunked over rows (dimension 1) or columns (dimension 2), even (8 of 32)
// and uneven (12 of 32: 12, 12, 8) chunks, inference and training.
TEST(ChunkedPair, EitherDimensionMatchesTheReferenceAndPlantedFaultsFail) {
  for (const char* id : {"chunking/triangle/row", "chunking/triangle/col"}) {
    for (bool training : {false, true}) {
      for (int64_t chunk : {8, 12}) {
        const auto rec = test::run(pairCase(32, chunk, training), strategy(id));
        EXPECT_EQ(rec.status, harness::Status::kPass)
            << id << " chunk " << chunk << (training ? " training: " : ": ") << rec.message;
      }
      for (const char* fault : {"off_by_one", "wrong_offset", "per_chunk_reduction"}) {
        const auto faulty = strategy(id).withPlantedFault(fault);
        ASSERT_TRUE(faulty);
        EXPECT_EQ(test::run(pairCase(32, 12, training), *faulty).status, harness::Status::kFail)
            << id << " " << fault;
      }
    }
  }
}

TEST(ChunkedPair, ChunkingShrinksThePairStacksPeak) {
  const auto& s = strategy("chunking/triangle/col");
  const auto whole = test::run(pairCase(48, 48, false), s);
  const auto chunked = test::run(pairCase(48, 6, false), s);
  ASSERT_EQ(whole.status, harness::Status::kPass);
  ASSERT_EQ(chunked.status, harness::Status::kPass);
  EXPECT_LT(std::stod(param(chunked, "activation_peak_bytes")),
            0.6 * std::stod(param(whole, "activation_peak_bytes")));
}

TEST(ChunkedRegionLnResidual, TokenWiseChunksAreBitwiseAtAnyChunkSize) {
  // Layer norms and residual adds work row by row: chunking them repeats the same arithmetic.
  for (int64_t chunk : {7, 40, 96}) {
    const auto rec = test::run(prefillCase(96, chunk, false), strategy("chunking/ln_residual/seq"));
    ASSERT_EQ(rec.status, harness::Status::kPass) << rec.message;
    EXPECT_EQ(*rec.maxAbsErr, 0.0) << chunk;
  }
}

TEST(ChunkedRegionWhole, OneChunkOfTheWholeSequenceIsBitwiseTheReference) {
  for (const char* region : {"attention", "ffn", "block"}) {
    const auto rec =
        test::run(prefillCase(64, 64, false), strategy(std::string("chunking/") + region + "/seq"));
    ASSERT_EQ(rec.status, harness::Status::kPass) << region << ": " << rec.message;
    EXPECT_EQ(*rec.maxAbsErr, 0.0) << region;
  }
}

TEST(ChunkedRegionMemory, ChunkingTheQueriesShrinksTheAttentionPeak) {
  // The [seq, seq] scores dominate at 256 tokens; eighth-sized chunks hold an eighth of them.
  const auto& s = strategy("chunking/attention/seq");
  const auto whole = test::run(prefillCase(256, 256, false), s);
  const auto chunked = test::run(prefillCase(256, 32, false), s);
  ASSERT_EQ(whole.status, harness::Status::kPass);
  ASSERT_EQ(chunked.status, harness::Status::kPass);
  EXPECT_LT(*chunked.peakMemBytes * 2, *whole.peakMemBytes)
      << *chunked.peakMemBytes << " vs " << *whole.peakMemBytes;
}

// Runs every region of both transformer workloads, batch of one and of two (where ATen copies
// strided chunks), at `seq` tokens in chunks of each of `chunks`, and compares the estimate
// with the tracking allocator's measured peak; returns how many rows it compared.
int compareTransformerEstimates(int64_t seq, const std::vector<int64_t>& chunks, bool training) {
  int compared = 0;
  for (const char* workload : {"gpt2_prefill", "vit_encoder"}) {
    for (int64_t batch : {1, 2}) {
      for (int64_t chunk : chunks) {
        auto c = prefillCase(seq, chunk, training);
        c.workload = workload;
        c.shape["batch"] = batch;
        for (const char* region : {"attention", "ffn", "block", "ln_residual"}) {
          const auto rec = test::run(c, strategy(std::string("chunking/") + region + "/seq"));
          EXPECT_EQ(rec.status, harness::Status::kPass) << rec.message;
          if (rec.status != harness::Status::kPass) continue;
          const double measured = std::stod(param(rec, "activation_peak_bytes"));
          const double estimated = std::stod(param(rec, "estimated_activation_peak_bytes"));
          EXPECT_NEAR(estimated, measured, 0.05 * measured)
              << workload << " batch " << batch << " chunk " << chunk << " " << region
              << (training ? " training" : " inference");
          ++compared;
        }
      }
    }
  }
  return compared;
}

// The estimator against the tracking allocator on every workload, even and uneven chunks.
TEST(ChunkEstimator, IsWithinFivePercentOfTheMeasuredPeakOnEveryWorkload) {
  EXPECT_EQ(compareTransformerEstimates(96, {16, 40, 96}, false), 48);
  // And on the pair stack, over rows and columns, in inference and training.
  for (int64_t batch : {1, 2}) {
    for (int64_t chunk : {6, 12, 32}) {
      for (bool training : {false, true}) {
        auto c =
            pairCase(training ? 16 : 32, std::min<int64_t>(chunk, training ? 16 : 32), training);
        c.shape["batch"] = batch;
        for (const char* id : {"chunking/triangle/row", "chunking/triangle/col"}) {
          const auto rec = test::run(c, strategy(id));
          ASSERT_EQ(rec.status, harness::Status::kPass) << rec.message;
          const double measured = std::stod(param(rec, "activation_peak_bytes"));
          const double estimated = std::stod(param(rec, "estimated_activation_peak_bytes"));
          EXPECT_NEAR(estimated, measured, 0.05 * measured)
              << id << " batch " << batch << " chunk " << chunk << " training " << training;
        }
      }
    }
  }
}

// In training too: autograd's saved tensors, the backward's gradients and each chunk's
// recomputed tape.
TEST(ChunkEstimator, IsWithinFivePercentOfTheMeasuredPeakInTraining) {
  EXPECT_EQ(compareTransformerEstimates(48, {20, 48}, true), 32);
}

TEST(ChunkSearch, NeverReturnsAPlanOverItsLimitAndTheRunStaysUnderIt) {
  const auto& autoChunk = strategy("chunking/auto");
  int fitted = 0;
  for (double fraction : {1.5, 0.6, 0.3, 0.15, 0.08}) {
    for (bool training : {false, true}) {
      auto c = prefillCase(training ? 96 : 256, 1, training);
      c.params.erase("chunk");
      c.params["max_memory_fraction"] = fraction;
      const auto rec = test::run(c, autoChunk);
      if (rec.status == harness::Status::kUnsupported) {
        EXPECT_NE(rec.message.find("no chunk plan fits"), std::string::npos) << rec.message;
        continue;
      }
      ASSERT_EQ(rec.status, harness::Status::kPass) << rec.message;
      const double limit = std::stod(param(rec, "max_memory"));
      EXPECT_LE(std::stod(param(rec, "estimated_activation_peak_bytes")), limit) << fraction;
      EXPECT_LE(std::stod(param(rec, "activation_peak_bytes")), limit) << fraction;
      if (fraction >= 1) {
        EXPECT_EQ(param(rec, "plan"), "none");
      }
      ++fitted;
    }
  }
  EXPECT_GE(fitted, 6);
}

TEST(ChunkSearch, SaysClearlyWhenNoPlanFits) {
  auto c = prefillCase(256, 1, false);
  c.params.erase("chunk");
  c.params["max_memory"] = 1000;
  const auto rec = test::run(c, strategy("chunking/auto"));
  EXPECT_EQ(rec.status, harness::Status::kUnsupported);
  EXPECT_NE(rec.message.find("no chunk plan fits max_memory 1000 bytes"), std::string::npos)
      << rec.message;
}

// Planted faults, each in inference and in training: reported as `fail`.
class ChunkingPlantedFault
    : public ::testing::TestWithParam<std::tuple<std::string, std::string, bool>> {};

TEST_P(ChunkingPlantedFault, IsReportedAsFail) {
  const auto& [region, fault, training] = GetParam();
  const auto faulty = strategy("chunking/" + region + "/seq").withPlantedFault(fault);
  ASSERT_TRUE(faulty) << region << " cannot plant " << fault;
  const auto rec = test::run(prefillCase(96, 40, training), *faulty);
  EXPECT_EQ(rec.status, harness::Status::kFail) << rec.message;
}

INSTANTIATE_TEST_SUITE_P(Faults, ChunkingPlantedFault,
                         ::testing::Values(std::make_tuple("attention", "off_by_one", false),
                                           std::make_tuple("ffn", "off_by_one", true),
                                           std::make_tuple("ln_residual", "off_by_one", false),
                                           std::make_tuple("ln_residual", "wrong_offset", true),
                                           std::make_tuple("block", "wrong_offset", false),
                                           std::make_tuple("ffn", "wrong_offset", true),
                                           std::make_tuple("attention", "per_chunk_reduction",
                                                           false),
                                           std::make_tuple("block", "per_chunk_reduction", true)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" + std::get<1>(info.param) +
                                  (std::get<2>(info.param) ? "_training" : "_inference");
                         });

// Over optimizer steps: every region trains three steps from the same parameters against the
// unchunked loop (losses, norms, parameters, momentum), its peak predicted to the byte with the
// optimizer's state and the update; a planted fault fails on the losses.
TEST(ChunkedTraining, EveryRegionTrainsOverStepsToTheByteAndAFaultFailsOnItsLosses) {
  harness::CaseSpec c = prefillCase(64, 24, true);
  c.training.steps = 3;
  c.training.optimizer = reference::OptimizerSpec::fromJson(
      {{"kind", "sgd"}, {"lr", 0.001}, {"momentum", 0.9}}, "test");
  for (const std::string id : {"chunking/attention/seq", "chunking/ffn/seq", "chunking/block/seq",
                               "chunking/ln_residual/seq", "chunking/attention/online"}) {
    const auto rec = test::run(c, strategy(id));
    ASSERT_EQ(rec.status, harness::Status::kPass) << id << ": " << rec.message;
    ASSERT_TRUE(rec.predictedMemBytes) << id;
    EXPECT_EQ(rec.peakMemBytes, *rec.predictedMemBytes) << id;
    bool sawState = false, sawLoss = false;
    for (const auto& t : rec.details["tensors"]) {
      sawState |= std::string(t["tensor"]).rfind("state/", 0) == 0;
      sawLoss |= t["tensor"] == "loss";
    }
    EXPECT_TRUE(sawState && sawLoss) << id;
  }
  const auto faulty = strategy("chunking/ffn/seq").withPlantedFault("wrong_offset");
  const auto rec = test::run(c, *faulty);
  EXPECT_EQ(rec.status, harness::Status::kFail);
  EXPECT_NE(rec.message.find("loss"), std::string::npos) << rec.message;
}

}  // namespace
}  // namespace sb::strategies
