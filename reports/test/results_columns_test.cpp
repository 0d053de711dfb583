// Every column of results.csv and every key of results.json carries the field it is named for.
//
// The record below gives every field a value that no other field has, so a column written from
// the wrong field (the predicted bytes where the counted bytes belong, the calls where the
// mismatches belong) cannot pass unseen. What each column must hold is written here from the
// schema's documentation (docs/results.md: the column's name says the field), not read from
// the writer; the file is parsed by this test's own splitter, not by reports' reader, so a
// writer and a reader that agree on a swap still fail. A planted writer bug (each column in
// turn written with another column's value) shows that the check sees every column.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "reports/results_file.h"
#include "reports/test/test_rows.h"

namespace sb::reports {
namespace {

// A record whose every field holds a value of its own.
harness::Record distinctRecord() {
  harness::Record r;
  r.provenance.runId = "run-17";
  r.provenance.gitSha = "sha-19";
  r.provenance.timestampUtc = "2026-11-24T01:02:03Z";
  r.provenance.host = "host-23";
  r.provenance.device = "device-29";
  r.provenance.torchVersion = "torch-31";
  r.backend = "threads";
  r.worldSize = 37;
  r.mesh = "41x1";
  r.suite = "suite-43";
  r.caseName = "case-47";
  r.workload = "workload-53";
  r.shape = "shape-59";
  r.dtype = "float64";
  r.inputs = "exact";
  r.seed = 61;
  r.family = "sharding";
  r.strategyId = "id-67";
  r.strategy = "name-71";
  r.status = harness::Status::kFail;
  r.maxAbsErr = 0.073;
  r.maxRelErr = 0.079;
  r.mismatches = 83;
  r.atol = 0.089;
  r.rtol = 0.097;
  r.errRatio = 1.01;
  r.worstTensor = "grad_weight";
  r.tensorErrRatio = {{"output", 1.03}, {"grad_weight", 1.07}};
  r.timing = harness::TimingStats::fromSamples({109, 113, 127}, 1);
  r.repetitions = 3;
  r.peakMemBytes = 131;
  r.predictedMemBytes = 137;
  r.commBytes = 139;
  r.predictedCommBytes = 149;
  r.commCalls = 151;
  r.predictedTimeUs = 157.5;
  r.mispredicted = "memory+time";
  r.params = {{"budget", "163"}};
  r.message = "message-167";
  return r;
}

struct Expected {
  std::string column;
  std::string text;  // for text columns
  std::optional<double> number;
};

// What each column holds for `r`, by the schema's meaning of its name.
std::vector<Expected> expectedColumns(const harness::Record& r) {
  const harness::TimingStats& t = *r.timing;
  const auto text = [](std::string column, std::string value) {
    return Expected{std::move(column), std::move(value), std::nullopt};
  };
  const auto num = [](std::string column, double value) {
    return Expected{std::move(column), "", value};
  };
  std::vector<Expected> e = {
      num("schema_version", harness::kSchemaVersion),
      text("run_id", r.provenance.runId),
      text("git_sha", r.provenance.gitSha),
      text("timestamp_utc", r.provenance.timestampUtc),
      text("host", r.provenance.host),
      text("device", r.provenance.device),
      text("torch_version", r.provenance.torchVersion),
      text("backend", r.backend),
      num("world_size", r.worldSize),
      text("mesh", r.mesh),
      text("suite", r.suite),
      text("case", r.caseName),
      text("workload", r.workload),
      text("shape", r.shape),
      text("dtype", r.dtype),
      text("inputs", r.inputs),
      num("seed", static_cast<double>(r.seed)),
      text("family", r.family),
      text("strategy_id", r.strategyId),
      text("strategy", r.strategy),
      text("status", "fail"),
      num("max_abs_err", *r.maxAbsErr),
      num("max_rel_err", *r.maxRelErr),
      num("mismatches", static_cast<double>(*r.mismatches)),
      num("atol", *r.atol),
      num("rtol", *r.rtol),
      num("err_ratio", *r.errRatio),
      text("worst_tensor", r.worstTensor),
      text("tensor_err_ratio", "output=1.03;grad_weight=1.07"),
      num("time_us_median", t.medianUs),
      num("time_us_mean", t.meanUs),
      num("time_us_stddev", t.stddevUs),
      num("time_us_min", t.minUs),
      num("time_us_max", t.maxUs),
      text("time_us_samples", "109;113;127"),
      num("repetitions", r.repetitions),
      num("peak_mem_bytes", static_cast<double>(*r.peakMemBytes)),
      num("predicted_mem_bytes", static_cast<double>(*r.predictedMemBytes)),
      num("comm_bytes", static_cast<double>(*r.commBytes)),
      num("predicted_comm_bytes", static_cast<double>(*r.predictedCommBytes)),
      num("comm_calls", static_cast<double>(*r.commCalls)),
      num("predicted_time_us", *r.predictedTimeUs),
      text("mispredicted", r.mispredicted),
      text("params", "budget=163"),
      text("message", r.message),
  };
  return e;
}

// One CSV line split into fields (RFC 4180 quotes; the record's values hold no newline).
std::vector<std::string> splitCsvLine(const std::string& line) {
  std::vector<std::string> out(1);
  bool quoted = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quoted) {
      if (c == '"' && i + 1 < line.size() && line[i + 1] == '"') {
        out.back() += '"';
        ++i;
      } else if (c == '"') {
        quoted = false;
      } else {
        out.back() += c;
      }
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      out.emplace_back();
    } else {
      out.back() += c;
    }
  }
  return out;
}

