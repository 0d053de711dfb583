// Selective checkpointing's policies and its recompute model (strategies/checkpointing/sac/):
// which node each built-in keeps, what a policy of one's own decides and refuses, and the flops
// the model predicts, against closed forms.

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>

#include "reference/graph.h"
#include "strategies/checkpointing/sac/policy.h"
#include "strategies/checkpointing/sac/sac_runtime.h"
#include "strategies/sharding/auto/model.h"

namespace sb::strategies::sac {
namespace {

using reference::Graph;

std::map<std::string, bool> decisions(const Graph& g, const nlohmann::json& spec) {
  const Policy p = resolvePolicy(g, spec);
  std::map<std::string, bool> out;
  for (size_t v = 0; v < g.nodes.size(); ++v) out[g.nodes[v].name] = p.save[v];
  return out;
}

TEST(SacPolicy, TorchtitanKeepsEveryOtherLinearAndAttentionPerBlock) {
  const Graph g = reference::buildGraph(
      "llama", {{"layers", 2}, {"heads", 4}, {"kv_heads", 2}, {"d_model", 32}, {"ffn", 64}});
  const auto d = decisions(g, "torchtitan");
  for (const std::string h : {"h0.", "h1."}) {
    // torchtitan's count per block: the 1st, 3rd, 5th and 7th linear kept.
    EXPECT_TRUE(d.at(h + "attn.q"));
    EXPECT_FALSE(d.at(h + "attn.k"));
    EXPECT_TRUE(d.at(h + "attn.v"));
    EXPECT_FALSE(d.at(h + "attn.proj"));
    EXPECT_TRUE(d.at(h + "mlp.gate"));
    EXPECT_FALSE(d.at(h + "mlp.up"));
    EXPECT_TRUE(d.at(h + "mlp.down"));
    EXPECT_FALSE(d.at(h + "ln_1"));  // a norm: recomputed
    EXPECT_FALSE(d.at(h + "mlp.silu"));
  }
  // Outside the blocks everything is kept.
  for (const auto& n : g.nodes) {
    if (n.layer < 0) {
      EXPECT_TRUE(d.at(n.name)) << n.name;
    }
  }
}

TEST(SacPolicy, ViewsTakeTheDecisionOfWhatTheyView) {
  const Graph g = reference::buildGraph("gpt2", {{"layers", 1}});
  const auto d = decisions(g, "torchtitan");
  // q is kept (the first linear), k recomputed (the second): their heads' views follow.
  EXPECT_TRUE(d.at("h0.attn.q_view"));
  EXPECT_TRUE(d.at("h0.attn.q_heads"));
  EXPECT_FALSE(d.at("h0.attn.k_view"));
  EXPECT_FALSE(d.at("h0.attn.k_heads"));
  // A policy that recomputes every view by name changes nothing: views are not decided alone.
  const auto e = decisions(g, {{"ops", {{"view", "recompute"}, {"permute", "recompute"}}}});
  EXPECT_TRUE(e.at("h0.attn.q_view"));
  EXPECT_TRUE(e.at("h0.attn.q_heads"));
}

TEST(SacPolicy, TheMostSpecificRuleWins) {
  const Graph g = reference::buildGraph("gpt2", {{"layers", 2}});
  const auto d = decisions(g, {{"default", "recompute"},
                               {"ops", {{"addmm", "save"}}},
                               {"nodes", {{"h1\\.mlp\\.fc", "recompute"}}}});
  EXPECT_FALSE(d.at("h0.ln_1"));
  EXPECT_TRUE(d.at("h0.mlp.fc"));
  EXPECT_FALSE(d.at("h1.mlp.fc"));
  EXPECT_TRUE(d.at("h1.mlp.proj"));
  EXPECT_TRUE(d.at("ln_f"));  // outside the blocks: kept whatever the default
}

TEST(SacPolicy, MalformedPoliciesAreRefusedNamingTheKey) {
  const Graph g = reference::buildGraph("gpt2", {{"layers", 1}});
  const auto refused = [&](const nlohmann::json& spec, const std::string& want) {
    try {
      resolvePolicy(g, spec);
      ADD_FAILURE() << spec.dump() << " was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  refused("sometimes", "unknown policy \"sometimes\"");
  refused(3, "expected a policy's name or an object");
  refused({{"ops", {{"gelu", true}}}}, "policy.ops.gelu: expected \"save\" or \"recompute\"");
  refused({{"ops", {{"silu", "save"}}}}, "\"silu\" is no operator of gpt2's graph");
  refused({{"nodes", {{"h0\\.(", "save"}}}}, "policy.nodes");
  refused({{"nodes", {{"h7\\..*", "save"}}}}, "matches no node");
  refused({{"nodes", {{"h0\\..*", "save"}, {"h0\\.mlp\\..*", "recompute"}}}}, "both match");
  refused({{"default", "save"}, {"budget", 3}}, "unknown key \"budget\"");
}

TEST(SacRecomputeModel, FlopsInClosedForm) {
  // The residual MLP: per block fc [B, D] x [D, 4D] and proj [B, 4D] x [4D, D], 2 B D 4D each.
  const int64_t B = 8, D = 16, L = 3;
  const autoshard::ShardingModel m(
      reference::buildGraph("mlp", {{"batch", B}, {"d_model", D}, {"layers", L}}), {1},
      autoshard::CostOptions{});
  autoshard::SolveOptions o;
  o.algo = "replicated";
  const auto plan = autoshard::solvePlan(m, o);
  const double perProduct = 2.0 * B * D * 4 * D;
  const auto model = [&](const nlohmann::json& spec) {
    return modelRecompute(m, plan.choice, resolvePolicy(m.graph(), spec));
  };
  const RecomputeModel all = model("recompute-all");
  EXPECT_EQ(all.forwardFlops, 2 * L * perProduct);
  // Backward: the weights' gradients everywhere, the input's wherever the input takes one (the
  // first block's input is data).
  EXPECT_EQ(all.backwardFlops, (2 * L + 2 * L - 1) * perProduct);
  // recompute-all: each block's products again, but its last (the block's output is not saved
  // by the next: an add saves nothing; proj's output is read by no saving node).
  EXPECT_EQ(all.recomputeFlops, L * perProduct);
  EXPECT_EQ(model("save-all").recomputeFlops, 0);
  EXPECT_FALSE(model("save-all").savedTwice);
  // cheap: gelu recomputed from fc's kept output: no product again.
  EXPECT_EQ(model("cheap").recomputeFlops, 0);
  // torchtitan: fc kept, proj recomputed; nothing reads proj's output to save it.
  EXPECT_EQ(model("torchtitan").recomputeFlops, 0);
}

TEST(SacRecomputeModel, EachRankCountsItsPiecesInADataParallelPlan) {
  // The residual MLP's batch split over 4 ranks: each rank's products a quarter of the whole.
  const int64_t B = 16, D = 16, L = 2, R = 4;
  const autoshard::ShardingModel m(
      reference::buildGraph("mlp", {{"batch", B}, {"d_model", D}, {"layers", L}}), {R},
      autoshard::CostOptions{});
  autoshard::SolveOptions o;
  o.algo = "data-parallel";
  const auto plan = autoshard::solvePlan(m, o);
  const double perProduct = 2.0 * (B / R) * D * 4 * D;
  for (int rank = 0; rank < R; ++rank) {
    const RecomputeModel all =
        modelRecompute(m, plan.choice, resolvePolicy(m.graph(), "recompute-all"), rank);
    EXPECT_EQ(all.forwardFlops, 2 * L * perProduct) << "rank " << rank;
    EXPECT_EQ(all.recomputeFlops, L * perProduct) << "rank " << rank;
  }
}

// The search priced with a policy (model.h's RecomputePricing): a recomputed node's forward paid
// again in the step's prediction, the rows' peak lower where the policy drops what blocks save,
// nothing changed by a policy that keeps everything.
TEST(SacPricing, TheStepPaysTheRecomputationAndTheRowsDropTheBlocksTensors) {
  const auto build = [] {
    return std::make_unique<autoshard::ShardingModel>(
        reference::buildGraph("gpt2", {{"batch", 16}, {"seq", 32}, {"d_model", 32}, {"heads", 4},
                                       {"layers", 2}, {"vocab", 64}}),
        std::vector<int64_t>{4}, autoshard::CostOptions{});
  };
  const auto plain = build();
  autoshard::SolveOptions o;
  o.algo = "data-parallel";
  const auto plan = autoshard::solvePlan(*plain, o);
  const auto priced = [&](const std::string& name) {
    auto m = build();
    const Policy p = resolvePolicy(m->graph(), name);
    auto pricing = std::make_shared<autoshard::RecomputePricing>();
    pricing->policy = name;
    pricing->save = p.save;
    pricing->region = p.region;
    pricing->recomputed = modelRecompute(*m, plan.choice, p).recomputed;
    m->priceRecompute(pricing);
    return m;
  };
  const auto keep = priced("save-all");
  EXPECT_DOUBLE_EQ(keep->stepUs(plan.choice), plain->stepUs(plan.choice));
  EXPECT_EQ(keep->peakBytes(plan.choice), plain->peakBytes(plan.choice));
  const auto all = priced("recompute-all");
  // Data parallel: no recomputed node reads through a redistribution, so the step pays exactly
  // the recomputed nodes' forwards again.
  double again = 0;
  const auto* rp = all->recomputePricing();
  for (size_t v = 0; v < rp->recomputed.size(); ++v) {
    if (rp->recomputed[v]) again += all->candidates(static_cast<int>(v))[plan.choice[v]].forwardUs;
  }
  EXPECT_GT(again, 0);
  EXPECT_NEAR(all->stepUs(plan.choice), plain->stepUs(plan.choice) + again, 1e-6);
  EXPECT_LT(all->peakBytes(plan.choice), plain->peakBytes(plan.choice));
  // A matmul's forward again is one of its three products' time and less than the node's step.
  for (size_t v = 0; v < all->graph().nodes.size(); ++v) {
    const auto& c = all->candidates(static_cast<int>(v))[plan.choice[v]];
    EXPECT_LE(c.forwardUs, c.us()) << all->graph().nodes[v].name;
  }
}

}  // namespace
}  // namespace sb::strategies::sac
