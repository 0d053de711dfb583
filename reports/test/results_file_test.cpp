#include <gtest/gtest.h>

#include <cmath>
#include <regex>

#include "reports/results_file.h"
#include "reports/test/test_rows.h"

namespace sb::reports {
namespace {

using test::passRow;
using test::slurp;
using test::tempDir;
using test::writeRun;
using test::writeText;

// Runs `fn`, expecting a ReportInputError whose message matches every pattern.
template <class Fn>
void expectInputError(Fn fn, const std::vector<std::string>& patterns) {
  try {
    fn();
    ADD_FAILURE() << "expected a ReportInputError";
  } catch (const ReportInputError& e) {
    for (const auto& p : patterns) {
      EXPECT_TRUE(std::regex_search(e.what(), std::regex(p)))
          << "message '" << e.what() << "' lacks /" << p << "/";
    }
  }
}

// Replaces the first occurrence of `from` in the file's line `line` (1-based).
void editLine(const std::string& path, int line, const std::string& from, const std::string& to) {
  std::string text = slurp(path);
  size_t start = 0;
  for (int i = 1; i < line; ++i) start = text.find('\n', start) + 1;
  const size_t end = text.find('\n', start);
  std::string l = text.substr(start, end - start);
  const size_t at = l.find(from);
  ASSERT_NE(at, std::string::npos) << "'" << from << "' not on line " << line;
  l.replace(at, from.size(), to);
  writeText(path, text.substr(0, start) + l + text.substr(end));
}

TEST(ResultsFile, EveryFieldRunWritesReadsBackAsWritten) {
  const std::string dir = tempDir("roundtrip");
  harness::Record r = passRow("a,case \"quoted\"", "sharding/linear/S0R=S0R.RR/0");
  r.message = "two, fields";
  r.maxAbsErr = std::nan("");
  r.tensorErrRatio = {{"output", 0.25}, {"grad_bias", INFINITY}};
  harness::Record u = passRow("b", "x");
  u.status = harness::Status::kUnsupported;
  u.timing.reset();
  u.maxAbsErr.reset();
  u.peakMemBytes.reset();
  const auto rows = readResults(writeRun(dir, {r, u}));
  ASSERT_EQ(rows.size(), 2u);
  const ResultRow& a = rows[0];
  EXPECT_EQ(a.line, 2);
  EXPECT_EQ(a.schemaVersion, harness::kSchemaVersion);
  EXPECT_EQ(a.caseName, r.caseName);
  EXPECT_EQ(a.strategyId, r.strategyId);
  EXPECT_EQ(a.status, "pass");
  EXPECT_EQ(a.message, "two, fields");
  EXPECT_TRUE(std::isnan(*a.maxAbsErr));
  EXPECT_DOUBLE_EQ(*a.atol, 1e-5);
  EXPECT_DOUBLE_EQ(*a.errRatio, 0.01);
  ASSERT_EQ(a.tensorErrRatio.size(), 2u);
  EXPECT_EQ(a.tensorErrRatio[1].first, "grad_bias");
  EXPECT_TRUE(std::isinf(a.tensorErrRatio[1].second));
  ASSERT_EQ(a.timeSamplesUs.size(), r.timing->samplesUs.size());
  for (size_t i = 0; i < a.timeSamplesUs.size(); ++i) {
    EXPECT_DOUBLE_EQ(a.timeSamplesUs[i], r.timing->samplesUs[i]);
  }
  EXPECT_DOUBLE_EQ(*a.timeMedianUs, r.timing->medianUs);
  EXPECT_EQ(*a.peakMemBytes, 10000);
  EXPECT_EQ(*a.predictedCommBytes, 512);
  EXPECT_EQ(a.worldSize, 4);
  EXPECT_EQ(a.gitSha, "abc123");
  // Not timed, not measured: absent, never zero.
  EXPECT_FALSE(rows[1].timeMedianUs.has_value());
  EXPECT_TRUE(rows[1].timeSamplesUs.empty());
  EXPECT_FALSE(rows[1].peakMemBytes.has_value());
  EXPECT_EQ(rows[1].status, "unsupported");
}

TEST(ResultsFile, ADirectoryMeansTheResultsCsvInIt) {
  const std::string dir = tempDir("dir");
  writeRun(dir, {passRow("c", "s")});
  EXPECT_EQ(readResults(dir).size(), 1u);
}

TEST(ResultsFile, AMissingFileIsAnErrorNamingIt) {
  expectInputError([] { readResults("/nonexistent/results.csv"); },
                   {"/nonexistent/results.csv", "no such"});
}

TEST(ResultsFile, AnEmptyFileIsAnErrorNamingIt) {
  const std::string dir = tempDir("empty");
  writeText(dir + "/results.csv", "");
  expectInputError([&] { readResults(dir + "/results.csv"); }, {"results.csv", "[Hh]eader"});
}

TEST(ResultsFile, AForeignHeaderIsAnErrorNamingTheMissingColumns) {
  const std::string dir = tempDir("foreign");
  writeText(dir + "/results.csv", "name,value\nx,1\n");
  expectInputError([&] { readResults(dir + "/results.csv"); },
                   {"results.csv:1:", "lacks column", "schema_version", "stratbench results.csv"});
}

TEST(ResultsFile, AHeaderWithoutTheStatusColumnIsAnError) {
  const std::string dir = tempDir("nostatus");
  const std::string path = writeRun(dir, {passRow("c", "s")});
  editLine(path, 1, ",status,", ",state,");
  expectInputError([&] { readResults(path); }, {"results.csv:1:", "status"});
}

TEST(ResultsFile, ATruncatedRowIsAnErrorNamingTheLine) {
  const std::string dir = tempDir("truncated");
  const std::string path = writeRun(dir, {passRow("c1", "s"), passRow("c2", "s")});
  std::string text = slurp(path);
  writeText(path, text.substr(0, text.size() - text.size() / 5));  // half of the last row
  expectInputError([&] { readResults(path); }, {"results.csv", "line 3", "[Tt]oo few columns"});
}

TEST(ResultsFile, AValueThatIsNotANumberIsAnErrorNamingLineAndColumn) {
  const std::string dir = tempDir("nan_text");
  harness::Record r = passRow("c", "s");
  r.peakMemBytes = 123456789;
  const std::string path = writeRun(dir, {passRow("c0", "s"), r});
  editLine(path, 3, "123456789", "12kB");
  expectInputError([&] { readResults(path); },
                   {"results.csv:3:", "peak_mem_bytes", "'12kB'", "integer"});
}

TEST(ResultsFile, ATimeThatIsNotANumberIsAnError) {
  const std::string dir = tempDir("time_text");
  harness::Record r = passRow("c", "s", std::vector<double>(9, 77.25));
  const std::string path = writeRun(dir, {r});
  editLine(path, 2, "77.25;", "fast;");
  expectInputError([&] { readResults(path); }, {"results.csv:2:", "time_us_samples", "'fast'"});
}

// Values no run writes are refused, not compared: a NaN median is never "slower" and a
// negative peak always "improved".
TEST(ResultsFile, ANanTimeOrANegativeSizeIsRefusedNamingTheColumn) {
  const std::string dir = tempDir("impossible");
  harness::Record r = passRow("c", "s", std::vector<double>(9, 77.25));
  r.peakMemBytes = 123456789;
  const std::string path = writeRun(dir, {r});
  const std::string good = slurp(path);
  editLine(path, 2, "77.25;", "nan;");
  expectInputError([&] { readResults(path); },
                   {"results.csv:2:", "time_us_samples", "'nan'", "non-negative time"});
  writeText(path, good);
  editLine(path, 2, "123456789", "-123456789");
  expectInputError([&] { readResults(path); },
                   {"results.csv:2:", "peak_mem_bytes", "'-123456789'", "0 or more"});
  writeText(path, good);
  EXPECT_EQ(readResults(path).size(), 1u);
}

// CSV injection: text a spreadsheet would run as a formula is written with a leading
// apostrophe, and `report` reads back exactly what the run had.
TEST(ResultsFile, FormulaLikeTextIsDefusedInTheFileAndReadBackAsItWas) {
  const std::string dir = tempDir("injection");
  harness::Record r = passRow("=HYPERLINK(\"http://x\")", "s");
  r.message = "-2+3 @everyone";
  r.shape = "+1";
  const std::string path = writeRun(dir, {r});
  const std::string text = slurp(path);
  EXPECT_NE(text.find(",\"'=HYPERLINK(\"\"http://x\"\")\","), std::string::npos) << text;
  EXPECT_NE(text.find(",'-2+3 @everyone"), std::string::npos) << text;
  EXPECT_EQ(text.find(",=HYPERLINK"), std::string::npos) << text;
  const auto rows = readResults(path);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].caseName, "=HYPERLINK(\"http://x\")");
  EXPECT_EQ(rows[0].message, "-2+3 @everyone");
  EXPECT_EQ(rows[0].shape, "+1");
}

