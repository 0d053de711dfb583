#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "reports/compare.h"
#include "reports/stats.h"
#include "reports/test/test_rows.h"

namespace sb::reports {
namespace {

using test::passRow;
using test::tempDir;
using test::writeRun;

// Writes both runs through the harness's writer, reads them back, and compares: the gate sees
// exactly what it would see from `run`.
struct Gate {
  std::vector<ResultRow> current, baseline;
  Comparison cmp;

  Gate(const std::vector<harness::Record>& cur, const std::vector<harness::Record>& base,
       GateOptions o = {}) {
    static int n = 0;
    ++n;
    current = readResults(writeRun(tempDir("cur" + std::to_string(n)), cur));
    if (!base.empty()) {
      baseline = readResults(writeRun(tempDir("base" + std::to_string(n)), base));
    }
    cmp = compare(current, baseline, o);
  }

  const RowComparison& row(const std::string& id) const {
    for (const auto& r : cmp.rows) {
      if (r.any().strategyId == id) return r;
    }
    throw std::runtime_error("no row " + id);
  }
  std::string failures() const {
    std::string s;
    for (const auto& f : cmp.gateFailures()) s += f + "\n";
    return s;
  }
};

harness::Record failing(harness::Record r, double ratio) {
  r.status = harness::Status::kFail;
  r.errRatio = ratio;
  r.maxAbsErr = 0.5;
  r.mismatches = 12;
  r.message = "output@rank0: 12/64 mismatched";
  return r;
}

std::vector<double> scaled(const std::vector<double>& v, double f) {
  std::vector<double> o;
  for (double x : v) o.push_back(x * f);
  return o;
}

const std::vector<double> kSamples = {100, 103, 98, 101, 99, 102, 97, 100, 104, 99};

TEST(MannWhitney, FullySeparatedSamplesMatchTheNormalApproximationByHand) {
  // a = 1..10, b = 11..20: U = 0; mean 50, variance 10*10*21/12 = 175, so
  // z = (50 - 0.5) / sqrt(175) = 3.7418 and p = erfc(3.7418 / sqrt 2) = 1.826e-4.
  std::vector<double> a, b;
  for (int i = 1; i <= 10; ++i) a.push_back(i);
  for (int i = 11; i <= 20; ++i) b.push_back(i);
  const MannWhitney m = mannWhitneyU(a, b);
  EXPECT_DOUBLE_EQ(m.u, 0.0);
  EXPECT_NEAR(m.z, -3.7418, 1e-4);
  EXPECT_NEAR(m.pValue, 1.826e-4, 2e-6);
  EXPECT_NEAR(mannWhitneyU(b, a).pValue, m.pValue, 1e-15);  // two-sided: symmetric
}

TEST(MannWhitney, IdenticalSamplesGiveNoEvidence) {
  EXPECT_DOUBLE_EQ(mannWhitneyU({5, 5, 5, 5}, {5, 5, 5, 5}).pValue, 1.0);
  EXPECT_GT(mannWhitneyU(kSamples, kSamples).pValue, 0.9);
}

TEST(MannWhitney, TiesShareTheirMeanRank) {
  // a = {1, 2}, b = {2, 3}: pairs (1,2) (1,3) (2,3) count 0 for a, (2,2) a half: U_a = 0.5.
  EXPECT_DOUBLE_EQ(mannWhitneyU({1, 2}, {2, 3}).u, 0.5);
}

TEST(Gate, APassThatBecomesAFailFailsTheGateAndNamesTheStrategy) {
  const auto good = passRow("linear-4x16", "sharding/linear/S0R=S0R.RR/0");
  const auto other = passRow("linear-4x16", "sharding/linear/RR=RR.RR");
  Gate g({failing(good, 40.0), other}, {good, other});
  EXPECT_TRUE(g.cmp.gateFailed());
  EXPECT_EQ(g.row(good.strategyId).numerics, "regressed");
  EXPECT_EQ(g.row(good.strategyId).verdict, Verdict::kRegressed);
  EXPECT_EQ(g.row(other.strategyId).verdict, Verdict::kUnchanged);
  ASSERT_EQ(g.cmp.gateFailures().size(), 1u) << g.failures();
  EXPECT_NE(g.failures().find("sharding/linear/S0R=S0R.RR/0"), std::string::npos);
  EXPECT_NE(g.failures().find("was pass, now fail"), std::string::npos);
}

// A row `run` flagged mispredicted fails the gate on its own, baseline or not (and reads back
// from the results file it was written to); --allow-mispredicted makes it a warning.
TEST(Gate, AMispredictedRowFailsTheGateUnlessAllowed) {
  auto good = passRow("chain", "checkpointing/rotor");
  good.predictedMemBytes = 10000;
  auto off = good;
  off.predictedMemBytes = 8000;
  off.mispredicted = "memory";
  off.message =
      "mispredicted: memory measured 10000 bytes, predicted 8000 bytes (20% off; the "
      "strategy claims 5%)";
  for (bool withBaseline : {false, true}) {
    Gate g({off},
           withBaseline ? std::vector<harness::Record>{good} : std::vector<harness::Record>{});
    EXPECT_TRUE(g.cmp.gateFailed()) << withBaseline;
    EXPECT_EQ(g.row(off.strategyId).prediction, "mispredicted (memory)");
    EXPECT_EQ(g.row(off.strategyId).current->mispredicted, "memory");
    EXPECT_NE(g.failures().find("memory mispredicted (memory measured 10000 bytes"),
              std::string::npos)
        << g.failures();
    EXPECT_EQ(g.row(off.strategyId).numerics, "ok") << "the numbers themselves are right";
  }
  GateOptions allow;
  allow.allowMispredicted = true;
  Gate allowed({off}, {good}, allow);
  EXPECT_FALSE(allowed.cmp.gateFailed()) << allowed.failures();
  ASSERT_EQ(allowed.cmp.warnings().size(), 1u);
  Gate fine({good}, {good});
  EXPECT_FALSE(fine.cmp.gateFailed());
  EXPECT_EQ(fine.row(good.strategyId).prediction, "ok");
}

// A row from a results file written before runs judged predictions (no `mispredicted`
// column) says so rather than "ok".
TEST(Gate, ARowWhosePredictionsWereNeverJudgedSaysSo) {
  auto good = passRow("chain", "checkpointing/rotor");
  good.predictedMemBytes = 10000;
  auto rows = readResults(writeRun(tempDir("unjudged"), {good}));
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_TRUE(rows[0].predictionsJudged);
  rows[0].predictionsJudged = false;
  const Comparison cmp = compare(rows, {}, {});
  EXPECT_EQ(cmp.rows[0].prediction, "not judged");
  EXPECT_FALSE(cmp.gateFailed());
}

TEST(Gate, AnErrorThatBecomesAnErrorStatusFailsTheGate) {
  auto good = passRow("c", "s");
  auto err = good;
  err.status = harness::Status::kError;
  err.message = "rank 2: boom";
  Gate g({err}, {good});
  EXPECT_TRUE(g.cmp.gateFailed());
  EXPECT_NE(g.failures().find("rank 2: boom"), std::string::npos);
}

TEST(Gate, AnErrorThatGrewPastItsToleranceFailsTheGate) {
  const auto r = passRow("c", "s");
  Gate g({failing(r, 30.0)}, {failing(r, 3.0)});
  EXPECT_TRUE(g.cmp.gateFailed());
  EXPECT_EQ(g.row("s").numerics, "regressed");
  EXPECT_NE(g.failures().find("grew"), std::string::npos);
}

TEST(Gate, AKnownFailureThatDidNotGrowIsReportedButDoesNotGate) {
  const auto r = passRow("c", "s");
  Gate g({failing(r, 3.0)}, {failing(r, 3.0)});
  EXPECT_FALSE(g.cmp.gateFailed());
  EXPECT_EQ(g.row("s").numerics, "still failing");
  ASSERT_EQ(g.cmp.warnings().size(), 1u);
}

TEST(Gate, WithoutABaselineAFailingRowStillFailsTheGate) {
  Gate g({failing(passRow("c", "s"), 5.0), passRow("c", "t")}, {});
  EXPECT_TRUE(g.cmp.gateFailed());
  EXPECT_EQ(g.row("s").numerics, "new failure");
  EXPECT_EQ(g.row("t").numerics, "ok");
}

TEST(Gate, ANaNErrorFailsEvenWhereTheRowClaimsPass) {
  auto r = passRow("c", "s");
  r.maxAbsErr = std::nan("");
  Gate g({r}, {passRow("c", "s")});
  EXPECT_TRUE(g.cmp.gateFailed());
  EXPECT_NE(g.failures().find("NaN"), std::string::npos);

  auto inf = passRow("c", "s");
  inf.errRatio = std::nan("");
  Gate g2({inf}, {});
  EXPECT_TRUE(g2.cmp.gateFailed());
}

TEST(Gate, NoiseWithinTheThresholdPasses) {
  const auto base = passRow("c", "s", kSamples);
  const auto cur = passRow("c", "s", scaled(kSamples, 1.04));  // 4% slower, surely noise
  GateOptions o;
  o.hardPerf = true;
  Gate g({cur}, {base}, o);
  EXPECT_FALSE(g.cmp.gateFailed()) << g.failures();
  EXPECT_EQ(g.row("s").time, "unchanged");
  EXPECT_NEAR(*g.row("s").timeChangePct, 4.0, 0.5);
}

TEST(Gate, ASignificantSlowdownPastTheThresholdFailsOnlyWithGatePerf) {
  const auto base = passRow("c", "s", kSamples);
  const auto cur = passRow("c", "s", scaled(kSamples, 1.25));
  Gate soft({cur}, {base});
  EXPECT_FALSE(soft.cmp.gateFailed()) << soft.failures();
  EXPECT_EQ(soft.row("s").time, "regressed");
  EXPECT_EQ(soft.row("s").verdict, Verdict::kRegressed);
  EXPECT_LT(*soft.row("s").timePValue, 0.01);
  ASSERT_EQ(soft.cmp.warnings().size(), 1u);

  GateOptions o;
  o.hardPerf = true;
  Gate hard({cur}, {base}, o);
  EXPECT_TRUE(hard.cmp.gateFailed());
  EXPECT_NE(hard.failures().find("Mann-Whitney"), std::string::npos);
}

TEST(Gate, ASpeedupIsAnImprovementNotAFailure) {
  GateOptions o;
  o.hardPerf = true;
  Gate g({passRow("c", "s", scaled(kSamples, 0.7))}, {passRow("c", "s", kSamples)}, o);
  EXPECT_FALSE(g.cmp.gateFailed());
  EXPECT_EQ(g.row("s").verdict, Verdict::kImproved);
}

TEST(Gate, AMedianShiftThatTheTestCannotConfirmIsMarkedNoisyNotFailed) {
  // Two overlapping, widely spread samples whose medians differ by 15%.
  const std::vector<double> base = {50, 150, 60, 140, 70, 130, 80, 120, 100, 100};
  const std::vector<double> cur = {55, 160, 65, 150, 75, 145, 85, 135, 115, 115};
  GateOptions o;
  o.hardPerf = true;
  Gate g({passRow("c", "s", cur)}, {passRow("c", "s", base)}, o);
  EXPECT_GT(*g.row("s").timeChangePct, 10.0);
  EXPECT_EQ(g.row("s").time, "not significant");
  EXPECT_TRUE(g.row("s").noisy);
  EXPECT_FALSE(g.cmp.gateFailed());
}

TEST(Gate, TooFewRepetitionsWarnInsteadOfGating) {
  const std::vector<double> five = {100, 101, 99, 100, 102};
  GateOptions o;
  o.hardPerf = true;
  Gate g({passRow("c", "s", scaled(five, 1.5))}, {passRow("c", "s", five)}, o);
  EXPECT_EQ(g.row("s").time, "too few repetitions");
  EXPECT_FALSE(g.cmp.gateFailed());
  EXPECT_EQ(g.cmp.warnings().size(), 1u);
}

TEST(Gate, MemoryPastItsThresholdFailsAndWithinItPasses) {
  auto base = passRow("c", "s");
  auto grown = base;
  grown.peakMemBytes = 10600;  // +6%
  Gate g({grown}, {base});
  EXPECT_TRUE(g.cmp.gateFailed());
  EXPECT_EQ(g.row("s").mem, "regressed");
  EXPECT_NE(g.failures().find("10000 -> 10600"), std::string::npos);

  auto slight = base;
  slight.peakMemBytes = 10400;  // +4%
  Gate ok({slight}, {base});
  EXPECT_FALSE(ok.cmp.gateFailed());
  EXPECT_EQ(ok.row("s").mem, "unchanged");
}

// A baseline that allocated nothing: growth from 0 has no percentage and was never flagged.
TEST(Gate, MemoryGrownFromAZeroBaselineFails) {
  auto base = passRow("c", "s");
  base.peakMemBytes = 0;
  auto grown = base;
  grown.peakMemBytes = 4096;
  Gate g({grown}, {base});
  EXPECT_TRUE(g.cmp.gateFailed());
  EXPECT_EQ(g.row("s").mem, "regressed");
  EXPECT_NE(g.failures().find("peak 0 -> 4096 bytes"), std::string::npos) << g.failures();
  Gate same({base}, {base});
  EXPECT_FALSE(same.cmp.gateFailed());
  EXPECT_EQ(same.row("s").mem, "unchanged");
}

TEST(Gate, NewAndGoneRowsAreReportedNeverSilentlyIgnored) {
  const auto kept = passRow("c", "kept");
  Gate g({kept, passRow("c", "added")}, {kept, passRow("c", "removed")});
  EXPECT_EQ(g.row("added").verdict, Verdict::kNew);
  EXPECT_EQ(g.row("removed").verdict, Verdict::kGone);
  EXPECT_EQ(g.cmp.rows.size(), 3u);
  EXPECT_TRUE(g.cmp.gateFailed());  // a vanished row may hide a crash
  EXPECT_NE(g.failures().find("removed"), std::string::npos);
  bool newWarned = false;
  for (const auto& w : g.cmp.warnings()) newWarned |= w.find("added") != std::string::npos;
  EXPECT_TRUE(newWarned);

  GateOptions o;
  o.allowGone = true;
  Gate allowed({kept, passRow("c", "added")}, {kept, passRow("c", "removed")}, o);
  EXPECT_FALSE(allowed.cmp.gateFailed());
  EXPECT_EQ(allowed.row("removed").verdict, Verdict::kGone);
}

TEST(Gate, AStrategyThatNoLongerRunsItsCaseFailsTheGate) {
  auto now = passRow("c", "s");
  now.status = harness::Status::kUnsupported;
  now.message = "dimension 0 of size 1 cannot be split";
  Gate g({now}, {passRow("c", "s")});
  EXPECT_TRUE(g.cmp.gateFailed());
  EXPECT_NE(g.failures().find("now unsupported"), std::string::npos);
}

// A noise model with one band for the row (smoke, c, s, threads).
GateOptions withNoise(double bandPct, bool hard = true) {
  GateOptions o;
  o.hardPerf = hard;
  NoiseModel m;
  m.file = "noise.json";
  m.runs = 3;
  m.factor = 1.5;
  m.byKey[std::string("smoke\x1f") + "c\x1f" + "s\x1f" + "threads"] = {bandPct, bandPct / 1.5, 3};
  o.noise = m;
  return o;
}

TEST(GateNoise, ASlowdownInsideTheRowsBandIsUnchangedPastItARegression) {
  const auto base = passRow("c", "s", kSamples);
  const auto slower = passRow("c", "s", scaled(kSamples, 1.25));
  Gate inside({slower}, {base}, withNoise(30));
  EXPECT_EQ(inside.row("s").timeClass, "unchanged");
  EXPECT_FALSE(inside.cmp.gateFailed()) << inside.failures();
  EXPECT_TRUE(inside.cmp.promotionBlockers().empty());
  Gate past({slower}, {base}, withNoise(15));
  EXPECT_EQ(past.row("s").timeClass, "regression");
  EXPECT_DOUBLE_EQ(*past.row("s").timeBandPct, 15);
  EXPECT_TRUE(past.cmp.gateFailed());
  EXPECT_NE(past.failures().find("past its noise band 15%"), std::string::npos);
  // Soft time: the night passes, but it is no baseline.
  Gate soft({slower}, {base}, withNoise(15, false));
  EXPECT_FALSE(soft.cmp.gateFailed());
  ASSERT_EQ(soft.cmp.promotionBlockers().size(), 1u);
  EXPECT_NE(soft.cmp.promotionBlockers()[0].find("time regression"), std::string::npos);
}

// A rerun: the same rows, a run made after the one judged (its own run id).
harness::Record rerunOf(harness::Record r) {
  r.provenance.runId = "20261121T010000Z-0002";
  return r;
}

TEST(GateNoise, AConfirmingRunIsALaterRunOfTheSuiteJudgedNeverTheBaselineOrTheRunItself) {
  const auto base = passRow("c", "s", kSamples);
  auto slower = passRow("c", "s", scaled(kSamples, 1.25));
  slower.provenance.runId = "20261121T005000Z-0003";
  GateOptions o = withNoise(15);
  const auto refused = [&](const harness::Record& confirm, const std::string& dir,
                           const std::string& want) {
    o.confirm = readResults(writeRun(tempDir(dir), {confirm}));
    try {
      Gate g({slower}, {base}, o);
      ADD_FAILURE() << dir << ": accepted";
    } catch (const ReportInputError& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  // The baseline given again: its times "did not reproduce" the regression, and it passed.
  refused(base, "confirm-base", "is a baseline run");
  refused(slower, "confirm-self", "is the run being judged");
  auto other = rerunOf(passRow("c", "s", kSamples));
  other.suite = "other";
  refused(other, "confirm-other", "of suite 'other'");
}

TEST(GateNoise, ASlowdownARerunDoesNotReproduceIsAStallNotARegression) {
  const auto base = passRow("c", "s", kSamples);
  const auto slower = passRow("c", "s", scaled(kSamples, 1.25));
  GateOptions o = withNoise(15);
  o.confirm = readResults(writeRun(tempDir("rerun-ok"), {rerunOf(passRow("c", "s", kSamples))}));
  Gate stall({slower}, {base}, o);
  EXPECT_EQ(stall.row("s").timeClass, "unchanged");
  EXPECT_EQ(stall.row("s").time, "not reproduced");
  EXPECT_FALSE(stall.cmp.gateFailed()) << stall.failures();
  EXPECT_TRUE(stall.cmp.promotionBlockers().empty());
  o.confirm = readResults(writeRun(tempDir("rerun-slow"), {rerunOf(slower)}));
  Gate real({slower}, {base}, o);
  EXPECT_EQ(real.row("s").timeClass, "regression");
  EXPECT_NEAR(*real.row("s").confirmChangePct, 25, 1e-9);
  EXPECT_NE(real.failures().find("a rerun measured +25.0%"), std::string::npos) << real.failures();
  EXPECT_NE(real.failures().find("reproduced"), std::string::npos);
}

TEST(GateNoise, TheBandIsNeverFinerThanTheThreshold) {
  // A 1% band from a lucky calibration: a 5% move stays under the 10% threshold.
  Gate g({passRow("c", "s", scaled(kSamples, 1.05))}, {passRow("c", "s", kSamples)}, withNoise(1));
  EXPECT_EQ(g.row("s").timeClass, "unchanged");
  EXPECT_DOUBLE_EQ(*g.row("s").timeBandPct, 10);
}

TEST(GateNoise, ARowTheCalibrationLacksIsJudgedAgainstTheThresholdNeverLetThrough) {
  Gate g({passRow("c", "t", scaled(kSamples, 1.5))}, {passRow("c", "t", kSamples)}, withNoise(5));
  EXPECT_EQ(g.row("t").timeClass, "regression");
  EXPECT_TRUE(g.cmp.gateFailed());  // withNoise: --gate-perf
  EXPECT_NE(g.failures().find("has no band for this row"), std::string::npos) << g.failures();
  Gate small({passRow("c", "t", scaled(kSamples, 1.05))}, {passRow("c", "t", kSamples)},
             withNoise(5));
  EXPECT_EQ(small.row("t").timeClass, "unchanged");
}

TEST(GateNoise, ARerunThatMeasuredNothingLeavesTheRegressionStanding) {
  auto errored = passRow("c", "s", kSamples);
  errored.status = harness::Status::kError;
  errored.message = "step failed";
  GateOptions o = withNoise(15);
  o.confirm = readResults(writeRun(tempDir("rerun-err"), {rerunOf(errored)}));
  Gate g({passRow("c", "s", scaled(kSamples, 1.25))}, {passRow("c", "s", kSamples)}, o);
  EXPECT_EQ(g.row("s").timeClass, "regression");
  EXPECT_TRUE(g.cmp.gateFailed());
}

TEST(GateNoise, PastTheBandButNotSignificantIsSuspicious) {
  const std::vector<double> base = {50, 150, 60, 140, 70, 130, 80, 120, 100, 100};
  const std::vector<double> cur = {55, 160, 65, 150, 75, 145, 85, 135, 115, 115};
  Gate g({passRow("c", "s", cur)}, {passRow("c", "s", base)}, withNoise(12));
  EXPECT_EQ(g.row("s").timeClass, "suspicious");
  EXPECT_FALSE(g.cmp.gateFailed());
}

TEST(GateNoise, ALargeImprovementIsReportedAsUnexplained) {
  Gate g({passRow("c", "s", scaled(kSamples, 0.5))}, {passRow("c", "s", kSamples)}, withNoise(12));
  EXPECT_EQ(g.row("s").timeClass, "improvement");
  EXPECT_TRUE(g.row("s").largeImprovement);
  EXPECT_NE(g.cmp.warnings()[0].find("unexplained large improvement"), std::string::npos);
  Gate small({passRow("c", "s", scaled(kSamples, 0.8))}, {passRow("c", "s", kSamples)},
             withNoise(12));
  EXPECT_EQ(small.row("s").timeClass, "improvement");
  EXPECT_FALSE(small.row("s").largeImprovement);
}

TEST(GateRun, ASuiteThatRanNothingFailsUnlessAllowed) {
  auto skipped = passRow("c", "s");
  skipped.status = harness::Status::kSkipped;
  skipped.message = "no CUDA device";
  Gate g({skipped}, {});
  EXPECT_TRUE(g.cmp.gateFailed());
  EXPECT_NE(g.failures().find("suite smoke ran nothing: 1 row(s) skipped, 0 unsupported; 1 x "
                              "skipped: no CUDA device"),
            std::string::npos)
      << g.failures();
  GateOptions o;
  o.allowEmptySuite = true;
  Gate allowed({skipped}, {}, o);
  EXPECT_FALSE(allowed.cmp.gateFailed());
  // One row that ran is enough.
  Gate some({skipped, passRow("c", "t")}, {});
  EXPECT_FALSE(some.cmp.gateFailed()) << some.failures();
}

TEST(GateRun, AGoneRowSaysWhyItIsGone) {
  auto elsewhere = passRow("c", "s");
  elsewhere.backend = "gloo";
  Gate backend({elsewhere}, {passRow("c", "s")});
  EXPECT_NE(backend.failures().find("this run used backend gloo, the baseline threads"),
            std::string::npos)
      << backend.failures();
  Gate caseGone({passRow("c", "s")}, {passRow("c", "s"), passRow("d", "s")});
  EXPECT_NE(caseGone.failures().find("its case did not run"), std::string::npos);
  Gate stratGone({passRow("c", "s")}, {passRow("c", "s"), passRow("c", "t")});
  EXPECT_NE(stratGone.failures().find("its case ran without this strategy"), std::string::npos);
}

TEST(GateNoise, TheNoiseFileRoundTripsAndRejectsWhatItIsNot) {
  const auto a = readResults(writeRun(tempDir("noise-a"), {passRow("c", "s", kSamples)}));
  const auto b =
      readResults(writeRun(tempDir("noise-b"), {passRow("c", "s", scaled(kSamples, 1.1))}));
  const std::string dir = tempDir("noise-file");
  const std::string path = dir + "/noise.json";
  {
    std::ofstream f(path);
    f << noiseJson({a, b}, {"a", "b"}, 5, 1.5);
  }
  const NoiseModel m = readNoise(path);
  ASSERT_EQ(m.byKey.size(), 1u);
  const NoiseBand band = m.byKey.begin()->second;
  // Medians 100 and 110: spread 10 / median(100, 110) = 9.52%; one row, so no time scale to
  // pool with (it needs three rows): sqrt((1 x 9.52^2 + 0) / 2), band 1.5 x that.
  EXPECT_NEAR(band.spreadPct, 10.0 / 105 * 100, 1e-9);
  EXPECT_NEAR(band.bandPct, 1.5 * 10.0 / 105 * 100 / std::sqrt(2.0), 1e-9);
  EXPECT_EQ(band.runs, 2);
  {
    std::ofstream f(path);
    f << R"({"schema_version": 1, "floor_pct": 5, "factor": 1.5, "git_sha": "x", "host": "h",
             "runs": [], "rows": [{"suite": "s", "case": "c", "strategy_id": "i",
             "backend": "threads", "band_pct": "wide", "spread_pct": 1}]})";
  }
  try {
    readNoise(path);
    ADD_FAILURE() << "expected a ReportInputError";
  } catch (const ReportInputError& e) {
    EXPECT_NE(std::string(e.what()).find("rows[0] key 'band_pct' is \"wide\", expected a number"),
              std::string::npos)
        << e.what();
  }
}

TEST(Gate, ABaselineFromAnotherSuiteIsRejected) {
  auto other = passRow("c", "s");
  other.suite = "sharding";
  try {
    Gate g({passRow("c", "s")}, {other});
    ADD_FAILURE() << "expected a ReportInputError";
  } catch (const ReportInputError& e) {
    EXPECT_NE(std::string(e.what()).find("suite(s) sharding"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("results.csv"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace sb::reports
