// Locating a failing row's first divergence (harness/run/divergence.h): the comparison of
// captured pieces against a reference trace, over ranks, and its message.

#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <limits>

#include "harness/run/divergence.h"

namespace sb::harness {
namespace {

// A strategy with the harness's default tolerances: nothing else is used here.
class PlainStrategy final : public Strategy {
 public:
  PlainStrategy() : Strategy("test/plain", "plain", Family::kSharding) {}
  Applicability applies(const CaseSpec&) const override { return Applicability::yes(); }
  std::unique_ptr<RankExecutor> makeExecutor(const CaseSpec&) const override { return nullptr; }
  Box resultBox(const std::string&, const CaseSpec&, int) const override { return {}; }
  CommStats predictComm(const CaseSpec&, int) const override { return {}; }
};

// A trace of four [4, 3] values: two forward, two backward, in that order.
std::vector<TraceValue> referenceTrace() {
  std::vector<TraceValue> t;
  const char* names[][3] = {{"fc1", "forward", "fc1"},
                            {"fc2", "forward", "fc2"},
                            {"fc2", "backward", "grad fc1"},
                            {"fc1", "backward", "grad w1"}};
  for (int i = 0; i < 4; ++i) {
    t.push_back({names[i][0],
                 names[i][1],
                 names[i][2],
                 at::arange(12, at::kFloat).view({4, 3}) * (i + 1) + 0.5,
                 {}});
  }
  return t;
}

// Rank r's pieces: rows [2r, 2r + 2) of every value, made in the trace's order, ranks in step
// (value i at time 10 i + r).
std::vector<TraceValue> pieces(const std::vector<TraceValue>& ref, int rank) {
  std::vector<TraceValue> out;
  for (size_t i = 0; i < ref.size(); ++i) {
    const Box box{{2 * rank, 0}, {2, 3}};
    out.push_back({"", ref[i].phase, ref[i].tensor, sliceBox(ref[i].value, box).clone(), box,
                   static_cast<int64_t>(10 * i) + rank});
  }
  return out;
}

TEST(Divergence, NamesTheEarliestValueOverTheRanks) {
  const CaseSpec c;
  const PlainStrategy s;
  const auto ref = referenceTrace();
  auto p0 = pieces(ref, 0), p1 = pieces(ref, 1);
  p0[3].value[1][2] += 1.0f;   // rank 0: its last value
  p1[1].value[0][0] += 1e-3f;  // rank 1: the second
  const auto d0 = firstDivergenceOnRank(c, s, ref, p0, 0);
  const auto d1 = firstDivergenceOnRank(c, s, ref, p1, 1);
  ASSERT_TRUE(d0.at("found").get<bool>());
  EXPECT_EQ(d0.at("index"), 3);
  EXPECT_EQ(d0.at("tensor"), "grad w1");
  EXPECT_EQ(d0.at("check").at("worst_index"), std::vector<int64_t>({1, 2}));
  ASSERT_TRUE(d1.at("found").get<bool>());
  EXPECT_EQ(d1.at("index"), 1);
  EXPECT_EQ(d1.at("compared"), 2);
  // Full-tensor coordinates: rank 1's first row is row 2.
  EXPECT_EQ(d1.at("check").at("worst_index"), std::vector<int64_t>({2, 0}));

  // The earliest in time: rank 1's (made at 11, rank 0's at 30).
  const auto d = firstDivergence({d0, d1, nullptr});
  EXPECT_EQ(d.at("rank"), 1);
  EXPECT_EQ(d.at("node"), "fc2");
  EXPECT_EQ(d.at("phase"), "forward");
  EXPECT_EQ(d.at("ranks"), std::vector<int>({1}));
  ASSERT_EQ(d.at("elsewhere").size(), 1u);
  EXPECT_EQ(d.at("elsewhere")[0].at("rank"), 0);
  const std::string text = divergenceText(d);
  EXPECT_NE(text.find("node fc2 (forward) on rank 1, value 2 of 4"), std::string::npos) << text;
}

TEST(Divergence, PiecesWithinToleranceFindNothing) {
  const CaseSpec c;
  const PlainStrategy s;
  const auto ref = referenceTrace();
  auto p = pieces(ref, 1);
  p[2].value[0][0] += 1e-6f;  // within fp32's rtol at these magnitudes
  const auto d = firstDivergenceOnRank(c, s, ref, p, 1);
  EXPECT_FALSE(d.at("found").get<bool>());
  EXPECT_EQ(d.at("compared"), 4);
  const auto all = firstDivergence({d, firstDivergenceOnRank(c, s, ref, pieces(ref, 0), 0)});
  EXPECT_FALSE(all.at("found").get<bool>());
  EXPECT_EQ(all.at("compared"), 8);
  EXPECT_NE(divergenceText(all).find("no traced value leaves"), std::string::npos);
}

TEST(Divergence, APieceOfTheWrongBoxIsFound) {
  const CaseSpec c;
  const PlainStrategy s;
  const auto ref = referenceTrace();
  auto p = pieces(ref, 1);
  p[0].value = sliceBox(ref[0].value, Box{{0, 0}, {2, 3}}).clone();  // rank 0's rows
  const auto d = firstDivergenceOnRank(c, s, ref, p, 1);
  ASSERT_TRUE(d.at("found").get<bool>());
  EXPECT_EQ(d.at("index"), 0);
}

TEST(Divergence, TheExecutorsOrderCountsAndNamesThatDisagreeAreCounted) {
  const CaseSpec c;
  const PlainStrategy s;
  const auto ref = referenceTrace();
  auto p = pieces(ref, 0);
  // Made in another order than the reference lists them: the executor's order is the one
  // walked, so its first wrong value is named even where the reference lists another earlier.
  std::swap(p[0], p[3]);
  p[0].value[0][0] += 1.0f;  // "grad w1", made first here
  p[3].value[0][0] += 1.0f;  // "fc1", listed first by the reference
  auto d = firstDivergenceOnRank(c, s, ref, p, 0);
  ASSERT_TRUE(d.at("found").get<bool>());
  EXPECT_EQ(d.at("tensor"), "grad w1");
  EXPECT_EQ(d.at("index"), 0);
  // A value not captured, and one the reference does not trace: counted, not compared.
  p = pieces(ref, 0);
  p.erase(p.begin() + 1);
  p.push_back({"", "forward", "not traced", at::ones({2, 3}), Box{{0, 0}, {2, 3}}, 99});
  d = firstDivergenceOnRank(c, s, ref, p, 0);
  EXPECT_FALSE(d.at("found").get<bool>());
  EXPECT_EQ(d.at("compared"), 3);
  EXPECT_EQ(d.at("missing"), std::vector<int>({1}));
  EXPECT_EQ(d.at("untraced"), 1);
  // Over the ranks, only what no rank made is missing: rank 1 made value 1.
  const auto both = firstDivergence({d, firstDivergenceOnRank(c, s, ref, pieces(ref, 1), 1)});
  EXPECT_FALSE(both.contains("missing"));
  EXPECT_EQ(firstDivergence({d}).at("missing"), 1);
}

TEST(Divergence, MasksCompareExactlyAndMatchingInfinitiesMatch) {
  const CaseSpec c;
  const PlainStrategy s;
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<TraceValue> ref = {
      {"mask", "forward", "mask", at::tensor({1, 0, 1, 0}).to(at::kBool), {}},
      {"scores", "forward", "scores", at::tensor({1.0f, -inf, 3.0f, -inf}), {}}};
  const Box whole = Box::whole({4});
  std::vector<TraceValue> got = {{"", "forward", "mask", ref[0].value.clone(), whole, 0},
                                 {"", "forward", "scores", ref[1].value.clone(), whole, 1}};
  EXPECT_FALSE(firstDivergenceOnRank(c, s, ref, got, 0).at("found").get<bool>());
  got[1].value[2] = -inf;  // an unmasked score masked
  auto d = firstDivergenceOnRank(c, s, ref, got, 0);
  ASSERT_TRUE(d.at("found").get<bool>());
  EXPECT_EQ(d.at("tensor"), "scores");
  got[1].value[2] = 3.0f;
  got[0].value[1] = true;  // one mask element flipped
  d = firstDivergenceOnRank(c, s, ref, got, 0);
  ASSERT_TRUE(d.at("found").get<bool>());
  EXPECT_EQ(d.at("tensor"), "mask");
  EXPECT_EQ(d.at("check").at("mismatches"), 1);
}

TEST(Divergence, MatchingNaNsMatchAndANaNOnOneSideDoesNot) {
  const CaseSpec c;
  const PlainStrategy s;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<TraceValue> ref = {
      {"softmax", "forward", "probs", at::tensor({0.5f, 0.5f, nan, nan}), {}}};
  const Box whole = Box::whole({4});
  std::vector<TraceValue> got = {{"", "forward", "probs", ref[0].value.clone(), whole, 0}};
  EXPECT_FALSE(firstDivergenceOnRank(c, s, ref, got, 0).at("found").get<bool>());
  got[0].value[2] = 0.0f;  // a row that is not masked where the reference's is
  EXPECT_TRUE(firstDivergenceOnRank(c, s, ref, got, 0).at("found").get<bool>());
}

TEST(Divergence, ARanksErrorIsKeptWhereNoRankFoundOneAndOtherwiseTheFoundWins) {
  const CaseSpec c;
  const PlainStrategy s;
  const auto ref = referenceTrace();
  auto p1 = pieces(ref, 1);
  p1[2].value[0][0] += 1.0f;
  const nlohmann::json error = {{"error", "capturing: boom"}, {"rank", 0}};
  const auto found = firstDivergence({error, firstDivergenceOnRank(c, s, ref, p1, 1)});
  EXPECT_TRUE(found.at("found").get<bool>());
  EXPECT_EQ(found.at("rank"), 1);
  const auto only = firstDivergence({error, nullptr});
  EXPECT_EQ(divergenceText(only), "first divergence not located: capturing: boom");
  EXPECT_TRUE(firstDivergence({nullptr, nullptr}).is_null());
}

TEST(Divergence, ABoxOfTheWrongRankIsAProblemNotAnException) {
  const CaseSpec c;
  const PlainStrategy s;
  const auto ref = referenceTrace();
  auto p = pieces(ref, 0);
  p[0].box = Box{{0}, {6}};
  const auto d = firstDivergenceOnRank(c, s, ref, p, 0);
  ASSERT_TRUE(d.at("found").get<bool>());
  EXPECT_NE(d.at("check").at("problem").get<std::string>().find("1 dimensions"), std::string::npos);
}

}  // namespace
}  // namespace sb::harness