TEST(ResultsFile, AnUnknownSchemaVersionIsAnError) {
  const std::string dir = tempDir("schema");
  const std::string path = writeRun(dir, {passRow("c", "s")});
  editLine(path, 2, "1,", "2,");
  expectInputError([&] { readResults(path); }, {"results.csv:2:", "schema_version 2", "reads 1"});
}

TEST(ResultsFile, AnUnknownStatusIsAnError) {
  const std::string dir = tempDir("status");
  const std::string path = writeRun(dir, {passRow("c", "s")});
  editLine(path, 2, ",pass,", ",passed,");
  expectInputError([&] { readResults(path); }, {"results.csv:2:", "'passed'", "pass, fail"});
}

// A row's columns are checked against its record in results.json and against the per-rank
// values and samples they summarise: a summary taken from the wrong field upstream of both
// writers (the predicted peak where the measured one belongs), a value edited in one file, a
// median that is not its samples' are bad input naming the line, the column and both values.
TEST(ResultsFile, AColumnThatDisagreesWithItsRecordOrWhatItSummarisesIsBadInput) {
  const auto row = [] {
    harness::Record r = passRow("c", "s");
    r.details["peak_mem_bytes_per_rank"] = {10000, 8000};
    r.details["predicted_peak_mem_bytes_per_rank"] = {9000, 7000};
    return r;
  };
  EXPECT_EQ(readResults(writeRun(tempDir("agree"), {row()})).size(), 1u);

  harness::Record fromPredicted = row();
  fromPredicted.peakMemBytes = 9000;  // the largest predicted peak, not the largest measured
  expectInputError([&] { readResults(writeRun(tempDir("wrongfield"), {fromPredicted})); },
                   {"results.csv:2:", "'peak_mem_bytes' is 9000",
                    "largest of details.peak_mem_bytes_per_rank is 10000"});

  const std::string edited = writeRun(tempDir("edited"), {row()});
  editLine(edited, 2, ",10000,", ",12000,");
  expectInputError([&] { readResults(edited); },
                   {"results.csv:2:", "'peak_mem_bytes' is 12000", "results.json says 10000"});

  harness::Record median = row();
  median.timing->medianUs = 101.5;  // between the least and the largest, not the samples' median
  expectInputError([&] { readResults(writeRun(tempDir("median"), {median})); },
                   {"results.csv:2:", "'time_us_median' is 101.5", "samples .* give 100"});
  // A median above the largest sample comes from no run, JSON beside it or not.
  harness::Record above = row();
  above.timing->medianUs = 150;
  expectInputError([&] { readResults(writeRun(tempDir("above"), {above})); },
                   {"results.csv:2:", "'time_us_median' \\(150\\) is above 'time_us_max'"});

  // A CSV copied alone has nothing to disagree with.
  const std::string alone = tempDir("alone");
  std::filesystem::create_directories(alone);
  writeText(alone + "/results.csv", slurp(edited));
  EXPECT_EQ(readResults(alone + "/results.csv").size(), 1u);
}

