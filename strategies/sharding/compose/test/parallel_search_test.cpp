// The degree search of composed parallelism (parallel_search.h), on hand-built model summaries:
// what it enumerates, what it refuses, how its predictions move with each degree, and the
// pipeline's bubble against the closed form of a uniform 1F1B.

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "strategies/sharding/compose/parallel_search.h"

namespace sb::strategies::compose {
namespace {

// A LLaMA-like summary: an embedding, `blocks` equal blocks, a head; 8 heads, 4 kv heads.
ModelCosts toyModel(int blocks, bool withEnds = true) {
  ModelCosts m;
  m.workload = "toy";
  m.batch = 16;
  m.seq = 64;
  m.dModel = 64;
  m.heads = 8;
  m.kvHeads = 4;
  m.ffn = 256;
  m.vocab = 512;
  const double tokens = static_cast<double>(m.batch * m.seq);
  if (withEnds) {
    UnitCosts e;
    e.name = "embedding";
    e.tpParams = 512.0 * 64;
    e.streamActs = tokens * 64;
    e.streamTraffic = tokens * 64;
    e.kernels = 1;
    e.tpCollectives = 1;
    e.boundaryElems = tokens * 64;
    m.units.push_back(e);
  }
  for (int b = 0; b < blocks; ++b) {
    UnitCosts u;
    u.name = "block " + std::to_string(b);
    u.block = true;
    u.flops = 2 * tokens * 64 * (64 + 32 + 32 + 64 + 3 * 256);
    u.tpParams = 64.0 * (64 + 32 + 32 + 64 + 3 * 256);
    u.replicatedParams = 128;
    u.largestParam = 64.0 * 256;
    u.shardedActs = tokens * (64 + 32 + 32 + 3 * 256) + 16.0 * 8 * 64 * 64;
    u.streamActs = tokens * 64 * 4;
    u.shardedMatmulActs = tokens * (64 + 32 + 32 + 2 * 256);
    u.streamMatmulActs = tokens * 64 * 2;
    u.shardedTraffic = tokens * 256;
    u.streamTraffic = tokens * 64 * 4;
    u.kernels = 20;
    u.tpCollectives = 2;
    u.attentionKv = tokens * 64;
    u.boundaryElems = tokens * 64;
    m.units.push_back(u);
  }
  if (withEnds) {
    UnitCosts h;
    h.name = "head";
    h.flops = 2 * tokens * 64 * 512;
    h.tpParams = 64.0 * 512;
    h.replicatedParams = 64;
    h.shardedActs = tokens * 512;
    h.streamActs = tokens * 64;
    h.kernels = 2;
    h.tpCollectives = 1;
    h.boundaryElems = tokens * 512;
    m.units.push_back(h);
  }
  return m;
}

ParallelConfig config(int pp, int dr, int ds, int cp, int tp) {
  ParallelConfig c;
  c.pp = pp;
  c.dpReplicate = dr;
  c.dpShard = ds;
  c.cp = cp;
  c.tp = tp;
  if (pp > 1) {
    c.schedule = "1f1b";
    c.microbatches = pp;
  }
  return c;
}

TEST(ParallelSearch, EnumeratesEveryOrderedFactorisation) {
  // 8 = 2^3 over 5 axes: C(3 + 4, 4) = 35 assignments; without cp, over 4 axes: C(3 + 3, 3) = 20;
  // without cp or pp: C(3 + 2, 2) = 10.
  SearchOptions o;
  o.ranks = 8;
  EXPECT_EQ(search(toyModel(4), o).degreeAssignments, 35);
  o.cp = false;
  EXPECT_EQ(search(toyModel(4), o).degreeAssignments, 20);
  o.pp = false;
  EXPECT_EQ(search(toyModel(4), o).degreeAssignments, 10);
  // 12 = 2^2 3 over 5 axes: 15 ways for the twos times 5 for the three.
  o.cp = o.pp = true;
  o.ranks = 12;
  EXPECT_EQ(search(toyModel(4), o).degreeAssignments, 75);
}

TEST(ParallelSearch, RefusesWhatDoesNotDivide) {
  const ModelCosts m = toyModel(4);
  EXPECT_EQ(invalidReason(m, config(1, 1, 1, 1, 4)), "");
  EXPECT_NE(invalidReason(m, config(1, 1, 1, 1, 8)).find("kv heads"), std::string::npos);
  auto wide = m;
  wide.ffn = 250;
  EXPECT_NE(invalidReason(wide, config(1, 1, 1, 1, 4)).find("ffn"), std::string::npos);
  EXPECT_NE(invalidReason(m, config(1, 2, 1, 1, 1)).find("HSDP"), std::string::npos);
  EXPECT_NE(invalidReason(m, config(1, 1, 32, 1, 1)).find("batch"), std::string::npos);
  EXPECT_NE(invalidReason(m, config(1, 1, 1, 64, 1)).find("cp"), std::string::npos);
  EXPECT_NE(invalidReason(m, config(8, 1, 1, 1, 1)).find("stages"), std::string::npos);
  auto sp = config(1, 1, 1, 1, 1);
  sp.sp = true;
  EXPECT_NE(invalidReason(m, sp).find("sp"), std::string::npos);
  auto mb = config(2, 1, 1, 1, 1);
  mb.microbatches = 3;  // 16 rows do not divide into 3
  EXPECT_NE(invalidReason(m, mb).find("micro-batches"), std::string::npos);
  EXPECT_THROW(predict(m, config(1, 1, 1, 1, 8), SearchOptions{}), std::invalid_argument);
}

TEST(ParallelSearch, ShardsMoveTheMemoryAsTheDegreesSay) {
  const ModelCosts m = toyModel(4);
  SearchOptions o;
  // FSDP: twice the shards, half the sharded parameters, gradients and optimizer states.
  const Prediction d2 = predict(m, config(1, 1, 2, 1, 1), o);
  const Prediction d4 = predict(m, config(1, 1, 4, 1, 1), o);
  EXPECT_DOUBLE_EQ(d4.paramBytes * 2, d2.paramBytes);
  EXPECT_DOUBLE_EQ(d2.optimizerBytes, 2 * d2.paramBytes);  // AdamW's two states
  // HSDP's replicas hold what FSDP's shards do.
  const Prediction h = predict(m, config(1, 2, 2, 1, 1), o);
  EXPECT_DOUBLE_EQ(h.paramBytes, d2.paramBytes);
  // The parameters' elements summed by hand: tp-cut ones / tp, norms whole.
  double tpParams = 0, replicated = 0;
  for (const auto& u : m.units) {
    tpParams += u.tpParams;
    replicated += u.replicatedParams;
  }
  const Prediction t2 = predict(m, config(1, 1, 1, 1, 2), o);
  EXPECT_DOUBLE_EQ(t2.paramBytes, (tpParams / 2 + replicated) * 4);
  EXPECT_DOUBLE_EQ(t2.gatheredBytes, 0);  // no FSDP, nothing gathered
  // A pipeline of 2: each rank about half the parameters (the peak rank's is reported).
  const Prediction p2 = predict(m, config(2, 1, 1, 1, 1), o);
  EXPECT_LT(p2.paramBytes, 0.6 * (tpParams + replicated) * 4);
  EXPECT_GT(p2.paramBytes, 0.4 * (tpParams + replicated) * 4);
  // SGD with momentum: one state; plain SGD none.
  o.optimizer = "sgd";
  EXPECT_DOUBLE_EQ(predict(m, config(1, 1, 2, 1, 1), o).optimizerBytes, d2.paramBytes);
  o.optimizer = "sgd-plain";
  EXPECT_DOUBLE_EQ(predict(m, config(1, 1, 2, 1, 1), o).optimizerBytes, 0);
}

TEST(ParallelSearch, CheckpointingAndSequenceParallelismCutTheActivations) {
  const ModelCosts m = toyModel(4);
  const SearchOptions o;
  auto c = config(1, 1, 1, 1, 2);
  const double none = predict(m, c, o).activationBytes;
  c.ac = "selective";
  const double selective = predict(m, c, o).activationBytes;
  c.ac = "full";
  const double full = predict(m, c, o).activationBytes;
  EXPECT_LT(full, selective);
  EXPECT_LT(selective, none);
  // Recomputation is paid in time.
  c.ac = "none";
  const double tNone = predict(m, c, o).computeUs;
  c.ac = "full";
  EXPECT_GT(predict(m, c, o).computeUs, tNone);
  // SP cuts the residual stream's activations by tp.
  c.ac = "none";
  c.sp = true;
  EXPECT_LT(predict(m, c, o).activationBytes, none);
  // cp cuts every activation by its degree.
  const double cp1 = predict(m, config(1, 1, 1, 1, 1), o).activationBytes;
  EXPECT_DOUBLE_EQ(predict(m, config(1, 1, 1, 2, 1), o).activationBytes * 2, cp1);
}

TEST(ParallelSearch, UniformOneFOneBHasTheClosedFormBubble) {
  // Four equal blocks on four stages, nothing but compute: 1F1B's bubble is (p - 1) / (M + p - 1).
  const ModelCosts m = toyModel(4, false);
  SearchOptions o;
  o.prices.latencyUs = 0;
  o.prices.intraGBps = o.prices.interGBps = 1e9;
  for (int mb : {4, 8, 16}) {
    auto c = config(4, 1, 1, 1, 1);
    c.microbatches = mb;
    const Prediction p = predict(m, c, o);
    EXPECT_NEAR(p.bubbleFraction, 3.0 / (mb + 3), 1e-3) << mb;
    // The step: (M + p - 1) forward-and-backward slots of one stage, plus the optimizer.
    const double slot = p.computeUs / mb;  // one rank's per-micro-batch F + B
    EXPECT_NEAR(p.pipelineUs, (mb + 3) * slot, 1e-3 * p.pipelineUs) << mb;
  }
}

TEST(ParallelSearch, RanksByStepAndKeepsTheMemoryLimit) {
  const ModelCosts m = toyModel(4);
  SearchOptions o;
  o.ranks = 8;
  o.top = 100000;
  const SearchResult all = search(m, o);
  ASSERT_GT(all.fitting, 10);
  EXPECT_TRUE(std::is_sorted(all.ranked.begin(), all.ranked.end(),
                             [](const Prediction& a, const Prediction& b) {
                               return a.stepUs < b.stepUs;
                             }));
  // Every configuration is listed once.
  std::set<std::string> labels;
  for (const auto& p : all.ranked) EXPECT_TRUE(labels.insert(p.config.label()).second);
  // A limit between the least and the most memory: what fits is under it, and something was
  // left out.
  double lo = 1e300, hi = 0;
  for (const auto& p : all.ranked) {
    lo = std::min(lo, p.peakBytes);
    hi = std::max(hi, p.peakBytes);
  }
  o.memoryLimit = (lo + hi) / 2;
  const SearchResult some = search(m, o);
  EXPECT_GT(some.overMemory, 0);
  EXPECT_EQ(some.fitting + some.overMemory, all.fitting);
  for (const auto& p : some.ranked) EXPECT_LE(p.peakBytes, o.memoryLimit);
  EXPECT_DOUBLE_EQ(some.leastMemory.peakBytes, lo);
  // A limit under the least: nothing fits, and the least is said.
  o.memoryLimit = lo / 2;
  const SearchResult none = search(m, o);
  EXPECT_TRUE(none.ranked.empty());
  EXPECT_TRUE(none.anyValid);
  EXPECT_DOUBLE_EQ(none.leastMemory.peakBytes, lo);
}

TEST(ParallelSearch, CrossNodeAxesPayTheSlowerLinks) {
  const ModelCosts m = toyModel(4);
  SearchOptions o;
  o.prices.ranksPerNode = 2;
  o.prices.intraGBps = 100;
  o.prices.interGBps = 1;
  // tp 2 inside a node, dp_shard 2 across: the tp collectives fast, FSDP's slow; swapped
  // (tp 4 spans two nodes) tp pays the slow link.
  const Prediction inside = predict(m, config(1, 1, 2, 1, 2), o);
  const Prediction across = predict(m, config(1, 1, 1, 1, 4), o);
  EXPECT_GT(across.tpUs, 10 * inside.tpUs);
  o.prices.ranksPerNode = 8;
  EXPECT_LT(predict(m, config(1, 1, 1, 1, 4), o).tpUs, across.tpUs / 10);
}

}  // namespace
}  // namespace sb::strategies::compose