// The columns of a header line and one row that do not hold what `expected` says, by name.
std::vector<std::string> columnProblems(const std::vector<std::string>& header,
                                        const std::vector<std::string>& row,
                                        const std::vector<Expected>& expected) {
  std::vector<std::string> problems;
  if (header.size() != row.size()) {
    return {"the row has " + std::to_string(row.size()) + " fields, the header " +
            std::to_string(header.size())};
  }
  for (const auto& e : expected) {
    const auto at = std::find(header.begin(), header.end(), e.column);
    if (at == header.end()) {
      problems.push_back(e.column + ": no such column");
      continue;
    }
    const std::string& got = row[static_cast<size_t>(at - header.begin())];
    if (e.number) {
      // Within the digits the writer keeps (fmtDouble: 9 significant); the fields' values
      // differ from each other by far more.
      char* end = nullptr;
      const double v = std::strtod(got.c_str(), &end);
      const bool same = !got.empty() && *end == '\0' &&
                        std::abs(v - *e.number) <= 1e-8 * std::max(1.0, std::abs(*e.number));
      if (!same) problems.push_back(e.column + ": '" + got + "'");
    } else if (got != e.text) {
      problems.push_back(e.column + ": '" + got + "'");
    }
  }
  return problems;
}

struct Written {
  std::vector<std::string> header, row;
  nlohmann::json json;
};

Written writeDistinct(const std::string& name) {
  const std::string dir = test::tempDir(name);
  const std::string csv = test::writeRun(dir, {distinctRecord()});
  std::istringstream lines(test::slurp(csv));
  std::string headerLine, rowLine;
  std::getline(lines, headerLine);
  std::getline(lines, rowLine);
  Written w{splitCsvLine(headerLine), splitCsvLine(rowLine), {}};
  w.json = nlohmann::json::parse(test::slurp(dir + "/results.json")).at("records").at(0);
  return w;
}

TEST(ResultColumns, EveryCsvColumnHoldsTheFieldItIsNamedFor) {
  const Written w = writeDistinct("columns");
  const auto expected = expectedColumns(distinctRecord());
  EXPECT_EQ(expected.size(), harness::csvColumns().size()) << "a column this test does not know";
  const auto problems = columnProblems(w.header, w.row, expected);
  EXPECT_TRUE(problems.empty()) << ::testing::PrintToString(problems);
}

