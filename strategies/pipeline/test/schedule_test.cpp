// Pipeline schedules and their dry run (strategies/pipeline/schedule.h): the bubbles and the
// activations in flight that the literature derives for each schedule, every dependency
// respected on every timeline, deadlocks named, and the CSV format read and written.

#include <gtest/gtest.h>

#include <map>
#include <tuple>

#include "strategies/pipeline/schedule.h"

namespace sb::strategies::pipeline {
namespace {

Costs uniform(double f, double b, double i = -1, double w = -1) {
  StageCost c;
  c.forwardUs = f;
  c.backwardUs = b;
  c.backwardInputUs = i < 0 ? b / 2 : i;
  c.backwardWeightUs = w < 0 ? b - c.backwardInputUs : w;
  Costs costs;
  costs.stages = {c};
  return costs;
}

// Every action starts after what it needs has ended, read from the timeline alone (not from
// the simulator's own bookkeeping), and no rank runs two actions at once.
void expectDependenciesHold(const Schedule& s, const Simulation& sim) {
  std::map<std::tuple<int, char, int>, std::pair<double, double>> when;
  for (const auto& t : sim.ranks) {
    double last = 0;
    for (const auto& ta : t.actions) {
      EXPECT_GE(ta.startUs, last) << ta.action.name();
      last = ta.endUs;
      const std::string n = ta.action.name();
      when[{ta.action.stage, n[std::to_string(ta.action.stage).size()], ta.action.microbatch}] = {
          ta.startUs, ta.endUs};
    }
  }
  const auto end = [&](int st, char op, int m) {
    const auto it = when.find({st, op, m});
    return it == when.end() ? -1.0 : it->second.second;
  };
  for (const auto& [key, span] : when) {
    const auto [st, op, m] = key;
    if (op == 'F' && st > 0) {
      EXPECT_GE(span.first, end(st - 1, 'F', m));
    }
    if (op == 'B' || op == 'I') {
      EXPECT_GE(span.first, end(st, 'F', m));
      if (st + 1 < s.stages) {
        EXPECT_GE(span.first, std::max(end(st + 1, 'B', m), end(st + 1, 'I', m)));
      }
    }
    if (op == 'W') {
      EXPECT_GE(span.first, end(st, 'I', m));
    }
  }
}

// GPipe with forward f and backward b per stage: (M + S - 1)(f + b), the bubble
// (S - 1) / (M + S - 1), and every micro-batch's activations in flight on every stage.
TEST(PipelineSchedule, GPipeHasTheTextbookBubbleAndHoldsEveryMicrobatch) {
  for (const auto& [S, M] : {std::pair{4, 8}, std::pair{2, 5}, std::pair{4, 1}}) {
    const Schedule s = makeSchedule("gpipe", S, M);
    const Simulation sim = simulate(s, uniform(1, 2));
    ASSERT_TRUE(sim.deadlock.empty()) << sim.deadlock;
    EXPECT_DOUBLE_EQ(sim.stepUs, (M + S - 1) * 3.0);
    EXPECT_NEAR(sim.bubbleFraction, double(S - 1) / (M + S - 1), 1e-12);
    for (const auto& t : sim.ranks) EXPECT_EQ(t.peakMicrobatchesInFlight, M);
    expectDependenciesHold(s, sim);
  }
}

// 1F1B: the same step and bubble as GPipe (Narayanan et al., 2019), but stage r holds at most
// S - r micro-batches' activations, not M.
TEST(PipelineSchedule, OneFOneBMatchesGPipesBubbleWithSMinusRInFlight) {
  const int S = 4, M = 8;
  const Schedule s = makeSchedule("1f1b", S, M);
  const Simulation sim = simulate(s, uniform(1, 2));
  ASSERT_TRUE(sim.deadlock.empty()) << sim.deadlock;
  EXPECT_DOUBLE_EQ(sim.stepUs, (M + S - 1) * 3.0);
  for (int r = 0; r < S; ++r) EXPECT_EQ(sim.ranks[r].peakMicrobatchesInFlight, S - r) << r;
  expectDependenciesHold(s, sim);
}

// Interleaved 1F1B with v stages per rank, each a 1/v of the layers: the bubble shrinks by v
// (Narayanan et al., 2021: (p - 1)(tf + tb) / v of idle time per rank).
TEST(PipelineSchedule, InterleavedShrinksTheBubbleByTheVirtualStages) {
  const int R = 4, M = 8, v = 2;
  const Schedule s = makeSchedule("interleaved-1f1b", R, M, v);
  EXPECT_EQ(s.stages, R * v);
  const Simulation sim = simulate(s, uniform(1.0 / v, 2.0 / v));
  ASSERT_TRUE(sim.deadlock.empty()) << sim.deadlock;
  const double busy = M * 3.0, idle = (R - 1) * 3.0 / v;
  EXPECT_DOUBLE_EQ(sim.stepUs, busy + idle);
  const Simulation plain = simulate(makeSchedule("1f1b", R, M), uniform(1, 2));
  EXPECT_LT(sim.bubbleFraction, plain.bubbleFraction);
  expectDependenciesHold(s, sim);
}

// ZB-H1 (Qi et al., 2023): the backward split, the weight gradients delayed: the bubble is
// (S - 1)(F + I - W) against 1F1B's (S - 1)(F + B), with no more micro-batches in flight.
TEST(PipelineSchedule, ZeroBubbleH1HasThePapersBubbleAtOneFOneBsMemory) {
  for (const auto& [S, M] :
       {std::pair{4, 8}, std::pair{4, 12}, std::pair{2, 4}, std::pair{8, 16}}) {
    const double F = 1, I = 1, W = 1;
    const Schedule zb = makeSchedule("zb-h1", S, M);
    const Schedule plain = makeSchedule("1f1b", S, M);
    const Simulation a = simulate(zb, uniform(F, I + W, I, W)),
                     b = simulate(plain, uniform(F, I + W));
    ASSERT_TRUE(a.deadlock.empty()) << a.deadlock;
    EXPECT_DOUBLE_EQ(a.stepUs, M * (F + I + W) + (S - 1) * (F + I - W)) << S << " " << M;
    EXPECT_DOUBLE_EQ(b.stepUs, M * (F + I + W) + (S - 1) * (F + I + W)) << S << " " << M;
    for (int r = 0; r < S; ++r) {
      EXPECT_LE(a.ranks[r].peakMicrobatchesInFlight, b.ranks[r].peakMicrobatchesInFlight);
      EXPECT_DOUBLE_EQ(a.ranks[r].busyUs, b.ranks[r].busyUs);
    }
    expectDependenciesHold(zb, a);
  }
}

// Every built-in schedule, on every small shape, finishes with every dependency respected and
// each rank busy exactly its share of the work.
TEST(PipelineSchedule, EveryBuiltInScheduleFinishesOnEverySmallShape) {
  for (const auto& kind : scheduleKinds()) {
    for (int S = 1; S <= 5; ++S) {
      for (int M = 1; M <= 9; ++M) {
        for (int v = 1; v <= (kind == "interleaved-1f1b" ? 3 : 1); ++v) {
          if (v > 1 && M % S != 0) continue;
          const Schedule s = makeSchedule(kind, S, M, v);
          const Simulation sim = simulate(s, uniform(1, 2));
          ASSERT_TRUE(sim.deadlock.empty())
              << kind << " " << S << "x" << M << " v" << v << ": " << sim.deadlock;
          for (const auto& t : sim.ranks) EXPECT_DOUBLE_EQ(t.busyUs, 3.0 * M * v);
          expectDependenciesHold(s, sim);
        }
      }
    }
  }
}

TEST(PipelineSchedule, AnActivationUsedBeforeItIsMadeIsADeadlockNamingRankActionAndWhatItWaitsFor) {
  // Rank 1 runs its backward of micro-batch 0 before its forward.
  const Schedule s = readScheduleCsv("0F0,0B0\n1B0,1F0\n", "bad.csv");
  const Simulation sim = simulate(s, uniform(1, 2));
  ASSERT_FALSE(sim.deadlock.empty());
  EXPECT_EQ(sim.deadlock,
            "rank 1 waits at 1B0 for 1F0, which it runs itself later (used before it is made)");
  // Two ranks each waiting for the other.
  const Schedule cycle = readScheduleCsv("0B0,0F0\n1F0,1B0\n", "cycle.csv");
  const Simulation c = simulate(cycle, uniform(1, 2));
  ASSERT_EQ(c.waiting.size(), 2u);
  EXPECT_EQ(c.waiting[0],
            "rank 0 waits at 0B0 for 0F0, which it runs itself later (used before it is made)");
  EXPECT_EQ(c.waiting[1], "rank 1 waits at 1F0 for 0F0, which rank 0 has not run: it waits at 0B0");
}

TEST(PipelineSchedule, TheCsvFormatRoundTripsAndMalformedFilesNameLineAndCell) {
  for (const auto& kind : scheduleKinds()) {
    const Schedule s = makeSchedule(kind, 4, 8, kind == "interleaved-1f1b" ? 2 : 1);
    const Schedule back = readScheduleCsv(scheduleCsv(s), "x.csv");
    EXPECT_EQ(back.perRank.size(), s.perRank.size()) << kind;
    for (size_t r = 0; r < s.perRank.size(); ++r) EXPECT_EQ(back.perRank[r], s.perRank[r]) << kind;
    EXPECT_EQ(back.stageRank, s.stageRank) << kind;
  }
  const auto error = [](const std::string& text) {
    try {
      readScheduleCsv(text, "s.csv");
    } catch (const ScheduleError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(error("0F0,0X1\n").find("s.csv:1: cell 2: '0X1' is not an action"), std::string::npos);
  EXPECT_NE(error("0F0,0SEND_F0\n").find("the compute_only format"), std::string::npos);
  EXPECT_NE(error("0F0,0B0\n0F1,0B1\n").find("s.csv:2: cell 1: 0F1: stage 0 is on rank 0"),
            std::string::npos);
  EXPECT_NE(error("0F0,0F0,0B0\n").find("rank 0: 0F0 is repeated"), std::string::npos);
  EXPECT_NE(error("0F0,0I0,0W0,0F1\n").find("no backward of stage 0, micro-batch 1"),
            std::string::npos);
  // Counted before anything of stages x micro-batches is made: a cell naming micro-batch
  // 99999 in a four-action file.
  EXPECT_NE(error("0F0,0F1,0B0\n").find("which take at least 4 actions; it has 3"),
            std::string::npos);
  EXPECT_NE(error("0F0\n1F0\n2F0\n3F99999\n").find("at least 800000 actions; it has 4"),
            std::string::npos);
  EXPECT_NE(error("0F0,0I0\n").find("no 0W0"), std::string::npos);
  EXPECT_NE(error("0F0,0B0\n2F0,2B0\n").find("stage 1 runs on no rank"), std::string::npos);
  EXPECT_NE(error("\n\n").find("no ranks"), std::string::npos);
  EXPECT_NE(error("0F0,0B99999999999\n").find("is not an action"), std::string::npos);
}

// The balanced cut against every cut there is, on small random models: none has a slower
// slowest stage. By layer count: the first L mod S stages one layer more.
TEST(PipelineSchedule, TheBalancedCutIsTheBestOfEveryCut) {
  uint64_t seed = 12345;
  const auto next = [&seed] {
    seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<double>((seed >> 33) % 1000) + 1;
  };
  for (int trial = 0; trial < 200; ++trial) {
    const int L = 1 + trial % 9, S = 1 + trial % std::min(L, 4);
    std::vector<double> cost;
    for (int i = 0; i < L; ++i) cost.push_back(next());
    const auto slowest = [&](const std::vector<int>& cut) {
      double worst = 0;
      for (int st = 0; st < S; ++st) {
        double sum = 0;
        for (int i = cut[st]; i < cut[st + 1]; ++i) sum += cost[i];
        worst = std::max(worst, sum);
      }
      return worst;
    };
    const auto cut = balanceStages(cost, S);
    ASSERT_EQ(cut.size(), static_cast<size_t>(S + 1));
    EXPECT_EQ(cut.front(), 0);
    EXPECT_EQ(cut.back(), L);
    for (int st = 0; st < S; ++st) EXPECT_LT(cut[st], cut[st + 1]);
    // Every cut: S - 1 boundaries among the L - 1 gaps, as a bit mask.
    double best = 1e300;
    for (uint32_t mask = 0; mask < (1u << (L - 1)); ++mask) {
      if (__builtin_popcount(mask) != S - 1) continue;
      std::vector<int> c = {0};
      for (int g = 0; g < L - 1; ++g) {
        if (mask & (1u << g)) c.push_back(g + 1);
      }
      c.push_back(L);
      best = std::min(best, slowest(c));
    }
    EXPECT_DOUBLE_EQ(slowest(cut), best) << "trial " << trial;
  }
  EXPECT_EQ(evenStages(10, 4), (std::vector<int>{0, 3, 6, 8, 10}));
  EXPECT_THROW(evenStages(3, 4), ScheduleError);
  EXPECT_THROW(balanceStages(std::vector<double>(5000, 1.0), 4), ScheduleError);
}

TEST(PipelineSchedule, SizesAndProfilesOutsideWhatItTakesAreRefusedNamingThem) {
  EXPECT_THROW(makeSchedule("pipedream", 4, 8), ScheduleError);
  EXPECT_THROW(makeSchedule("1f1b", 0, 8), ScheduleError);
  EXPECT_THROW(makeSchedule("1f1b", 4, 8, 2), ScheduleError);
  EXPECT_THROW(makeSchedule("interleaved-1f1b", 4, 6, 2), ScheduleError);  // 6 not a multiple of 4
  EXPECT_THROW(makeSchedule("gpipe", 4096, 100000), ScheduleError);        // too many actions
  const auto error = [](const std::string& text, int stages) {
    try {
      Costs::fromJson(text, "p.json", stages);
    } catch (const ScheduleError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(error("{\"stages\": [{\"forward_us\": -1}]}", 4).find("'stages[0].forward_us' must be"),
            std::string::npos);
  EXPECT_NE(error("{\"stages\": [{}, {}]}", 4).find("'stages' has 2 entries"), std::string::npos);
  EXPECT_NE(error("{\"stages\": [{\"fwd\": 1}]}", 4).find("unknown key 'stages[0].fwd'"),
            std::string::npos);
  EXPECT_NE(error("{\"stages\": [{\"activation_bytes\": 1, \"weight_grad_bytes\": 2}]}", 4)
                .find("is more than its activation_bytes"),
            std::string::npos);
  EXPECT_NE(error("{\"stages\": [{}], \"stages\": [{}]}", 4).find("not valid JSON"),
            std::string::npos);
  // A per-stage profile sets the critical path: the slowest stage paces the steady state.
  const Costs c = Costs::fromJson(
      "{\"stages\": [{\"forward_us\": 1, \"backward_us\": 2}, {\"forward_us\": 2, "
      "\"backward_us\": 4}]}",
      "p.json", 2);
  const Simulation sim = simulate(makeSchedule("gpipe", 2, 4), c);
  // Stage 1 runs 4 forwards from t = 1 and 4 backwards: its 24 units of work start at 1, end
  // at 25; stage 0's last backward (2) follows: 27.
  EXPECT_DOUBLE_EQ(sim.stepUs, 27.0);
  // Shared cores: read, and a host per rank or none refused where they do not agree.
  const Costs shared = Costs::fromJson(
      "{\"stages\": [{}], \"cores\": 2, \"threads\": 1, \"host_of\": [0, 0, 1, 1]}", "p.json", 4);
  EXPECT_EQ(shared.sharing.cores, 2);
  EXPECT_EQ(shared.sharing.hostOf, (std::vector<int>{0, 0, 1, 1}));
  EXPECT_NE(error("{\"stages\": [{}], \"threads\": 0}", 4).find("'threads' must be an integer"),
            std::string::npos);
  EXPECT_NE(error("{\"stages\": [{}], \"host_of\": [0, -1]}", 4).find("'host_of[1]' must be"),
            std::string::npos);
  Costs twoHosts = uniform(1, 2);
  twoHosts.sharing = {1, 1, {0, 0, 1}};
  try {
    simulate(makeSchedule("gpipe", 4, 8), twoHosts);
    ADD_FAILURE() << "host_of of 3 ranks accepted for 4";
  } catch (const ScheduleError& e) {
    EXPECT_NE(std::string(e.what()).find("'host_of' has 3 entries; the schedule has 4 ranks"),
              std::string::npos);
  }
}

// Ranks sharing one core: the core is never idle while any rank can run, so the step is every
// action's cost summed (work conservation), whatever the schedule; a ready rank waits for the
// core, the dependencies still holding. Where every rank has cores of its own the run is the one
// without sharing, to the bit.
TEST(PipelineSchedule, RanksSharingCoresTakeTheirWorkInTurn) {
  for (const char* kind : {"gpipe", "1f1b", "zb-h1"}) {
    const int R = 4, M = 8;
    const Schedule s = makeSchedule(kind, R, M);
    Costs c = uniform(1, 2);
    const Simulation alone = simulate(s, c);
    c.sharing = {1, 1, {}};
    const Simulation one = simulate(s, c);
    EXPECT_TRUE(one.coresShared) << kind;
    EXPECT_NEAR(one.stepUs, R * M * 3.0, 1e-9) << kind;
    expectDependenciesHold(s, one);
    // Two cores for four ranks: no faster than half the work or the unshared run, no slower
    // than twice the unshared run.
    c.sharing = {2, 1, {}};
    const Simulation two = simulate(s, c);
    EXPECT_GE(two.stepUs, std::max(R * M * 3.0 / 2, alone.stepUs) - 1e-9) << kind;
    EXPECT_LE(two.stepUs, 2 * alone.stepUs + 1e-9) << kind;
    expectDependenciesHold(s, two);
    // Each rank on a host of its own, or enough cores for every rank's threads: no sharing.
    for (const Costs::Sharing& sh :
         {Costs::Sharing{1, 1, {0, 1, 2, 3}}, Costs::Sharing{8, 2, {}}}) {
      c.sharing = sh;
      const Simulation same = simulate(s, c);
      EXPECT_FALSE(same.coresShared) << kind;
      EXPECT_EQ(same.stepUs, alone.stepUs) << kind;
      EXPECT_EQ(same.bubbleFraction, alone.bubbleFraction) << kind;
    }
  }
  // Shared, but never two ranks ready at once (one micro-batch: each action waits for the last):
  // the time-ordered run is the dependency-order one.
  {
    Costs c = uniform(1, 2);
    const Schedule one = makeSchedule("1f1b", 4, 1);
    const Simulation alone = simulate(one, c);
    c.sharing = {1, 1, {}};
    const Simulation turn = simulate(one, c);
    ASSERT_TRUE(turn.coresShared);
    EXPECT_DOUBLE_EQ(turn.stepUs, alone.stepUs);
    EXPECT_DOUBLE_EQ(turn.bubbleFraction, alone.bubbleFraction);
    for (size_t r = 0; r < alone.ranks.size(); ++r) {
      ASSERT_EQ(turn.ranks[r].actions.size(), alone.ranks[r].actions.size());
      for (size_t k = 0; k < alone.ranks[r].actions.size(); ++k) {
        EXPECT_DOUBLE_EQ(turn.ranks[r].actions[k].startUs, alone.ranks[r].actions[k].startUs);
      }
    }
  }
  // GPipe on 2 ranks sharing one core, 2 micro-batches, F 1 and B 2, by hand: 0F0 [0, 1]; at 1
  // 0F1 and 1F0 are both ready, rank 0 first (ready as early, lower rank): 0F1 [1, 2], then 1F0
  // [2, 3], 1F1 [3, 4], 1B0 [4, 6] (rank 0 waits for it); at 6 0B0 and 1B1 are both ready:
  // 0B0 [6, 8], 1B1 [8, 10]; 0B1 [10, 12]. Each rank is busy 6 of 12.
  Costs c = uniform(1, 2);
  c.sharing = {1, 1, {}};
  const Simulation g = simulate(makeSchedule("gpipe", 2, 2), c);
  ASSERT_EQ(g.ranks.size(), 2u);
  EXPECT_DOUBLE_EQ(g.stepUs, 12.0);
  EXPECT_DOUBLE_EQ(g.ranks[0].busyUs, 6.0);
  EXPECT_DOUBLE_EQ(g.ranks[1].busyUs, 6.0);
  EXPECT_DOUBLE_EQ(g.bubbleFraction, 0.5);
  ASSERT_EQ(g.ranks[1].actions.size(), 4u);
  EXPECT_DOUBLE_EQ(g.ranks[1].actions[0].startUs, 2.0);  // 1F0 waited a unit for the core
  EXPECT_DOUBLE_EQ(g.ranks[1].actions[3].startUs, 8.0);  // 1B1 waited two
  EXPECT_DOUBLE_EQ(g.ranks[0].actions[3].startUs, 10.0);
}

}  // namespace
}  // namespace sb::strategies::pipeline