// `mispredicted` names the predictions a row contradicts, joined by '+' in the order `run`
// judges them (memory, time, then an executor's own: a pipeline's bubble, checkpointing's
// held_memory, a solver's optimum); anything else is refused, naming the line and the column.
TEST(ResultsFile, MispredictedNamesTheJudgedPredictionsInTheirOrder) {
  int k = 0;
  for (const std::string m : {"", "bubble", "memory+bubble", "memory+time+bubble",
                              "held_memory+solver_optimum", "time+program_objective"}) {
    harness::Record r = passRow("c", "s");
    r.mispredicted = m;
    const auto rows = readResults(writeRun(tempDir("judged" + std::to_string(k++)), {r}));
    ASSERT_EQ(rows.size(), 1u);
    EXPECT_EQ(rows[0].mispredicted, m);
  }
  for (const std::string m : {"bubble+memory", "time+memory", "Speed!", "memory+",
                              "memory+memory", "held memory", "+time"}) {
    harness::Record r = passRow("c", "s");
    r.mispredicted = m;
    const std::string path = writeRun(tempDir("misjudged" + std::to_string(k++)), {r});
    expectInputError([&] { readResults(path); }, {"results.csv:2:", "mispredicted"});
  }
}

TEST(ResultsFile, TheSameRowInTwoFilesIsAnErrorNamingBoth) {
  const std::string a = tempDir("dup_a"), b = tempDir("dup_b");
  writeRun(a, {passRow("c", "s")});
  writeRun(b, {passRow("c", "s")});
  expectInputError([&] { readAll({a, b}); }, {"dup_b.*results.csv:2", "dup_a.*results.csv:2"});
}

}  // namespace
}  // namespace sb::reports
