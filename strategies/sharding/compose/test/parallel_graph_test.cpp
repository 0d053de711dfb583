// The graph summary the degree search prices (parallel_graph.h), against LLaMA's and GPT-2's
// sizes in closed form: parameters, matmul flops, Megatron's tp regions and collectives, the
// keys and values context parallelism passes.

#include <gtest/gtest.h>

#include "reference/graph.h"
#include "strategies/sharding/compose/parallel_graph.h"

namespace {

using sb::strategies::compose::ModelCosts;
using sb::strategies::compose::modelCosts;

TEST(ParallelGraph, LlamaInClosedForm) {
  const int64_t B = 2, S = 16, D = 32, H = 4, Hk = 2, F = 48, V = 64, L = 3, dh = D / H;
  const nlohmann::json shape = {{"batch", B}, {"seq", S},    {"d_model", D}, {"heads", H},
                                {"kv_heads", Hk}, {"ffn", F}, {"vocab", V},  {"layers", L}};
  const ModelCosts m = modelCosts(sb::reference::buildGraph("llama", shape), 4);
  ASSERT_EQ(m.units.size(), static_cast<size_t>(L + 2));
  EXPECT_EQ(m.heads, H);
  EXPECT_EQ(m.kvHeads, Hk);
  EXPECT_EQ(m.ffn, F);
  const double T = static_cast<double>(B * S);
  const auto& emb = m.units.front();
  const auto& head = m.units.back();
  EXPECT_FALSE(emb.block);
  EXPECT_FALSE(head.block);
  EXPECT_DOUBLE_EQ(emb.tpParams, static_cast<double>(V * D));
  EXPECT_EQ(emb.tpCollectives, 1);  // the row-parallel embedding's reduction
  EXPECT_DOUBLE_EQ(head.tpParams, static_cast<double>(D * V));
  EXPECT_DOUBLE_EQ(head.replicatedParams, static_cast<double>(D));  // the final norm
  EXPECT_DOUBLE_EQ(head.flops, 2 * T * D * V);
  for (int l = 1; l <= L; ++l) {
    const auto& u = m.units[static_cast<size_t>(l)];
    EXPECT_TRUE(u.block);
    // q, k, v, o and the SwiGLU's three: all cut by tp; the two norms whole.
    EXPECT_DOUBLE_EQ(u.tpParams, static_cast<double>(D * H * dh + 2 * D * Hk * dh + D * D + 3 * D * F));
    EXPECT_DOUBLE_EQ(u.replicatedParams, static_cast<double>(2 * D));
    // The projections' flops, then scores and context: 2 B H S S dh each.
    const double proj = 2 * T * (D * H * dh + 2 * D * Hk * dh + D * D + 3 * D * F);
    EXPECT_DOUBLE_EQ(u.flops, proj + 2 * 2.0 * B * H * S * S * dh);
    // Two row-parallel matmuls (the attention's output, the MLP's down).
    EXPECT_EQ(u.tpCollectives, 2);
    // The keys and values the attention's matmuls read.
    EXPECT_DOUBLE_EQ(u.attentionKv, 2.0 * B * Hk * S * dh);
    // The block hands its residual stream on.
    EXPECT_DOUBLE_EQ(u.boundaryElems, T * D);
    // The projections' outputs, the scores and the context inside the tp regions; the out and
    // down projections' on the stream.
    EXPECT_DOUBLE_EQ(u.shardedMatmulActs,
                     T * (H * dh + 2 * Hk * dh + 2 * F) + 1.0 * B * H * S * S + T * H * dh);
    EXPECT_DOUBLE_EQ(u.streamMatmulActs, 2 * T * D);
    EXPECT_GT(u.shardedActs, u.shardedMatmulActs);
    EXPECT_GT(u.streamActs, u.streamMatmulActs);  // the norms and residual adds
  }
}

TEST(ParallelGraph, Gpt2TiedHeadCountedOnce) {
  const ModelCosts m = modelCosts(
      sb::reference::buildGraph("gpt2", {{"layers", 2}, {"d_model", 32}, {"vocab", 64}}), 4);
  ASSERT_EQ(m.units.size(), 4u);
  // The embedding holds the token and position tables; the head reuses the token table (tied):
  // only its bias and the final norm are its own.
  EXPECT_DOUBLE_EQ(m.units.front().tpParams, 64.0 * 32 + 16.0 * 32);
  EXPECT_DOUBLE_EQ(m.units.back().tpParams, 0);
  EXPECT_DOUBLE_EQ(m.units.back().replicatedParams, 64 + 2 * 32);
}

TEST(ParallelGraph, RefusesAGraphWithoutBlocks) {
  EXPECT_THROW(modelCosts(sb::reference::buildGraph("mlp", {{"layers", 1}}), 4),
               std::invalid_argument);
}

}  // namespace
