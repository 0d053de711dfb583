// Single-operator sharding strategies: how many each generator makes for the shapes ColossalAI's
// tests use (counts from its generators, not from ours), that planted faults fail, that shapes
// which cannot be sharded are `unsupported` naming the dimension, and that the memory model
// is the measurement.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <set>
#include <string>

#include "harness/registry.h"
#include "strategies/sharding/ops/op_rule.h"
#include "strategies/sharding/ops/op_specs_common.h"
#include "strategies/sharding/ops/op_strategies.h"
#include "strategies/test/test_util.h"

namespace sb::strategies {
namespace {

using harness::Applicability;
using harness::CaseSpec;
using harness::Status;
using test::opCase;

// An operator's rule is one registration with every part: one left empty, an operator with no
// place in the listing order, or a second rule for a registered operator is refused at
// registration, naming the operator and what is wrong, never a silent fall-through.
TEST(OpRule, RegistrationRefusesAMissingPartAnUnlistedOperatorAndADuplicate) {
  const auto refused = [](const std::string& op, OpRule rule) -> std::string {
    try {
      registerOpRule(op, std::move(rule));
    } catch (const c10::Error& e) {
      return e.what_without_backtrace();
    }
    return "";
  };
  OpRule noMemory = opRule("relu");
  noMemory.memory = nullptr;
  EXPECT_NE(refused("relu", noMemory).find("op rule 'relu': the part 'memory' is empty"),
            std::string::npos);
  EXPECT_NE(refused("tanh", opRule("relu")).find("op rule 'tanh': not in kOpOrder"),
            std::string::npos);
  EXPECT_NE(refused("relu", opRule("relu")).find("op rule 'relu' is registered twice"),
            std::string::npos);
  EXPECT_NE(refused("cosh", OpRule{}).find("the part 'canonicalShapes' is empty"),
            std::string::npos);
}

// The strategies that select `c` (applicable or unsupported), from the set `set` ("" for all).
std::vector<const harness::Strategy*> selected(const CaseSpec& c, const std::string& set = "") {
  auto& reg = harness::StrategyRegistry::global();
  reg.expandFor(c);
  std::vector<const harness::Strategy*> out;
  for (const auto* s : reg.matching("sharding/op/.*")) {
    if (s->applies(c).kind == Applicability::Kind::kNotApplicable) continue;
    if (!set.empty() && s->describe().value("set", "") != set) continue;
    out.push_back(s);
  }
  return out;
}

const harness::Strategy* byName(const CaseSpec& c, const std::string& name) {
  for (const auto* s : selected(c)) {
    if (s->displayName() == name) return s;
  }
  ADD_FAILURE() << "no strategy named " << name;
  return nullptr;
}

const nlohmann::json kAddmm = {{"op", "addmm"}, {"input", {16, 32}}, {"other", {32, 16}}};
const nlohmann::json kBmm = {{"op", "bmm"}, {"input", {4, 8, 16}}, {"other", {4, 16, 8}}};
const nlohmann::json kBatchedMatmul = {
    {"op", "matmul"}, {"input", {2, 4, 8, 16}}, {"other", {2, 4, 16, 8}}};
const nlohmann::json kEmbedding = {
    {"op", "embedding"}, {"input", {4, 16, 16}}, {"num_embeddings", 64}, {"embedding_dim", 32}};
const nlohmann::json kLayerNorm = {{"op", "layer_norm"}, {"input", {4, 16}}};
const nlohmann::json kBatchNorm = {{"op", "batch_norm"}, {"input", {8, 4, 6, 6}}};
const nlohmann::json kConv = {
    {"op", "conv2d"}, {"input", {4, 4, 8, 8}}, {"out_channels", 8}, {"kernel", 3}, {"padding", 1}};

TEST(OpStrategyCounts, MatchColossalAIGenerators) {
  // LinearProjectionStrategyGenerator on a 2-D input: 14.
  EXPECT_EQ(selected(opCase(kAddmm, {2, 2}), "colossalai").size(), 14u);
  EXPECT_EQ(selected(opCase(kAddmm, {4}), "colossalai").size(), 4u);
  // BatchedMatMulStrategyGenerator: 7 on a 2x2 mesh, 1 on a 1x4 mesh (counted as 1-D).
  EXPECT_EQ(selected(opCase(kBmm, {2, 2})).size(), 7u);
  EXPECT_EQ(selected(opCase(kBmm, {1, 4})).size(), 1u);
  EXPECT_EQ(selected(opCase(kBmm, {4})).size(), 1u);
  // EmbeddingStrategyGenerator for ids (4, 16, 16): 4 that keep the ids whole and 5 that split
  // them, each on any of the 3 id dimensions; plus our 3 vocabulary splits.
  EXPECT_EQ(selected(opCase(kEmbedding, {2, 2}), "colossalai").size(), 19u);
  EXPECT_EQ(selected(opCase(kEmbedding, {2, 2}), "beyond").size(), 3u);
  // LayerNormGenerator, (4, 16): the batch dimension only; plus 5 hidden-dimension splits.
  EXPECT_EQ(selected(opCase(kLayerNorm, {2, 2}), "colossalai").size(), 4u);
  EXPECT_EQ(selected(opCase(kLayerNorm, {2, 2}), "beyond").size(), 5u);
  // BatchNormStrategyGenerator: 4 plain and 5 with synchronised statistics.
  size_t sync = 0;
  const auto bn = selected(opCase(kBatchNorm, {2, 2}));
  for (const auto* s : bn) sync += s->describe().value("variant", "") == "sync";
  EXPECT_EQ(bn.size() - sync, 4u);
  EXPECT_EQ(sync, 5u);
  // ConvStrategyGenerator: 16; NormalPoolStrategyGenerator: 9.
  EXPECT_EQ(selected(opCase(kConv, {2, 2})).size(), 16u);
  EXPECT_EQ(selected(opCase({{"op", "max_pool2d"}, {"input", {4, 4, 8, 8}}, {"kernel", 2}}, {2, 2}))
                .size(),
            9u);
  // BinaryElementwiseStrategyGenerator on a 2-D output: 9, with or without broadcasting.
  EXPECT_EQ(selected(opCase({{"op", "add"}, {"input", {8, 16}}, {"other", {16}}}, {2, 2})).size(),
            9u);
  EXPECT_EQ(
      selected(opCase({{"op", "mul"}, {"input", {8, 16}}, {"other", {8, 16}}}, {2, 2})).size(), 9u);
  // Softmax keeps its dimension whole: 4 of the 9 layouts of a 2-D input.
  EXPECT_EQ(selected(opCase({{"op", "softmax"}, {"input", {8, 16}}, {"dim", -1}}, {2, 2})).size(),
            4u);
}

// A mesh of 3 axes: each axis takes one of the operator's placements on a single axis, so
// addmm, with ColossalAI's 4 strategies on a 1-D mesh, has 4^3 on 2x2x2, every one distinct.
TEST(OpStrategyCounts, ThreeAxesTakeEveryCombinationOfTheOneAxisPlacements) {
  const size_t oneD = selected(opCase(kAddmm, {4}), "colossalai").size();
  ASSERT_EQ(oneD, 4u);
  const auto expanded = selected(opCase(kAddmm, {2, 2, 2}));
  EXPECT_EQ(expanded.size(), oneD * oneD * oneD);
  std::set<std::string> names;
  for (const auto* s : expanded) {
    EXPECT_EQ(s->describe().value("set", ""), "expanded") << s->id();
    names.insert(s->displayName());
  }
  EXPECT_EQ(names.size(), expanded.size());
  // On a 2-D mesh the generators' sets stay ColossalAI's; beyond 3 axes there are none (4^8
  // for an 8-axis mesh of ones would be enumerated and cached otherwise).
  EXPECT_TRUE(selected(opCase(kAddmm, {2, 2}), "expanded").empty());
  EXPECT_TRUE(opStrategySpecs(reference::OpShape::parse(kAddmm), 4).empty());
  EXPECT_TRUE(selected(opCase(kAddmm, {1, 1, 1, 1, 1, 1, 1, 1})).empty());
}

// The expansion on two axes holds every strategy ColossalAI's generators make for a 2-D mesh
// (the same layouts and variant): composing single-axis placements loses none of them.
TEST(OpStrategyCounts, ExpansionToTwoAxesHoldsTheGeneratorsTwoAxisStrategies) {
  for (const auto& shape : {kAddmm, kBmm, kEmbedding, kLayerNorm, kBatchNorm, kConv,
                            nlohmann::json{{"op", "softmax"}, {"input", {8, 16}}, {"dim", -1}},
                            nlohmann::json{{"op", "add"}, {"input", {8, 16}}, {"other", {16}}}}) {
    const auto s = reference::OpShape::parse(shape);
    const auto specs = opStrategySpecs(s, 2);
    const auto two = expandToMesh(specs, s, 2);
    int compared = 0;
    for (const auto& sp : specs) {
      if (sp.gatherInput ||
          std::find(sp.meshDims.begin(), sp.meshDims.end(), 2) == sp.meshDims.end()) {
        continue;
      }
      ++compared;
      const bool found = std::any_of(two.begin(), two.end(), [&](const OpStrategySpec& e) {
        return e.operandLayouts == sp.operandLayouts && e.outputLayouts == sp.outputLayouts &&
               e.variant == sp.variant;
      });
      EXPECT_TRUE(found) << s.op << ": " << sp.name << " is not among the expansion's";
    }
    EXPECT_GT(compared, 0) << s.op;
  }
}

// matmul batched over [batch, heads]: six placements on one axis (replicated, batch, heads,
// rows, columns, contraction), each pair of them on a 2-D mesh, each triple on 2x2x2. The batch
// and the heads split on different axes in either order (bmm's flattened [batch * heads] splits
// them only as one dimension, the batch on the outer axis), or one of them over both.
TEST(OpStrategyCounts, BatchedMatmulSplitsBatchAndHeadsOnAnyAxes) {
  EXPECT_EQ(selected(opCase(kBatchedMatmul, {4})).size(), 6u);
  EXPECT_EQ(selected(opCase(kBatchedMatmul, {2, 2})).size(), 6u * 6u);
  EXPECT_EQ(selected(opCase(kBatchedMatmul, {2, 2, 2})).size(), 6u * 6u * 6u);
  for (const char* name :
       {"S1S0RR = S1S0RR x S1S0RR", "S0S1RR = S0S1RR x S0S1RR", "RS01RR = RS01RR x RS01RR",
        "S1RRS0 = S1RRR x S1RRS0", "S0RRRP1 = S0RRS1 x S0RS1R"}) {
    const auto* s = byName(opCase(kBatchedMatmul, {2, 2}), name);
    ASSERT_NE(s, nullptr) << name;
    EXPECT_EQ(s->applies(opCase(kBatchedMatmul, {2, 2})).kind, Applicability::Kind::kApplies);
  }
  // The dot and matrix-vector forms keep their own strategies.
  EXPECT_EQ(selected(opCase({{"op", "matmul"}, {"input", {16}}, {"other", {16}}}, {2, 2})).size(),
            4u);
}

TEST(OpStrategyCounts, ListedWithEveryOperandsShardingSequence) {
  const auto* s = byName(opCase(kBmm, {2, 2}), "Sb0Si1 = Sb0Si1 x Sb0");
  ASSERT_NE(s, nullptr);
  const auto seq = s->describe().at("sharding_sequences");
  EXPECT_EQ(seq.at("input"), "[S0, S1, R]");
  EXPECT_EQ(seq.at("other"), "[S0, R, R]");
  EXPECT_EQ(seq.at("output"), "[S0, S1, R]");
}

TEST(OpStrategyShapes, AShapeThatDoesNotDivideIsUnsupportedNamingTheDimension) {
  const nlohmann::json odd = {{"op", "addmm"}, {"input", {16, 30}}, {"other", {30, 16}}};
  const auto* s = byName(opCase(odd, {2, 2}), "RR = RS01 x S01R");
  ASSERT_NE(s, nullptr);
  const auto a = s->applies(opCase(odd, {2, 2}));
  EXPECT_EQ(a.kind, Applicability::Kind::kUnsupported);
  EXPECT_NE(a.reason.find("dimension 1 (size 30)"), std::string::npos) << a.reason;
  // A view that interleaves its shards names the input dimension.
  const nlohmann::json view = {{"op", "view"}, {"input", {8, 16}}, {"size", {128}}};
  const auto b = test::strategy("sharding/op/view/view(RS0)").applies(opCase(view, {2, 2}));
  EXPECT_EQ(b.kind, Applicability::Kind::kUnsupported);
  EXPECT_NE(b.reason.find("dimension 1"), std::string::npos) << b.reason;
  // A view whose shards ColossalAI keeps (S01 on the first dimension of the group (8, 16) ->
  // (2, 64) goes to the output's first dimension) gets ColossalAI's name for the case's shapes;
  // ours cuts the shards into both output dimensions, which ColossalAI's rule would refuse.
  const auto vc = opCase({{"op", "view"}, {"input", {8, 16}}, {"size", {2, 64}}}, {2, 2});
  harness::StrategyRegistry::global().expandFor(vc);
  const auto& v = test::strategy("sharding/op/view/view(S01R)");
  EXPECT_EQ(v.caseDetails(vc).value("colossalai_name", ""), "[S01, R] -> [S01, R]_5");
  EXPECT_EQ(v.applies(vc).kind, Applicability::Kind::kApplies);
  EXPECT_EQ(test::run(vc, v).status, harness::Status::kPass);
}

// Every strategy of each family's shapes on 2x2, seeds 3 and 11, random inputs: passes or is
// unsupported, with its peak predicted to the byte; every fault plantable in it, at the family's
// first shape, fails. Returns the runs and the faults planted.
std::pair<int, int> sweep(const std::vector<std::vector<nlohmann::json>>& shapes) {
  int runs = 0, faults = 0;
  for (const auto& family : shapes) {
    for (size_t k = 0; k < family.size(); ++k) {
      for (uint64_t seed : {3, 11}) {
        auto c = opCase(family[k], {2, 2});
        c.seed = seed;
        for (const auto* s : selected(c)) {
          if (s->applies(c).kind != Applicability::Kind::kApplies) continue;
          const auto rec = test::run(c, *s);
          EXPECT_TRUE(rec.status == Status::kPass || rec.status == Status::kUnsupported)
              << s->id() << " on " << family[k].dump() << ", seed " << seed << ": " << rec.message;
          // The memory model is exact at these shapes too (judged with tolerance 0).
          EXPECT_EQ(rec.mispredicted, "")
              << s->id() << " on " << family[k].dump() << ": " << rec.message;
          ++runs;
          if (k != 0 || seed != 3 || rec.status != Status::kPass) continue;
          for (const auto& fault : s->plantableFaults()) {
            const auto bad = s->withPlantedFault(fault);
            EXPECT_NE(bad, nullptr) << s->id() << " " << fault;
            if (!bad) continue;
            const auto planted = test::run(c, *bad);
            EXPECT_EQ(planted.status, Status::kFail)
                << s->id() << " with " << fault << " on " << family[k].dump() << " passed";
            ++faults;
          }
        }
      }
    }
  }
  std::cout << "[ sweep    ] " << runs << " strategy runs, " << faults
            << " planted faults, all failing\n";
  return {runs, faults};
}

// The tolerance holds at real shapes: every strategy of the products, the convolution and the
// normalisations at ColossalAI's own test shapes (conv2d: input 4x4x64x64, 16 output channels,
// kernel 3, padding 1, whose weight gradient sums 16,384 terms) and at shapes 4x larger, over
// two seeds, random inputs, passes or is unsupported; and every fault plantable in them, at the
// first shape, still fails. Before the reordered-sum bound 9 of conv2d's 16 strategies failed
// here, RR = RR x RR among them (a sum of 16,384 terms in another order, relative 3e-4).
TEST(OpTolerance, EveryStrategyPassesAtRealShapesAndEveryPlantedFaultStillFails) {
  const std::vector<std::vector<nlohmann::json>> shapes = {
      {{{"op", "conv2d"},
        {"input", {4, 4, 64, 64}},
        {"out_channels", 16},
        {"kernel", 3},
        {"padding", 1}},
       {{"op", "conv2d"},
        {"input", {4, 16, 64, 64}},
        {"out_channels", 32},
        {"kernel", 3},
        {"padding", 1}}},
      {{{"op", "addmm"}, {"input", {4, 8}}, {"other", {8, 16}}},
       {{"op", "addmm"}, {"input", {64, 256}}, {"other", {256, 64}}}},
      {{{"op", "bmm"}, {"input", {4, 8, 16}}, {"other", {4, 16, 8}}},
       {{"op", "bmm"}, {"input", {4, 32, 256}}, {"other", {4, 256, 32}}}},
      {{{"op", "matmul"}, {"input", {8, 16}}, {"other", {16}}},
       {{"op", "matmul"}, {"input", {64, 256}}, {"other", {256}}}},
      {{{"op", "layer_norm"}, {"input", {4, 16}}}, {{"op", "layer_norm"}, {"input", {64, 256}}}},
      {{{"op", "batch_norm"}, {"input", {4, 16, 64, 64}}},
       {{"op", "batch_norm"}, {"input", {16, 16, 64, 64}}}},
      {{{"op", "embedding"}, {"input", {4, 16}}, {"num_embeddings", 16}, {"embedding_dim", 32}},
       {{"op", "embedding"}, {"input", {16, 64}}, {"num_embeddings", 256}, {"embedding_dim", 128}}},
  };
  const auto [runs, faults] = sweep(shapes);
  EXPECT_GT(runs, 200);
  EXPECT_GT(faults, 40);
}

// The same at real shapes for every other operator: ColossalAI's pooling test shape
// (4x4x64x64) and elementwise, normalising and following operators at a transformer layer's
// [64, 256], each also 4-8x larger. Their arithmetic is the reference's on each piece, so no
// widened tolerance should be needed; a planted fault must still fail.
TEST(OpTolerance, PoolingAndElementwiseStrategiesPassAtRealShapes) {
  const std::vector<std::vector<nlohmann::json>> shapes = {
      {{{"op", "max_pool2d"}, {"input", {4, 4, 64, 64}}, {"kernel", 2}},
       {{"op", "max_pool2d"}, {"input", {16, 8, 64, 64}}, {"kernel", 2}}},
      {{{"op", "avg_pool2d"}, {"input", {4, 4, 64, 64}}, {"kernel", 2}},
       {{"op", "avg_pool2d"}, {"input", {16, 8, 64, 64}}, {"kernel", 2}}},
      {{{"op", "add"}, {"input", {64, 256}}, {"other", {256}}},
       {{"op", "add"}, {"input", {256, 512}}, {"other", {512}}}},
      {{{"op", "mul"}, {"input", {64, 256}}, {"other", {64, 256}}},
       {{"op", "mul"}, {"input", {256, 512}}, {"other", {256, 512}}}},
      {{{"op", "gelu"}, {"input", {64, 256}}}, {{"op", "gelu"}, {"input", {256, 512}}}},
      {{{"op", "relu"}, {"input", {64, 256}}}, {{"op", "relu"}, {"input", {256, 512}}}},
      {{{"op", "dropout"}, {"input", {64, 256}}, {"p", 0.25}},
       {{"op", "dropout"}, {"input", {256, 512}}, {"p", 0.25}}},
      {{{"op", "softmax"}, {"input", {64, 256}}, {"dim", -1}},
       {{"op", "softmax"}, {"input", {256, 512}}, {"dim", -1}}},
      {{{"op", "sum"}, {"input", {64, 256}}, {"dims", {0}}},
       {{"op", "sum"}, {"input", {256, 512}}, {"dims", {0}}}},
  };
  const auto [runs, faults] = sweep(shapes);
  EXPECT_GT(runs, 100);
  EXPECT_GT(faults, 20);
}

TEST(OpTolerance, ViewsPermutationsAndIndexingPassAtRealShapes) {
  const std::vector<std::vector<nlohmann::json>> shapes = {
      {{{"op", "view"}, {"input", {64, 256}}, {"size", {16384}}},
       {{"op", "view"}, {"input", {4, 64, 256}}, {"size", {256, 256}}}},
      {{{"op", "reshape"}, {"input", {64, 256}}, {"size", {128, 128}}},
       {{"op", "reshape"}, {"input", {256, 512}}, {"size", {512, 256}}}},
      {{{"op", "permute"}, {"input", {4, 64, 256}}, {"dims", {2, 0, 1}}},
       {{"op", "permute"}, {"input", {8, 128, 256}}, {"dims", {2, 0, 1}}}},
      {{{"op", "transpose"}, {"input", {64, 256}}, {"dim0", 0}, {"dim1", 1}},
       {{"op", "transpose"}, {"input", {256, 512}}, {"dim0", 0}, {"dim1", 1}}},
      {{{"op", "split"}, {"input", {64, 256}}, {"split_size", 128}, {"dim", 1}},
       {{"op", "split"}, {"input", {256, 512}}, {"split_size", 256}, {"dim", 1}}},
      {{{"op", "getitem"}, {"input", {4, 64, 256}}, {"index", 1}},
       {{"op", "getitem"}, {"input", {8, 128, 256}}, {"index", {2, 6}}}},
      {{{"op", "addmm"}, {"input", {64, 256}}, {"other", {256, 64}}, {"bias", {64, 64}}},
       {{"op", "addmm"}, {"input", {256, 512}}, {"other", {512, 256}}, {"bias", {256, 256}}}},
  };
  const auto [runs, faults] = sweep(shapes);
  EXPECT_GT(runs, 100);
  EXPECT_GT(faults, 20);
}

// Runs `name` on `c` with `fault` planted and expects `fail`.
void expectFails(const CaseSpec& c, const std::string& name, const std::string& fault) {
  const auto* s = byName(c, name);
  ASSERT_NE(s, nullptr);
  auto bad = s->withPlantedFault(fault);
  ASSERT_NE(bad, nullptr) << name << " cannot plant " << fault;
  const auto rec = test::run(c, *bad);
  EXPECT_EQ(rec.status, Status::kFail) << name << " with " << fault << ": " << rec.message;
  // The same strategy without the fault passes.
  const auto good = test::run(c, *s);
  EXPECT_EQ(good.status, Status::kPass) << name << ": " << good.message;
}

TEST(OpPlantedFault, LayerNormOverASplitHiddenDimWithoutTheStatisticsAllReduce) {
  expectFails(opCase({{"op", "layer_norm"}, {"input", {8, 32}}}, {2, 2}),
              "[R, S0] = [R, S0] x [S0]", "skip_stats_all_reduce");
}

TEST(OpPlantedFault, SynchronisedBatchNormWithoutTheStatisticsAllReduce) {
  expectFails(opCase(kBatchNorm, {2, 2}), "S0R = S0R x R WITH SYNC_BN", "skip_stats_all_reduce");
}

TEST(OpPlantedFault, SoftmaxOverAShardedDim) {
  expectFails(opCase({{"op", "softmax"}, {"input", {8, 16}}, {"dim", -1}}, {2, 2}),
              "[S0, R] -> [S0, R]_1", "softmax_over_sharded_dim");
}

TEST(OpPlantedFault, VocabularySplitEmbeddingThatDoesNotMaskForeignIds) {
  expectFails(opCase(kEmbedding, {2, 2}), "RR = R x S0R", "skip_vocab_mask");
}

TEST(OpPlantedFault, BmmWithTheBatchSplitOnOneOperandOnly) {
  expectFails(opCase(kBmm, {2, 2}), "Sb01 = Sb01 x Sb01", "batch_split_one_operand");
}

// The batched matmul's batch or heads split on the input alone: every rank multiplies its
// queries by the first rank's keys.
TEST(OpPlantedFault, BatchedMatmulWithTheBatchOrTheHeadsSplitOnOneOperandOnly) {
  expectFails(opCase(kBatchedMatmul, {2, 2}), "S1S0RR = S1S0RR x S1S0RR",
              "batch_split_one_operand");
  expectFails(opCase(kBatchedMatmul, {2, 2}), "S1S0RR = S1S0RR x S1S0RR",
              "heads_split_one_operand");
  expectFails(opCase(kBatchedMatmul, {2, 2}), "RS0RRP1 = RS0RS1 x RS0S1R",
              "skip_output_all_reduce");
  expectFails(opCase(kBatchedMatmul, {2, 2, 2}), "S2S0RS1 = S2S0RR x S2S0RS1",
              "heads_split_one_operand");
}

TEST(OpPlantedFault, DropoutMasksThatDifferPerRankOnAReplicatedTensor) {
  expectFails(opCase({{"op", "dropout"}, {"input", {8, 16}}, {"p", 0.25}}, {2, 2}),
              "[R, R] -> [R, R]_0", "per_rank_dropout_seed");
}

TEST(OpPlantedFault, MissingAllReducesOfPartialOutputsAndGradients) {
  expectFails(opCase(kAddmm, {2, 2}), "RR = RS01 x S01R", "skip_output_all_reduce");
  expectFails(opCase(kAddmm, {2, 2}), "S0S1 = S0R x RS1", "skip_grad_all_reduce");
  expectFails(opCase({{"op", "sum"}, {"input", {8, 16}}, {"dims", {0}}}, {2, 2}),
              "[S0, R] -> [R]_1", "skip_output_all_reduce");
}

// On 2x2x2 (the expansion's strategies): each communication the composed layouts imply is
// needed; dropped, the row fails. Sums over two axes of three, statistics over a hidden
// dimension split twice, a vocabulary split beside split ids and embedding columns, a bmm's
// batch split over two axes, synchronised batch norm with one channel a rank.
TEST(OpPlantedFault, ThreeAxisStrategiesMissingTheirCommunicationFail) {
  const std::vector<int64_t> mesh = {2, 2, 2};
  expectFails(opCase(kAddmm, mesh), "S1RP02 = S1S02 x S02R x R", "skip_output_all_reduce");
  expectFails(opCase(kAddmm, mesh), "S0S12 = S0R x RS12 x S12", "skip_grad_all_reduce");
  expectFails(opCase({{"op", "layer_norm"}, {"input", {8, 32}}}, mesh), "S0S12 = S0S12 x S12 x S12",
              "skip_stats_all_reduce");
  expectFails(opCase(kEmbedding, mesh), "S0RRS1P2 = S0RR x S2S1", "skip_vocab_mask");
  expectFails(opCase(kBmm, mesh), "S01S2R = S01S2R x S01RR", "batch_split_one_operand");
  expectFails(opCase(kBatchNorm, mesh), "S0S12RR = S0S12RR x S12 x S12", "skip_stats_all_reduce");
}

CaseSpec blockCase(std::vector<int64_t> mesh) {
  CaseSpec c = opCase({}, std::move(mesh));
  c.workload = "transformer_block";
  c.shape = {{"batch", 4}, {"seq", 8}, {"d_model", 32}, {"heads", 8}, {"dropout", 0.25}};
  return c;
}

const harness::Strategy& megatron(bool sequenceParallel) {
  const auto* s = harness::StrategyRegistry::global().find(
      sequenceParallel ? "sharding/megatron/tp_sp" : "sharding/megatron/tp");
  EXPECT_NE(s, nullptr);
  return *s;
}

TEST(Megatron, TensorAndSequenceParallelBlocksMatchTheReferenceWithDropout) {
  for (const auto& mesh : std::vector<std::vector<int64_t>>{{2}, {4}, {2, 2}}) {
    for (bool sp : {false, true}) {
      const auto rec = test::run(blockCase(mesh), megatron(sp));
      EXPECT_EQ(rec.status, Status::kPass)
          << (sp ? "tp_sp" : "tp") << " on " << mesh.size() << "-D: " << rec.message;
      EXPECT_EQ(*rec.commBytes, *rec.predictedCommBytes);
      ASSERT_TRUE(rec.predictedMemBytes.has_value());
      EXPECT_EQ(*rec.predictedMemBytes, rec.peakMemBytes) << (sp ? "tp_sp" : "tp");
    }
  }
}

TEST(Megatron, AllReduceWhereSequenceParallelReduceScattersFailsOnCommunication) {
  // Numerically right (the all-reduce of the whole, then this rank's shard), but double the
  // wire bytes: the counted collectives are not the predicted ones.
  auto bad = megatron(true).withPlantedFault("all_reduce_instead_of_reduce_scatter");
  ASSERT_NE(bad, nullptr);
  // The strategy's prediction is the correct one: compare against the unfaulted strategy's.
  const auto rec = test::run(blockCase({4}), *bad);
  EXPECT_EQ(rec.status, Status::kFail) << rec.message;
  EXPECT_EQ(*rec.mismatches, 0) << "the numbers are right: only the communication is wrong";
  EXPECT_NE(rec.message.find("communicated"), std::string::npos) << rec.message;
}

TEST(Megatron, MissingForwardAllReduceAndSharedGradientAllReduceFail) {
  auto a = megatron(false).withPlantedFault("skip_forward_all_reduce");
  EXPECT_EQ(test::run(blockCase({2}), *a).status, Status::kFail);
  auto b = megatron(true).withPlantedFault("skip_shared_grad_all_reduce");
  EXPECT_EQ(test::run(blockCase({2}), *b).status, Status::kFail);
}

TEST(OpMemoryModel, PredictedPeakIsTheMeasuredPeak) {
  // One strategy of each kind of model; the suite checks every row.
  const std::vector<std::pair<CaseSpec, std::string>> rows = {
      {opCase(kAddmm, {2, 2}), "S0R = S0S1 x S1R"},
      {opCase(kEmbedding, {2, 2}), "RR = R x S01R"},
      {opCase({{"op", "layer_norm"}, {"input", {8, 32}}}, {2, 2}), "[S0, S1] = [S0, S1] x [S1]"},
      {opCase(kBatchNorm, {2, 2}), "S0S1 = S0S1 x S1 WITH SYNC_BN"},
      {opCase(kConv, {2, 2}), "S0R = S0S1 x S1R"},
      {opCase({{"op", "dropout"}, {"input", {8, 16}}, {"p", 0.25}}, {2, 2}),
       "[S0, S1] -> [S0, S1]_6"},
  };
  for (const auto& [c, name] : rows) {
    const auto* s = byName(c, name);
    ASSERT_NE(s, nullptr);
    const auto rec = test::run(c, *s);
    ASSERT_EQ(rec.status, Status::kPass) << name << ": " << rec.message;
    ASSERT_TRUE(rec.predictedMemBytes.has_value()) << name;
    EXPECT_EQ(*rec.predictedMemBytes, rec.peakMemBytes) << name;
  }
}

}  // namespace
}  // namespace sb::strategies
