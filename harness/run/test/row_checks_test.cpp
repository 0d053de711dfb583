// The replica identity check and the golden losses (harness/run/row_checks.h, golden.h).

#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <fstream>
#include <optional>

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

// The reference's own rounding (measureReferenceRounding, rowTolerance).

reference::WorkloadData gpt2(at::ScalarType dtype) {
  const nlohmann::json shape = {{"batch", 2}, {"seq", 8},   {"d_model", 32}, {"heads", 4},
                                {"layers", 1}, {"vocab", 48}, {"dropout", 0}};
  return reference::findWorkload("gpt2")->build(shape, dtype, 7, reference::InputMode::kRandom);
}

reference::WorkloadData gpt2Shadow(at::ScalarType of) {
  reference::ValuesRoundedAs rounded(of);
  return gpt2(at::kDouble);
}

double maxAbs(const at::Tensor& t) { return t.abs().max().item<double>(); }

// A tolerance for every tensor: the dtype's default, or bitwise for the tensor named "exact",
// and a lower arithmetic dtype where one is given.
class DefaultsStrategy final : public Strategy {
 public:
  explicit DefaultsStrategy(std::optional<at::ScalarType> low = std::nullopt)
      : Strategy("test/defaults", "defaults", Family::kSharding), low_(low) {}
  Applicability applies(const CaseSpec&) const override { return Applicability::yes(); }
  std::unique_ptr<RankExecutor> makeExecutor(const CaseSpec&) const override { return nullptr; }
  Box resultBox(const std::string&, const CaseSpec&, int) const override { return Box{{0}, {2}}; }
  CommStats predictComm(const CaseSpec&, int) const override { return {}; }
  std::optional<at::ScalarType> arithmeticDtype(const CaseSpec&) const override { return low_; }
  Tolerance tolerance(const std::string& name, const CaseSpec& c,
                      const at::Tensor&) const override {
    return name == "exact" ? Tolerance::bitwise("test") : Tolerance::defaultFor(c.dtype);
  }

 private:
  std::optional<at::ScalarType> low_;
};

TEST(ReferenceRounding, ShadowStartsFromTheCaseValuesAndFindsTheZeroByStructureGradient) {
  reference::WorkloadData d = gpt2(at::kFloat);
  measureReferenceRounding(d, gpt2Shadow(at::kFloat));
  ASSERT_TRUE(d.roundingNote.empty()) << d.roundingNote;
  // The key bias's gradient is zero by softmax's shift invariance: what float32 holds is its
  // own rounding, as large as the values themselves, and past torch.testing's atol.
  const at::Tensor kb = d.expected.at("grad/h0.attn.k.bias");
  const double e = d.rounding.at("grad/h0.attn.k.bias");
  EXPECT_GT(e, 0.5 * maxAbs(kb));
  // A gradient that does not cancel: its rounding is a few u of its values.
  const double w = d.rounding.at("grad/h0.mlp.fc.weight");
  EXPECT_GT(w, 0);
  EXPECT_LT(w, 1e-5 * maxAbs(d.expected.at("grad/h0.mlp.fc.weight")));
  EXPECT_EQ(d.rounding.size(), d.checked.size());
}

TEST(ReferenceRounding, AShadowFromOtherValuesMeasuresNothingAndSaysWhy) {
  // A bfloat16 case's shadow built without rounding its values to bfloat16 first.
  reference::WorkloadData d = gpt2(at::kBFloat16);
  measureReferenceRounding(d, gpt2(at::kDouble));
  EXPECT_TRUE(d.rounding.empty());
  EXPECT_NE(d.roundingNote.find("is not the case's value"), std::string::npos) << d.roundingNote;
  // Another computation (an output a quarter off) measures nothing either.
  reference::WorkloadData f = gpt2(at::kFloat);
  reference::WorkloadData other = gpt2Shadow(at::kFloat);
  other.expected.at("output").mul_(2);
  measureReferenceRounding(f, other);
  EXPECT_TRUE(f.rounding.empty());
  EXPECT_NE(f.roundingNote.find("'output' differs"), std::string::npos) << f.roundingNote;
}

TEST(ReferenceRounding, RaisesOnlyNonBitwiseTolerancesAndOnlyWhereWider) {
  const Tolerance fp32 = Tolerance::defaultFor(at::kFloat);
  const Tolerance raised = withReferenceRounding(fp32, 1e-4);
  EXPECT_DOUBLE_EQ(raised.atol, kReferenceRoundingFactor * 1e-4);
  EXPECT_DOUBLE_EQ(raised.rtol, fp32.rtol);
  EXPECT_NE(raised.reason.find("the reference's own rounding"), std::string::npos);
  EXPECT_DOUBLE_EQ(withReferenceRounding(fp32, 1e-7).atol, fp32.atol);  // already wider
  EXPECT_TRUE(withReferenceRounding(Tolerance::bitwise("x"), 1.0).exact);
  EXPECT_DOUBLE_EQ(withReferenceRounding(fp32, -1).atol, fp32.atol);  // not measured

  reference::WorkloadData d;
  d.expected["output"] = at::zeros({2});
  d.expected["exact"] = at::zeros({2});
  d.checked = {"output", "exact"};
  d.rounding = {{"output", 1e-3}, {"exact", 1e-3}};
  d.roundingIn[at::kBFloat16] = {{"output", 0.5}};
  CaseSpec c;
  c.dtype = at::kFloat;
  EXPECT_DOUBLE_EQ(rowTolerance(c, d, DefaultsStrategy(), "output").atol, 4e-3);
  EXPECT_TRUE(rowTolerance(c, d, DefaultsStrategy(), "exact").exact);
  // Computing in bfloat16: the reference's rounding in bfloat16.
  EXPECT_DOUBLE_EQ(rowTolerance(c, d, DefaultsStrategy(at::kBFloat16), "output").atol, 2.0);
  // A right tensor passes; one off by the value's own size fails, even at the raised atol.
  const at::Tensor e = d.expected.at("output");
  EXPECT_TRUE(checkTensor("output", 0, e + 3e-3, e, {0},
                          rowTolerance(c, d, DefaultsStrategy(), "output"))
                  .passed());
  EXPECT_FALSE(checkTensor("output", 0, e + 5e-3, e, {0},
                           rowTolerance(c, d, DefaultsStrategy(), "output"))
                   .passed());
}

}  // namespace
}  // namespace sb::harness
