// Executors on a GPU (label gpu; every test skips, saying why, without CUDA): what only a GPU
// can get wrong.
//   - Checkpointing with dropout: on CUDA tensors dropout draws from the device's Philox
//     generator, so a recomputed stage must run from the seed and offset its first forward saw
//     and put them back after (the CPU generator alone would leave every recomputed mask new).
//     The plain step's generator state is compared too ("rng/cuda").
//   - The online-softmax attention as a chunking executor, prefill and training: the CUDA
//     kernel (and the ATen backward walk) against the reference, its planted faults, and the
//     chunking estimator's replays of the kernel path's memory against the caching
//     allocator's per-rank peak.

#include <gtest/gtest.h>

#include <map>

#include "harness/measure/device.h"
#include "harness/measure/memory.h"
#include "harness/registry.h"
#include "reference/workload.h"
#include "strategies/test/test_util.h"

namespace sb::strategies {
namespace {

using test::param;
using test::strategy;

class OnCuda : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!harness::cudaUsable(&why)) GTEST_SKIP() << "no CUDA: " << why;
    harness::MemoryTracker::instance().install();
    ASSERT_TRUE(harness::installCudaMemoryTracking(&why)) << why;
    reference::setCaseDevice(at::Device(at::kCUDA, harness::currentCudaDevice()));
  }
  void TearDown() override { reference::setCaseDevice(at::kCPU); }
};

harness::CaseSpec chainCase(const std::string& workload, double budget) {
  static const std::map<std::string, nlohmann::json> shapes = {
      {"mlp_chain", {{"batch", 64}, {"width", 256}, {"depth", 6}, {"dropout", 0.2}}},
      {"gpt2_stack",
       {{"batch", 2}, {"seq", 64}, {"d_model", 64}, {"heads", 4}, {"layers", 4}, {"dropout", 0.2}}},
  };
  harness::CaseSpec c = test::linearCase({1, 1}, 1, {1});
  c.device = "cuda";
  c.workload = workload;
  c.shape = shapes.at(workload);
  if (budget > 0) c.params["budget"] = budget;
  return c;
}

bool comparesTensor(const harness::Record& r, const std::string& name) {
  for (const auto& t : r.details["tensors"]) {
    if (t["tensor"] == name) return true;
  }
  return false;
}

// full recomputes every stage and sqrt every segment's; rotor what 85% of the plain peak
// makes it (it may find no schedule: then the row says so).
TEST_F(OnCuda, CheckpointingRecomputesDropoutWithTheDevicesGeneratorBitwise) {
  for (const char* workload : {"mlp_chain", "gpt2_stack"}) {
    for (const auto& [solver, budget] :
         {std::pair<std::string, double>{"full", 0}, {"sqrt", 0}, {"rotor", 0.85}}) {
      const auto rec = test::run(chainCase(workload, budget), strategy("checkpointing/" + solver));
      if (rec.status == harness::Status::kUnsupported && solver == "rotor") {
        EXPECT_NE(rec.message.find("fits a budget"), std::string::npos) << rec.message;
        continue;
      }
      ASSERT_EQ(rec.status, harness::Status::kPass)
          << workload << " " << solver << ": " << rec.message;
      EXPECT_EQ(*rec.mismatches, 0) << workload << " " << solver;
      EXPECT_GT(std::stoi(param(rec, "recomputed_forwards")), 0) << workload << " " << solver;
      EXPECT_TRUE(comparesTensor(rec, "rng/cuda")) << rec.details["tensors"].dump();
      EXPECT_NE(rec.provenance.device.find("cuda:"), std::string::npos) << rec.provenance.device;
    }
  }
}

// Planted faults: recomputing from wherever the device generator is draws new masks; leaving
// it where a recomputation left it gets every number right and hands the next step a wrong
// state, which "rng/cuda" alone shows (the CPU generator is untouched on a GPU).
TEST_F(OnCuda, CheckpointingPlantedGeneratorFaultsFail) {
  const auto noRestore = strategy("checkpointing/full").withPlantedFault("no_rng_restore");
  ASSERT_TRUE(noRestore);
  const auto rec = test::run(chainCase("mlp_chain", 0), *noRestore);
  EXPECT_EQ(rec.status, harness::Status::kFail) << rec.message;
  EXPECT_GT(*rec.mismatches, 0);

  const auto left = strategy("checkpointing/full").withPlantedFault("rng_left_after_recompute");
  ASSERT_TRUE(left);
  const auto stale = test::run(chainCase("mlp_chain", 0), *left);
  EXPECT_EQ(stale.status, harness::Status::kFail) << stale.message;
  EXPECT_EQ(stale.worstTensor, "rng/cuda") << stale.message;
  for (const auto& t : stale.details["tensors"]) {
    if (t["tensor"] != "rng/cuda") {
      EXPECT_EQ(t["mismatches"], 0) << t.dump();
    }
  }
}

harness::CaseSpec prefillCase(int64_t seq, int64_t chunk, bool training = false) {
  harness::CaseSpec c = test::linearCase({1, 1}, 1, {1});
  c.device = "cuda";
  c.workload = "gpt2_prefill";
  c.shape = {{"batch", 2}, {"seq", seq},  {"d_model", 128},
             {"heads", 4}, {"layers", 2}, {"mode", training ? "training" : "inference"}};
  c.params["chunk"] = chunk;
  return c;
}

// The kernel as a chunking executor: causal and not, blocks that divide the sequence and one
// that leaves a short last block, prefill and training (the kernel's forward, the ATen walk's
// backward in cuBLAS products); its memory replays against the allocator hook's peak.
TEST_F(OnCuda, OnlineAttentionMatchesTheReferenceAndItsMemoryModel) {
  for (bool training : {false, true}) {
    for (const char* workload : {"gpt2_prefill", "vit_encoder"}) {
      for (int64_t chunk : {64, 40}) {
        auto c = prefillCase(200, chunk, training);
        c.workload = workload;
        const auto rec = test::run(c, strategy("chunking/attention/online"));
        const std::string what = std::string(workload) + " chunk " + std::to_string(chunk) +
                                 (training ? " training" : "");
        ASSERT_EQ(rec.status, harness::Status::kPass) << what << ": " << rec.message;
        EXPECT_EQ(param(rec, "estimated_activation_peak_bytes"),
                  param(rec, "activation_peak_bytes"))
            << what;
        EXPECT_TRUE(rec.mispredicted.empty()) << what << ": " << rec.message;
      }
    }
  }
  for (const char* fault : {"no_mask", "wrong_scale"}) {
    const auto faulty = strategy("chunking/attention/online").withPlantedFault(fault);
    ASSERT_TRUE(faulty) << fault;
    EXPECT_EQ(test::run(prefillCase(200, 64), *faulty).status, harness::Status::kFail) << fault;
  }
}

}  // namespace
}  // namespace sb::strategies
