// The replica identity check and the golden losses (harness/run/row_checks.h, golden.h).

#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <fstream>

#include "harness/error.h"
#include "harness/run/golden.h"
#include "harness/run/row_checks.h"
#include "harness/test/temp_dir.h"

namespace sb::harness {
namespace {

// Rank r holds rows [r / copies] of a [2, 3] tensor's halves: `copies` ranks per half.
class HalvesStrategy final : public Strategy {
 public:
  explicit HalvesStrategy(int copies)
      : Strategy("test/halves", "halves", Family::kSharding), copies_(copies) {}
  Applicability applies(const CaseSpec&) const override { return Applicability::yes(); }
  std::unique_ptr<RankExecutor> makeExecutor(const CaseSpec&) const override { return nullptr; }
  Box resultBox(const std::string&, const CaseSpec&, int rank) const override {
    return Box{{rank / copies_, 0}, {1, 3}};
  }
  CommStats predictComm(const CaseSpec&, int) const override { return {}; }

 private:
  int copies_;
};

at::Tensor row(std::vector<float> v) { return at::tensor(v, at::kFloat).view({1, -1}); }

reference::WorkloadData twoByThree() {
  reference::WorkloadData d;
  d.expected["output"] = at::arange(6, at::kFloat).view({2, 3});
  d.checked = {"output"};
  return d;
}

std::vector<RankOutcome> outcomes(const Strategy& s, const std::vector<at::Tensor>& held) {
  const reference::WorkloadData d = twoByThree();
  std::vector<RankOutcome> out;
  for (int r = 0; r < static_cast<int>(held.size()); ++r) {
    RankOutcome o(r);
    o.digests = resultDigests(CaseSpec{}, d, s, r, {{"output", held[r]}});
    out.push_back(o);
  }
  return out;
}

TEST(ReplicaCheck, CopiesOfOneBoxWithTheSameBitsPass) {
  const HalvesStrategy s(2);
  const at::Tensor a = row({0.f, 1.f, 2.f}), b = row({3.f, 4.f, 5.f});
  const ReplicaCheck rc = replicaCheck(twoByThree(), outcomes(s, {a, a.clone(), b, b.clone()}));
  EXPECT_EQ(rc.checked, 2);  // two boxes, each held by two ranks
  EXPECT_TRUE(rc.problems.empty()) << rc.summary();
}

TEST(ReplicaCheck, OneUlpOnOneCopyFailsNamingTheTensorBoxAndRanks) {
  const HalvesStrategy s(2);
  const at::Tensor a = row({0.f, 1.f, 2.f}), b = row({3.f, 4.f, 5.f});
  at::Tensor off = b.clone();
  off[0][1] = std::nextafter(4.f, 5.f);
  const ReplicaCheck rc = replicaCheck(twoByThree(), outcomes(s, {a, a, b, off}));
  ASSERT_EQ(rc.problems.size(), 1u);
  EXPECT_EQ(rc.problems[0],
            "replicas: output [1:2, 0:3] on rank 3 is not bit-identical to rank 2's copy");
}

TEST(ReplicaCheck, NegativeZeroIsAnotherCopy) {
  const HalvesStrategy s(2);
  const at::Tensor a = row({0.f, 1.f, 2.f}), b = row({-0.f, 1.f, 2.f});
  const at::Tensor c = row({3.f, 4.f, 5.f});
  EXPECT_EQ(replicaCheck(twoByThree(), outcomes(s, {a, b, c, c})).problems.size(), 1u);
}

TEST(ReplicaCheck, RanksWithDifferentBoxesAreNotCompared) {
  const HalvesStrategy s(1);  // rank r holds row r: no copies
  const ReplicaCheck rc =
      replicaCheck(twoByThree(), outcomes(s, {row({0.f, 1.f, 2.f}), row({3.f, 4.f, 5.f})}));
  EXPECT_EQ(rc.checked, 0);
  EXPECT_TRUE(rc.problems.empty());
}

reference::WorkloadData losses(std::vector<double> loss, std::vector<double> norm) {
  reference::WorkloadData d;
  d.expected["loss"] = at::tensor(loss, at::kDouble);
  d.expected["grad_norm"] = at::tensor(norm, at::kDouble);
  d.checked = {"loss", "grad_norm"};
  return d;
}

TEST(Golden, WrittenAndReadBackExactlyAndComparedBitwiseOnThisHost) {
  const std::string dir = sb::test::scratchDir("golden", "roundtrip");
  GoldenLosses g;
  g.file = dir + "/g.csv";
  g.cpu = hostVectorFeatures();
  g.threads = hostThreads();
  const auto data = losses({-559.0312345678912, 1.0 / 3.0}, {12.5, 0.1});
  g.cases["c"] = goldenSteps(data);
  { std::ofstream(g.file) << goldenText(g); }
  const GoldenLosses back = readGolden(g.file);
  EXPECT_EQ(back.cpu, g.cpu);
  ASSERT_EQ(back.cases.at("c").size(), 2u);
  EXPECT_EQ(back.cases.at("c")[1].loss, 1.0 / 3.0);
  CaseSpec c;
  c.name = "c";
  const GoldenVerdict ok = compareGolden(back, c, data, hostVectorFeatures(), hostThreads());
  EXPECT_EQ(ok.problem, "");
  EXPECT_NE(ok.how.find("bitwise"), std::string::npos) << ok.how;

  // One ulp off on this host: bitwise, so it fails, naming the step.
  const auto moved = losses({-559.0312345678912, std::nextafter(1.0 / 3.0, 1.0)}, {12.5, 0.1});
  const GoldenVerdict bad = compareGolden(back, c, moved, hostVectorFeatures(), hostThreads());
  EXPECT_NE(bad.problem.find("loss at step 2"), std::string::npos) << bad.problem;

  // Written on a host with other vector units: within the steps' tolerance, and it says so.
  GoldenLosses other = back;
  other.cpu = "avx other";
  const GoldenVerdict tol = compareGolden(other, c, moved, hostVectorFeatures(), hostThreads());
  EXPECT_EQ(tol.problem, "");
  EXPECT_NE(tol.how.find("vector features 'avx other'"), std::string::npos) << tol.how;
  // Another thread count splits reductions otherwise: compared within tolerance too.
  GoldenLosses threads = back;
  threads.threads = hostThreads() + 1;
  EXPECT_NE(compareGolden(threads, c, moved, hostVectorFeatures(), hostThreads())
                .how.find("intra-op threads"),
            std::string::npos);
  EXPECT_EQ(compareGolden(threads, c, moved, hostVectorFeatures(), hostThreads()).problem, "");
  EXPECT_NE(compareGolden(other, c, losses({-560.5, 1.0 / 3.0}, {12.5, 0.1}), hostVectorFeatures(),
                          hostThreads())
                .problem,
            "");

  c.name = "missing";
  EXPECT_NE(compareGolden(back, c, data, hostVectorFeatures(), hostThreads())
                .problem.find("no losses for case 'missing'"),
            std::string::npos);
}

TEST(Golden, MalformedFilesNameTheLineAndWhatWasExpected) {
  const std::string dir = sb::test::scratchDir("golden", "bad");
  const auto read = [&](const std::string& text) -> std::string {
    const std::string p = dir + "/g.csv";
    std::ofstream(p) << text;
    try {
      readGolden(p);
    } catch (const InputError& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(read("# cpu: x\ncase,step,loss\n").find("g.csv:2: expected the header"),
            std::string::npos);
  EXPECT_NE(read("# cpu: x\ncase,step,loss,grad_norm\nc,2,0x1p+0,0x1p+0\n")
                .find("g.csv:3: case 'c': expected step 1, got '2'"),
            std::string::npos);
  EXPECT_NE(read("# cpu: x\ncase,step,loss,grad_norm\nc,1,nan,0x1p+0\n")
                .find("g.csv:3: key 'loss': expected a finite number"),
            std::string::npos);
  EXPECT_NE(read("case,step,loss,grad_norm\n").find("no '# cpu: ...' line"), std::string::npos);
  EXPECT_NE(read("").find("no header"), std::string::npos);
}

}  // namespace
}  // namespace sb::harness
