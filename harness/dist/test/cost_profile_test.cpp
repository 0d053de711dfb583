// The calibration profile: nccl-tests' bus factors, the latency/bandwidth fit, pricing a step's
// collectives per group, and malformed files named by key.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "harness/dist/cost_profile.h"
#include "harness/run/suite.h"

namespace sb::harness {
namespace {

TEST(CostProfile, BusFactorsAreNcclTests) {
  EXPECT_DOUBLE_EQ(CostProfile::busFactor(Collective::kAllReduce, 4), 1.5);
  EXPECT_DOUBLE_EQ(CostProfile::busFactor(Collective::kAllGather, 4), 0.75);
  EXPECT_DOUBLE_EQ(CostProfile::busFactor(Collective::kReduceScatter, 2), 0.5);
  EXPECT_DOUBLE_EQ(CostProfile::busFactor(Collective::kAllToAll, 8), 7.0 / 8);
  EXPECT_DOUBLE_EQ(CostProfile::busFactor(Collective::kBroadcast, 4), 1.0);
  EXPECT_DOUBLE_EQ(CostProfile::busFactor(Collective::kAllReduce, 1), 0.0);
}

TEST(CostProfile, FitRecoversLatencyAndBandwidth) {
  // t = 50 us + bytes / (2 GB/s): 2 GB/s is 5e-4 us per byte.
  std::vector<CostProfile::Point> pts;
  for (int64_t b : {1024, 8192, 65536, 1 << 20, 1 << 22}) pts.push_back({b, 50 + 5e-4 * b, 0, 0});
  const auto f = CostProfile::fit(pts);
  EXPECT_NEAR(f.latencyUs, 50, 1e-6);
  EXPECT_NEAR(f.usPerByte, 5e-4, 1e-12);
  EXPECT_NEAR(f.predictUs(1 << 21), 50 + 5e-4 * (1 << 21), 1e-6);
}

TEST(CostProfile, FitNeverGoesNegative) {
  // Time falling with size (noise): all latency, no negative slope.
  auto f = CostProfile::fit({{1024, 100, 0, 0}, {1 << 20, 80, 0, 0}});
  EXPECT_EQ(f.usPerByte, 0);
  EXPECT_NEAR(f.latencyUs, (100.0 / 1024 + 80.0 / (1 << 20)) / (1.0 / 1024 + 1.0 / (1 << 20)),
              1e-9);
  // A line through a negative intercept: refit through the origin.
  f = CostProfile::fit({{1000, 1, 0, 0}, {2000, 3, 0, 0}});
  EXPECT_EQ(f.latencyUs, 0);
  EXPECT_GT(f.usPerByte, 0);
}

CostProfile sample() {
  CostProfile p;
  p.backend = "gloo";
  p.mesh = "2x2";
  p.groups["0"].size = 2;
  p.groups["0"].collectives[Collective::kAllReduce] = {10, 0.001, {}};
  p.groups["1"].size = 2;
  p.groups["1"].collectives[Collective::kBroadcast] = {5, 0.001, {}};
  p.groups["0,1"].size = 4;
  p.groups["0,1"].collectives[Collective::kAllReduce] = {20, 0.002, {}};
  p.groups["0,1"].collectives[Collective::kAllToAll] = {30, 0.004, {}};
  p.gemm = {1, 1e-4, {}};
  return p;
}

TEST(CostProfile, PricesEachGroupWithItsOwnFit) {
  CostProfile p = sample();
  p.groups.erase("1");
  CommStats s;
  s.add(Collective::kAllReduce, 1000);
  s.add(Collective::kAllReduce, 3000);
  EXPECT_NEAR(*p.commUs({0}, s), 2 * 10 + 0.001 * 4000, 1e-9);
  EXPECT_NEAR(*p.commUs({0, 1}, s), 2 * 20 + 0.002 * 4000, 1e-9);
  EXPECT_NEAR(*p.commUs({1, 0}, s), *p.commUs({0, 1}, s), 1e-12);  // same members
  EXPECT_FALSE(p.commUs({1}, s).has_value());                      // group not measured
  CommStats b;
  b.add(Collective::kBroadcast, 64);
  EXPECT_FALSE(p.commUs({0}, b).has_value());  // collective not measured
  CommStats one;
  one.add(Collective::kAllReduce, 0);  // a group of one moves nothing
  EXPECT_EQ(*p.commUs({1}, one), 0);
}

TEST(CostProfile, JsonRoundTripAndErrorsNameTheKey) {
  const CostProfile p = sample();
  const CostProfile q = CostProfile::fromJson(p.toJson(), "p.json");
  EXPECT_EQ(q.mesh, "2x2");
  EXPECT_EQ(q.groups.at("0,1").size, 4);
  EXPECT_DOUBLE_EQ(q.groups.at("0,1").collectives.at(Collective::kAllToAll).usPerByte, 0.004);
  EXPECT_DOUBLE_EQ(q.gemm.latencyUs, 1);

  const auto errorOf = [](const nlohmann::json& j) {
    try {
      CostProfile::fromJson(j, "p.json");
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  nlohmann::json j = p.toJson();
  j["groups"]["0"].erase("size");
  EXPECT_EQ(errorOf(j), "p.json: groups.0: missing key 'size'");
  j = p.toJson();
  j["groups"]["0"]["collectives"]["all_reduce"]["latency_us"] = -1;
  EXPECT_NE(errorOf(j).find("groups.0.all_reduce: key 'latency_us' must be a number of "
                            "microseconds from 0 to 1e+09, got -1"),
            std::string::npos);
  j = p.toJson();
  j["groups"]["0"]["collectives"]["allreduce"] = j["groups"]["0"]["collectives"]["all_reduce"];
  EXPECT_NE(errorOf(j).find("unknown collective 'allreduce'"), std::string::npos);
  j = p.toJson();
  j["schema_version"] = 2;
  EXPECT_NE(errorOf(j).find("schema_version 2"), std::string::npos);
  j = p.toJson();
  j["mesh"] = 4;
  EXPECT_NE(errorOf(j).find("key 'mesh' has the wrong type"), std::string::npos);
}

// Issue 34: what a conversion or a missing check let through.
TEST(CostProfile, RefusesAVersionThatOnlyConvertsToOneAMissingGroupAndHugeCosts) {
  const auto errorOf = [](const nlohmann::json& j) {
    try {
      CostProfile::fromJson(j, "p.json");
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  nlohmann::json j = sample().toJson();
  ASSERT_EQ(errorOf(j), "");  // the whole profile is read
  j["schema_version"] = 1.9;
  EXPECT_NE(errorOf(j).find("schema_version 1.9 is not 1"), std::string::npos) << errorOf(j);
  j["schema_version"] = 4294967297;
  EXPECT_NE(errorOf(j).find("schema_version 4294967297 is not 1"), std::string::npos);
  j = sample().toJson();
  j["groups"].erase("1");
  EXPECT_NE(errorOf(j).find("group \"1\" of mesh 2x2 is missing"), std::string::npos) << errorOf(j);
  j = sample().toJson();
  j["groups"]["2"] = j["groups"]["1"];
  EXPECT_NE(errorOf(j).find("groups.2: not a group of mesh 2x2"), std::string::npos);
  j = sample().toJson();
  j["groups"]["0,1"]["size"] = 3;
  EXPECT_NE(errorOf(j).find("size 3 is not 4"), std::string::npos);
  j = sample().toJson();
  j["groups"]["0"]["collectives"]["all_reduce"]["latency_us"] = 1e308;
  EXPECT_NE(errorOf(j).find("key 'latency_us' must be a number"), std::string::npos);
  j = sample().toJson();
  j["groups"]["0"]["collectives"]["all_reduce"]["us_per_byte"] = 1e300;
  EXPECT_NE(errorOf(j).find("key 'us_per_byte' must be a number"), std::string::npos);
  // At the bounds, the dearest step a plan can name is still finite.
  j = sample().toJson();
  j["groups"]["0"]["collectives"]["all_reduce"]["latency_us"] = 1e9;
  j["groups"]["0"]["collectives"]["all_reduce"]["us_per_byte"] = 1e3;
  const CostProfile q = CostProfile::fromJson(j, "p.json");
  CommStats s;
  s.add(Collective::kAllReduce, int64_t{1} << 62);
  EXPECT_TRUE(std::isfinite(*q.commUs({0}, s)));
}

TEST(CostProfile, LocalCopiesAndTheStepOverheadAreOptionalAndRoundTrip) {
  CostProfile p = sample();
  // An older profile has neither: no local work costs nothing, any local work is unpriced.
  EXPECT_EQ(p.localUs({}), 0.0);
  EXPECT_FALSE(p.localUs({2, 1000}));
  EXPECT_FALSE(CostProfile::fromJson(p.toJson(), "p.json").stepUs);
  // 3 us per copy and 1 GB/s (1e-3 us per byte): two copies writing 1000 bytes take 7 us.
  p.copy = CostProfile::Fit{3, 1e-3, {}};
  p.stepUs = 90;
  EXPECT_DOUBLE_EQ(*p.localUs({2, 1000}), 7.0);
  const CostProfile q = CostProfile::fromJson(p.toJson(), "p.json");
  ASSERT_TRUE(q.copy && q.stepUs);
  EXPECT_DOUBLE_EQ(q.copy->latencyUs, 3);
  EXPECT_DOUBLE_EQ(*q.stepUs, 90);
  nlohmann::json j = p.toJson();
  j["step_overhead_us"] = -5;
  try {
    CostProfile::fromJson(j, "p.json");
    FAIL() << "a negative step overhead was accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("step_overhead_us"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace sb::harness
