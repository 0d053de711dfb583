#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace sb::reports {

// Bad input to `stratbench report`: a message that names the file, the line and, where there
// is one, the column, value and what was expected. The CLI prints it and exits 2.
class ReportInputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// One row of a results.csv, typed. Empty numeric fields are nullopt; "nan", "inf" and "-inf"
// are read as such (a record keeps a NaN error as data, never drops it).
struct ResultRow {
  std::string file;  // where it was read, for messages
  int line = 0;

  int schemaVersion = 0;
  std::string runId, gitSha, timestampUtc, host, device, torchVersion;
  std::string backend;
  int worldSize = 0;
  std::string mesh, suite, caseName, workload, shape, dtype, inputs;
  uint64_t seed = 0;
  std::string family, strategyId, strategy, status;
  std::optional<double> maxAbsErr, maxRelErr, atol, rtol;
  std::optional<int64_t> mismatches;
  // Columns added after schema 1 first shipped; absent in older files.
  std::optional<double> errRatio;
  std::string worstTensor;
  std::vector<std::pair<std::string, double>> tensorErrRatio;
  std::vector<double> timeSamplesUs;
  std::optional<double> timeMedianUs, timeMeanUs, timeStddevUs, timeMinUs, timeMaxUs;
  int repetitions = 0;
  std::optional<int64_t> peakMemBytes, predictedMemBytes, commBytes, predictedCommBytes, commCalls;
  std::optional<double> predictedTimeUs;
  // "", or "memory", "time" and "bubble" joined by '+' in that order ("memory+time")
  std::string mispredicted;
  bool predictionsJudged = true;  // false for files written before runs judged predictions
  std::vector<std::pair<std::string, std::string>> params;  // e.g. budget -> 0.5
  std::string message;
  // Read from results.partial.csv: the run that wrote it was interrupted (or is still going).
  bool partial = false;
  // From the results.json beside the file, where there is one: where a failing row first left
  // the reference (the record's details.first_divergence, harness/run/divergence.h); null
  // otherwise.
  nlohmann::json firstDivergence;
  // From the same file: the row's communication per node and phase, counted and predicted, per
  // rank (details.comm_by_node, harness/comm/comm_site.h); null where it has none.
  nlohmann::json commByNode;
  // From the same file, a pipeline row's: its measured step's actions per rank and the dry
  // run's, each as `solve pipeline` writes a run ({"measured": ..., "predicted": ...}, from
  // details.executor.pipeline); null for other rows.
  nlohmann::json pipelineRuns;

  // What matches a row to its baseline: the same strategy on the same case and backend.
  std::string key() const {
    return suite + "\x1f" + caseName + "\x1f" + strategyId + "\x1f" + backend;
  }
  std::string where() const { return file + ":" + std::to_string(line); }
  bool isBad() const { return status == "fail" || status == "error"; }
};

// Reads a results.csv written by `stratbench run` (or a directory holding one), with Debian's
// Fast C++ CSV Parser. Throws ReportInputError for a missing file, a missing or foreign header,
// a truncated row, a value that is not a number, a status it does not know, or a schema
// version it does not read.
std::vector<ResultRow> readResults(const std::string& path);
// The CSV readResults reads for `given`: a run's folder's results.csv (its results.partial.csv
// where only that is there), or `given` itself where it is not a folder.
std::string resultsCsvPath(const std::string& given);

// Every results file given, in order, as one list. Throws ReportInputError when two rows have
// the same key (naming both places): a merge must not silently keep one of two answers.
std::vector<ResultRow> readAll(const std::vector<std::string>& paths);

}  // namespace sb::reports
