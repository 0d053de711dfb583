// Suite files: what a valid one gives, and that every malformed one is rejected with the file,
// line and key.

#include <gtest/gtest.h>

#include "harness/suite.h"

namespace sb::harness {
namespace {

std::string errorOf(const std::string& yaml) {
  try {
    parseSuite(yaml, "bad.yaml");
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

const char* kValid = R"(suite: demo
defaults:
  dtype: float64
  repetitions: 3
cases:
  - name: a
    workload: linear
    shape: {input: [4, 16], out_features: 8}
    mesh: 2x2
    strategies: ["sharding/linear/.*"]
  - name: b
    workload: linear
    shape: {input: [4, 16], out_features: 8, bias: false}
    mesh: [4]
    dtype: bfloat16
    inputs: exact
    strategies: sharding/linear/RR=RR.RR
)";

TEST(Suite, AValidSuiteAppliesDefaultsAndCaseOverrides) {
  const Suite s = parseSuite(kValid, "demo.yaml");
  EXPECT_EQ(s.name, "demo");
  ASSERT_EQ(s.cases.size(), 2u);
  EXPECT_EQ(s.cases[0].dtype, at::kDouble);
  EXPECT_EQ(s.cases[0].repetitions, 3);
  EXPECT_EQ(s.cases[0].mesh, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(s.cases[0].line, 6);
  EXPECT_EQ(s.cases[1].dtype, at::kBFloat16);
  EXPECT_EQ(s.cases[1].mesh, (std::vector<int64_t>{4}));
  EXPECT_EQ(s.cases[1].inputs, reference::InputMode::kExact);
  EXPECT_EQ(s.cases[1].strategies, (std::vector<std::string>{"sharding/linear/RR=RR.RR"}));
  EXPECT_EQ(s.cases[1].shape["bias"], false);
}

TEST(Suite, InvalidYamlNamesTheLine) {
  const auto e = errorOf("cases:\n  - name: [unclosed\n");
  EXPECT_NE(e.find("bad.yaml:"), std::string::npos) << e;
  EXPECT_NE(e.find("not valid YAML"), std::string::npos) << e;
}

TEST(Suite, AnUnknownKeyNamesTheFileLineAndKey) {
  const auto e = errorOf(
      "cases:\n  - name: a\n    workload: linear\n    shape: {input: [4, 4], "
      "out_features: 2}\n    mesh: 4\n    strategy: [x]\n");
  EXPECT_NE(e.find("bad.yaml:6"), std::string::npos) << e;
  EXPECT_NE(e.find("unknown key 'strategy'"), std::string::npos) << e;
}

TEST(Suite, AMissingKeyIsNamed) {
  const auto e = errorOf(
      "cases:\n  - name: a\n    workload: linear\n    shape: {input: [4, 4], "
      "out_features: 2}\n    strategies: [x]\n");
  EXPECT_NE(e.find("bad.yaml:2"), std::string::npos) << e;
  EXPECT_NE(e.find("missing key 'mesh'"), std::string::npos) << e;
}

TEST(Suite, BadValuesNameTheKeyAndValue) {
  const std::string head = "cases:\n  - name: a\n    workload: linear\n    strategies: [x]\n";
  const std::string shape = "    shape: {input: [4, 4], out_features: 2}\n";
  auto e = errorOf(head + shape + "    mesh: 2y2\n");
  EXPECT_NE(e.find("bad.yaml:6"), std::string::npos) << e;
  EXPECT_NE(e.find("key 'mesh'"), std::string::npos) << e;
  e = errorOf(head + shape + "    mesh: 4\n    dtype: float8\n");
  EXPECT_NE(e.find("bad.yaml:7"), std::string::npos) << e;
  EXPECT_NE(e.find("unknown dtype 'float8'"), std::string::npos) << e;
  e = errorOf(head + shape + "    mesh: 4\n    repetitions: many\n");
  EXPECT_NE(e.find("key 'repetitions' must be a positive integer, got 'many'"), std::string::npos)
      << e;
  e = errorOf(head + shape + "    mesh: 4\n    inputs: integers\n");
  EXPECT_NE(e.find("key 'inputs' must be random or exact"), std::string::npos) << e;
}

TEST(Suite, AWrongShapeNamesTheShapeKey) {
  const std::string head =
      "cases:\n  - name: a\n    workload: linear\n    strategies: [x]\n"
      "    mesh: 4\n";
  auto e = errorOf(head + "    shape: {input: [4, 4]}\n");
  EXPECT_NE(e.find("bad.yaml:6"), std::string::npos) << e;
  EXPECT_NE(e.find("'out_features' is missing"), std::string::npos) << e;
  e = errorOf(head + "    shape: {input: [4, -4], out_features: 2}\n");
  EXPECT_NE(e.find("'input' must hold positive integers"), std::string::npos) << e;
  e = errorOf(head + "    shape: {input: [4, 4], out_features: 2, heads: 3}\n");
  EXPECT_NE(e.find("unknown shape key 'heads'"), std::string::npos) << e;
}

TEST(Suite, UnknownWorkloadDuplicateNamesAndNoCasesAreRejected) {
  EXPECT_NE(errorOf("cases:\n  - name: a\n    workload: conv\n").find("unknown workload 'conv'"),
            std::string::npos);
  EXPECT_NE(errorOf("suite: x\n").find("key 'cases' is missing"), std::string::npos);
  EXPECT_NE(errorOf("cases: []\n").find("non-empty list"), std::string::npos);
  const std::string c =
      "  - name: a\n    workload: linear\n    shape: {input: [4, 4], "
      "out_features: 2}\n    mesh: 4\n    strategies: [x]\n";
  EXPECT_NE(errorOf("cases:\n" + c + c).find("case name 'a' is used twice"), std::string::npos);
  EXPECT_NE(errorOf("sweet: smoke\ncases:\n" + c).find("unknown top-level key 'sweet'"),
            std::string::npos);
}

TEST(Suite, AMissingFileIsAnInputError) {
  EXPECT_THROW(loadSuite("/nonexistent/suite.yaml"), InputError);
}

}  // namespace
}  // namespace sb::harness