TEST(ResultColumns, EveryJsonKeyHoldsTheFieldItIsNamedFor) {
  const Written w = writeDistinct("json");
  std::vector<std::string> header, row;
  std::vector<Expected> scalar;
  for (const auto& e : expectedColumns(distinctRecord())) {
    // Lists are objects and arrays in the JSON; they are compared below.
    if (e.column == "tensor_err_ratio" || e.column == "time_us_samples" || e.column == "params") {
      continue;
    }
    ASSERT_TRUE(w.json.contains(e.column)) << e.column;
    const auto& v = w.json[e.column];
    header.push_back(e.column);
    row.push_back(v.is_string() ? v.get<std::string>() : v.dump());
    scalar.push_back(e);
  }
  const auto problems = columnProblems(header, row, scalar);
  EXPECT_TRUE(problems.empty()) << ::testing::PrintToString(problems);
  EXPECT_DOUBLE_EQ(w.json["tensor_err_ratio"]["grad_weight"].get<double>(), 1.07);
  EXPECT_EQ(w.json["time_us_samples"], nlohmann::json::array({109.0, 113.0, 127.0}));
  EXPECT_EQ(w.json["params"]["budget"], "163");
}

TEST(ResultColumns, TheReaderGivesBackEveryFieldOfTheRecord) {
  const std::string dir = test::tempDir("reread");
  const harness::Record r = distinctRecord();
  const auto rows = readResults(test::writeRun(dir, {r}));
  ASSERT_EQ(rows.size(), 1u);
  const ResultRow& a = rows[0];
  EXPECT_EQ(a.runId, r.provenance.runId);
  EXPECT_EQ(a.gitSha, r.provenance.gitSha);
  EXPECT_EQ(a.host, r.provenance.host);
  EXPECT_EQ(a.device, r.provenance.device);
  EXPECT_EQ(a.worldSize, r.worldSize);
  EXPECT_EQ(a.mesh, r.mesh);
  EXPECT_EQ(a.seed, r.seed);
  EXPECT_EQ(a.status, "fail");
  EXPECT_DOUBLE_EQ(*a.maxAbsErr, *r.maxAbsErr);
  EXPECT_DOUBLE_EQ(*a.maxRelErr, *r.maxRelErr);
  EXPECT_EQ(*a.mismatches, *r.mismatches);
  EXPECT_DOUBLE_EQ(*a.atol, *r.atol);
  EXPECT_DOUBLE_EQ(*a.rtol, *r.rtol);
  EXPECT_DOUBLE_EQ(*a.errRatio, *r.errRatio);
  EXPECT_EQ(a.worstTensor, r.worstTensor);
  EXPECT_DOUBLE_EQ(*a.timeMedianUs, r.timing->medianUs);
  EXPECT_DOUBLE_EQ(*a.timeMinUs, r.timing->minUs);
  EXPECT_DOUBLE_EQ(*a.timeMaxUs, r.timing->maxUs);
  EXPECT_EQ(a.repetitions, r.repetitions);
  EXPECT_EQ(*a.peakMemBytes, *r.peakMemBytes);
  EXPECT_EQ(*a.predictedMemBytes, *r.predictedMemBytes);
  EXPECT_EQ(*a.commBytes, *r.commBytes);
  EXPECT_EQ(*a.predictedCommBytes, *r.predictedCommBytes);
  EXPECT_EQ(*a.commCalls, *r.commCalls);
  EXPECT_DOUBLE_EQ(*a.predictedTimeUs, *r.predictedTimeUs);
  EXPECT_EQ(a.mispredicted, r.mispredicted);
  EXPECT_EQ(a.params, r.params);
  EXPECT_EQ(a.message, r.message);
}

// A writer that filled one column from another column's field: every such swap is named.
TEST(ResultColumns, PlantedAColumnWrittenFromAnotherFieldIsNamedForEveryColumn) {
  const Written w = writeDistinct("planted");
  const auto expected = expectedColumns(distinctRecord());
  ASSERT_TRUE(columnProblems(w.header, w.row, expected).empty());
  int planted = 0;
  for (size_t a = 0; a < w.row.size(); ++a) {
    // The neighbour's value in column a: as a writer that took the field one line off would.
    const size_t b = (a + 1) % w.row.size();
    if (w.row[a] == w.row[b]) continue;
    std::vector<std::string> wrong = w.row;
    wrong[a] = w.row[b];
    const auto problems = columnProblems(w.header, wrong, expected);
    ++planted;
    ASSERT_EQ(problems.size(), 1u) << w.header[a] << " written from " << w.header[b];
    EXPECT_EQ(problems[0].rfind(w.header[a] + ":", 0), 0u) << problems[0];
  }
  EXPECT_EQ(planted, static_cast<int>(w.row.size())) << "every column distinct from the next";
}

}  // namespace
}  // namespace sb::reports
