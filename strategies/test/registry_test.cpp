// The registry holds every built-in strategy under the names the seeds use.

#include <gtest/gtest.h>

#include <set>

#include "harness/registry.h"
#include "strategies/test/test_util.h"

namespace sb::strategies {
namespace {

using harness::Applicability;
using harness::StrategyRegistry;

// The 24 names ColossalAI's linear handler test asserts for input [4, 4, 4, 16] on a 2x2 mesh
// (seed 000), copied from the seed.
const std::vector<std::string> kSeedNames = {
    "S0S1 = S0R x RS1_0", "S0S1 = S0R x RS1_1", "S0S1 = S0R x RS1_2", "S1S0 = S1R x RS0_0",
    "S1S0 = S1R x RS0_1", "S1S0 = S1R x RS0_2", "S0R = S0S1 x S1R_0", "S0R = S0S1 x S1R_1",
    "S0R = S0S1 x S1R_2", "S1R = S1S0 x S0R_0", "S1R = S1S0 x S0R_1", "S1R = S1S0 x S0R_2",
    "RS0 = RS1 x S1S0",   "RS1 = RS0 x S0S1",   "RR = RS0 x S0R",     "RR = RS1 x S1R",
    "RS0 = RR x RS0",     "RS1 = RR x RS1",     "S01R = S01R x RR_0", "S01R = S01R x RR_1",
    "S01R = S01R x RR_2", "RR = RS01 x S01R",   "RS01 = RR x RS01",   "RR = RR x RR"};

std::vector<const harness::Strategy*> selected(const harness::CaseSpec& c,
                                               Applicability::Kind kind) {
  std::vector<const harness::Strategy*> out;
  for (const auto* s : StrategyRegistry::global().all()) {
    if (s->applies(c).kind == kind) out.push_back(s);
  }
  return out;
}

std::set<std::string> names(const std::vector<const harness::Strategy*>& v) {
  std::set<std::string> out;
  for (const auto* s : v) out.insert(s->displayName());
  return out;
}

TEST(Registry, EveryBuiltInStrategyIsRegisteredOnceWithAUniqueId) {
  // Generated per case (sharding/redistribute/..., and sharding/op/... for shapes other than
  // the canonical ones) once a test has planned such a case: counted by the op tests and by
  // `list` in the CLI test.
  std::vector<const harness::Strategy*> all;
  for (const auto* s : StrategyRegistry::global().all()) {
    if (s->id().rfind("sharding/redistribute/", 0) != 0 && s->id().rfind("sharding/op/", 0) != 0) {
      all.push_back(s);
    }
  }
  std::set<std::string> ids;
  for (const auto* s : all) EXPECT_TRUE(ids.insert(s->id()).second) << s->id();
  // 24 from the 2-D generator (15 of them batch-split variants), 3 1-D data-parallel variants,
  // 4 ShardedTensor strategies; one checkpointing strategy per solver; four chunked regions,
  // the searched chunk plan and the online-softmax attention; the pair update chunked over rows and
  // over columns; 14 ShardedTensor reshards and reshuffles (2 x 2 dimension pairs x 4 placement
  // pairs, less the 2 that move nothing); Megatron's tensor- and tensor + sequence-parallel blocks;
  // the whole-model plans of the four auto-sharding algorithms and the plan read from a file;
  // the five FSDP kinds (ddp, zero1, zero2, zero3, hsdp); the three context-parallel variants
  // (ring/p2p, ring/allgather, ulysses); the five pipeline schedules (gpipe, 1f1b,
  // interleaved-1f1b, zb-h1, and one read from a CSV); PyTorch's own strategies run in Python
  // ranks (torch/: ddp, fsdp2, fsdp2-keep, hsdp, tp, sp, checkpoint, sac, five pipeline
  // schedules and one read from a CSV, context_parallel, torchtitan's composition, expert
  // parallelism on a PyTorch MoE layer, and a user's file); expert parallelism (sharding/moe/ep);
  // selective checkpointing's four built-in policies, the policy from params and the budget
  // solver's (checkpointing/sac/).
  EXPECT_EQ(all.size(), 104u);
  for (const char* id :
       {"pipeline/gpipe", "pipeline/1f1b", "pipeline/interleaved-1f1b", "pipeline/zb-h1",
        "pipeline/csv", "torch/fsdp2", "torch/compose", "torch/pipeline-zbv", "torch/pipeline-csv",
        "torch/file", "torch/ep", "sharding/moe/ep", "checkpointing/sac/torchtitan",
        "checkpointing/sac/policy"}) {
    EXPECT_NE(StrategyRegistry::global().find(id), nullptr) << id;
  }
  ASSERT_EQ(StrategyRegistry::global().generators().size(), 3u);
  std::set<std::string> patterns;
  for (const auto& g : StrategyRegistry::global().generators()) patterns.insert(g.idPattern);
  EXPECT_EQ(patterns, (std::set<std::string>{"sharding/redistribute/<from>-><to>",
                                             "sharding/op/<op>/<strategy>",
                                             "torch/dtensor/linear/<input>x<weight>x<bias>"}));
  for (const char* id : {"chunking/attention/seq", "chunking/ffn/seq", "chunking/block/seq",
                         "chunking/attention/online"}) {
    EXPECT_NE(StrategyRegistry::global().find(id), nullptr) << id;
  }
  for (const char* id :
       {"sharding/auto/ilp", "sharding/auto/megatron", "sharding/auto/data-parallel",
        "sharding/auto/replicated", "sharding/plan"}) {
    EXPECT_NE(StrategyRegistry::global().find(id), nullptr) << id;
  }
  for (const char* id : {"checkpointing/none", "checkpointing/full", "checkpointing/sqrt",
                         "checkpointing/greedy", "checkpointing/revolve", "checkpointing/rotor"}) {
    EXPECT_NE(StrategyRegistry::global().find(id), nullptr) << id;
  }
}

TEST(Registry, TheSeedsTwentyFourStrategiesApplyToInput4x4x4x16OnA2x2Mesh) {
  const auto c = test::linearCase({4, 4, 4, 16}, 32, {2, 2});
  const auto applies = selected(c, Applicability::Kind::kApplies);
  EXPECT_EQ(names(applies), std::set<std::string>(kSeedNames.begin(), kSeedNames.end()));
  EXPECT_EQ(applies.size(), 24u);
}

TEST(Registry, NineteenApplyToInput1x4x4x16AndTheFiveDim0SplitsAreUnsupported) {
  const auto c = test::linearCase({1, 4, 4, 16}, 32, {2, 2});
  EXPECT_EQ(selected(c, Applicability::Kind::kApplies).size(), 19u);
  const auto unsupported = selected(c, Applicability::Kind::kUnsupported);
  ASSERT_EQ(unsupported.size(), 5u);
  for (const auto* s : unsupported) {
    EXPECT_EQ(s->displayName().substr(s->displayName().size() - 2), "_0") << s->displayName();
    EXPECT_NE(s->applies(c).reason.find("input dimension 0 has size 1"), std::string::npos);
  }
}

TEST(Registry, FourteenApplyToA2DInput) {
  const auto c = test::linearCase({64, 16}, 32, {2, 2});
  const auto applies = selected(c, Applicability::Kind::kApplies);
  EXPECT_EQ(applies.size(), 14u);
  EXPECT_TRUE(selected(c, Applicability::Kind::kUnsupported).empty());
}

TEST(Registry, OnA1DMeshTheOneAxisStrategiesAndShardedTensorApply) {
  const auto c = test::linearCase({4, 4, 4, 16}, 32, {4});
  EXPECT_EQ(names(selected(c, Applicability::Kind::kApplies)),
            (std::set<std::string>{"S0R = S0R x RR_0", "S0R = S0R x RR_1", "S0R = S0R x RR_2",
                                   "RR = RS0 x S0R", "RS0 = RR x RS0", "RR = RR x RR",
                                   "ShardedTensor colwise", "ShardedTensor rowwise",
                                   "ShardedTensor colwise placements=[2,0,3,1]",
                                   "ShardedTensor rowwise placements=[2,0,3,1]"}));
}

// A strategy that runs one forward and backward is never run on a training case: it is an
// `unsupported` row saying what trains instead, and one that trains applies as it would.
TEST(Registry, AOneStepStrategyIsUnsupportedOnACaseWithStepsAndSaysWhatTrains) {
  harness::CaseSpec c = test::linearCase({8, 16}, 32, {4});
  c.training.steps = 3;
  const auto& oneStep = test::strategy("sharding/linear/sharded_tensor/colwise");
  ASSERT_FALSE(oneStep.trainsSteps());
  // The mesh strategies of the same workload train.
  EXPECT_EQ(harness::applicabilityOf(test::strategy("sharding/linear/S0R=S0R.RR/0"), c).kind,
            Applicability::Kind::kApplies);
  const Applicability a = harness::applicabilityOf(oneStep, c);
  EXPECT_EQ(a.kind, Applicability::Kind::kUnsupported);
  EXPECT_NE(a.reason.find("steps: 3"), std::string::npos) << a.reason;
  EXPECT_NE(a.reason.find("sharding/fsdp/*"), std::string::npos) << a.reason;
  c.training.steps = 0;
  EXPECT_EQ(harness::applicabilityOf(oneStep, c).kind, Applicability::Kind::kApplies);
  // Another workload's strategy stays unselected, steps or not.
  c.training.steps = 3;
  EXPECT_EQ(harness::applicabilityOf(test::strategy("checkpointing/rotor"), c).kind,
            Applicability::Kind::kNotApplicable);
  // One that could not run the case even once says why itself, not that it does not train.
  c.mesh = {3};
  const Applicability own = harness::applicabilityOf(oneStep, c);
  EXPECT_EQ(own.kind, Applicability::Kind::kUnsupported);
  EXPECT_NE(own.reason.find("does not split evenly over 3 ranks"), std::string::npos) << own.reason;
}

// Every key a strategy reads (caseParams) is checked by the strategy itself before it says
// whether it runs a case: a value no key takes (an object of a control-character key holding
// nested nulls) is bad input naming the key, for every strategy, whatever the case.
TEST(Registry, EveryStrategyRefusesAMalformedValueOfEveryKeyItReads) {
  const nlohmann::json malformed = {{"\x01", {{nullptr}}}};
  int keys = 0;
  for (const auto* s : StrategyRegistry::global().all()) {
    for (const auto& key : s->caseParams()) {
      harness::CaseSpec c = test::linearCase({8, 16}, 32, {2, 2});
      c.params = {{key, malformed}};
      ++keys;
      try {
        s->checkParams(c);
        ADD_FAILURE() << s->id() << " accepts params." << key << " = " << malformed.dump();
      } catch (const harness::InputError& e) {
        EXPECT_NE(std::string(e.what()).find(key), std::string::npos)
            << s->id() << ": the message names no key: " << e.what();
      } catch (const std::exception& e) {
        ADD_FAILURE() << s->id() << ": params." << key
                      << " is not refused as bad input: " << e.what();
      }
    }
  }
  EXPECT_GT(keys, 100) << "the registry's strategies read few keys";
}

// The check runs before applies(): a malformed value is bad input where the strategy could not
// run the case (an `unsupported` row would hide it under a pattern), and dropped only where the
// case is of another kind, whose strategies may read the key in their own way.
TEST(Registry, AMalformedValueIsBadInputWhereTheCaseIsOfTheStrategysKindOnly) {
  const auto& rotor = test::strategy("checkpointing/rotor");
  harness::CaseSpec chain = test::linearCase({1, 1}, 1, {2});
  chain.workload = "mlp_chain";
  chain.shape = {{"batch", 8}, {"width", 16}, {"depth", 4}};
  ASSERT_EQ(harness::applicabilityOf(rotor, chain).kind, Applicability::Kind::kUnsupported)
      << "checkpointing runs on one rank";
  chain.params = {{"budget", "half"}};
  EXPECT_THROW(harness::applicabilityOf(rotor, chain), harness::InputError);
  harness::CaseSpec linear = test::linearCase({8, 16}, 32, {2});
  linear.params = {{"budget", "half"}};
  EXPECT_EQ(harness::applicabilityOf(rotor, linear).kind, Applicability::Kind::kNotApplicable);
}

// A row's family is the page its strategy is documented on (docs/cli.md, "list"): stratbench's
// own strategies by their id's folder, PyTorch's (torch/) by what they run. A new strategy filed
// under the wrong family fails here, not in a report's counts.
TEST(Registry, EveryStrategysFamilyIsThePageItIsDocumentedOn) {
  const std::vector<std::pair<std::string, std::string>> byPrefix = {
      {"sharding/fsdp/", "fsdp"},
      {"sharding/cp/", "cp"},
      {"sharding/moe/", "moe"},
      {"pipeline/", "pipeline"},
      {"chunking/", "chunking"},
      {"checkpointing/", "checkpointing"},
      {"torch/ddp", "fsdp"},
      {"torch/fsdp2", "fsdp"},
      {"torch/hsdp", "fsdp"},
      {"torch/pipeline-", "pipeline"},
      {"torch/cp", "cp"},
      {"torch/ep", "moe"},
      {"torch/compose", "compose"},
      {"torch/checkpoint", "checkpointing"},
      {"torch/sac", "checkpointing"},
      {"torch/tp", "sharding"},
      {"torch/sp", "sharding"},
      {"torch/dtensor/", "sharding"},
      {"sharding/", "sharding"}};
  std::set<std::string> seen;
  for (const auto* s : StrategyRegistry::global().all()) {
    for (const auto& [prefix, family] : byPrefix) {
      if (s->id().rfind(prefix, 0) != 0) continue;
      EXPECT_EQ(harness::familyName(s->family()), family) << s->id();
      seen.insert(family);
      break;
    }
  }
  // Every family has a built-in strategy (compose: torch/compose).
  for (const auto& f : harness::familyNames()) EXPECT_TRUE(seen.count(f)) << f;
}

TEST(Registry, ListDescribesShardingSequencesForEveryOperand) {
  const auto* s = StrategyRegistry::global().find("sharding/linear/S01R=S01R.RR/0");
  ASSERT_NE(s, nullptr);
  const auto d = s->describe();
  EXPECT_EQ(d["sharding_sequences"]["input"], (std::vector<std::string>{"S01", "R", "R", "R"}));
  EXPECT_EQ(d["sharding_sequences"]["weight"], (std::vector<std::string>{"R", "R"}));
  EXPECT_EQ(d["sharding_sequences"]["output"], (std::vector<std::string>{"S01", "R", "R", "R"}));
  // ColossalAI's consistency rules between operands hold for every 2-D strategy.
  for (const auto* st : StrategyRegistry::global().matching("sharding/linear/[^s].*")) {
    const auto seq = st->describe()["sharding_sequences"];
    const auto in = seq["input"].get<std::vector<std::string>>();
    const auto w = seq["weight"].get<std::vector<std::string>>();
    const auto out = seq["output"].get<std::vector<std::string>>();
    EXPECT_EQ(std::vector<std::string>(in.begin(), in.end() - 1),
              std::vector<std::string>(out.begin(), out.end() - 1))
        << st->id();
    EXPECT_EQ(w[1], in.back()) << st->id();
    EXPECT_EQ(w[0], out.back()) << st->id();
  }
}

// Plugins (harness/plugin_loader.cpp) register through held registrations: nothing of a plugin
// runs before its API version is checked, and a plugin is added whole or not at all.
namespace plugins {

class Named final : public harness::SingleRankStrategy {
 public:
  explicit Named(const std::string& id) : SingleRankStrategy(id, id, harness::Family::kChunking) {}
  Applicability applies(const harness::CaseSpec&) const override {
    return Applicability::notApplicable("test strategy");
  }
  std::unique_ptr<harness::RankExecutor> makeExecutor(const harness::CaseSpec&) const override {
    return nullptr;
  }
};

StrategyRegistry::Maker maker(std::vector<std::string> ids, int* calls) {
  return [ids, calls] {
    ++*calls;
    std::vector<std::unique_ptr<harness::Strategy>> out;
    for (const auto& id : ids) out.push_back(std::make_unique<Named>(id));
    return out;
  };
}

TEST(PluginRegistration, HeldMakersRunOnlyAtCommitAndRecordTheirOrigin) {
  StrategyRegistry r;
  r.add(std::make_unique<Named>("built/in"));
  int calls = 0;
  r.holdRegistrations();
  r.hold(maker({"mine/a", "mine/b"}, &calls));
  EXPECT_EQ(calls, 0);
  EXPECT_EQ(r.find("mine/a"), nullptr);
  const auto ids = r.commitHeld("/plugins/libmine.so");
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(ids, (std::vector<std::string>{"mine/a", "mine/b"}));
  ASSERT_NE(r.find("mine/b"), nullptr);
  EXPECT_EQ(r.originOf("mine/a"), "/plugins/libmine.so");
  EXPECT_EQ(r.originOf("built/in"), "built-in");
  EXPECT_FALSE(r.holding());
}

TEST(PluginRegistration, ADuplicateIdRefusesThePluginWholeNamingWhereTheFirstCameFrom) {
  StrategyRegistry r;
  int calls = 0;
  r.holdRegistrations();
  r.hold(maker({"mine/a"}, &calls));
  r.commitHeld("/p/libfirst.so");
  r.holdRegistrations();
  r.hold(maker({"mine/new", "mine/a"}, &calls));
  try {
    r.commitHeld("/p/libsecond.so");
    FAIL() << "a duplicate id was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("'mine/a' is already registered (/p/libfirst.so)"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(r.find("mine/new"), nullptr) << "part of a refused plugin was added";
  EXPECT_EQ(r.all().size(), 1u);

  r.holdRegistrations();
  r.hold(maker({"mine/twice"}, &calls));
  r.hold(maker({"mine/twice"}, &calls));
  EXPECT_THROW(r.commitHeld("/p/libthird.so"), std::invalid_argument);
  EXPECT_EQ(r.find("mine/twice"), nullptr);
}

// A plugin built against a later header may name a family this binary does not know: refused,
// naming the strategy and the number, not an assertion when `list` prints it.
class OfFamily final : public harness::SingleRankStrategy {
 public:
  OfFamily(const std::string& id, int family)
      : SingleRankStrategy(id, id, static_cast<harness::Family>(family)) {}
  Applicability applies(const harness::CaseSpec&) const override {
    return Applicability::notApplicable("test strategy");
  }
  std::unique_ptr<harness::RankExecutor> makeExecutor(const harness::CaseSpec&) const override {
    return nullptr;
  }
};

TEST(PluginRegistration, AFamilyThisBinaryDoesNotKnowRefusesThePlugin) {
  StrategyRegistry r;
  r.holdRegistrations();
  const int unknown = static_cast<int>(harness::familyNames().size());
  r.hold([unknown] {
    std::vector<std::unique_ptr<harness::Strategy>> out;
    out.push_back(std::make_unique<OfFamily>("mine/ok", 0));
    out.push_back(std::make_unique<OfFamily>("mine/later", unknown));
    return out;
  });
  try {
    r.commitHeld("/p/libnew.so");
    FAIL() << "a family this binary does not know was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("'mine/later' names family " + std::to_string(unknown)),
              std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(r.all().empty()) << "part of a refused plugin was added";
}

TEST(PluginRegistration, DroppedRegistrationsNeverRun) {
  StrategyRegistry r;
  int calls = 0;
  r.holdRegistrations();
  r.hold(maker({"mine/a"}, &calls));
  r.dropHeld();
  EXPECT_FALSE(r.holding());
  EXPECT_EQ(calls, 0);
  EXPECT_TRUE(r.all().empty());
}

}  // namespace plugins

}  // namespace
}  // namespace sb::strategies
