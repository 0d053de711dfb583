// Reading a run's results: results.csv parsed row by row (every column checked as `run` writes
// it), then the results.json beside it attached and checked against the rows. Whole, for now:
// the two readers share the row type and the error wording, and the fuzz target `results`
// compiles this file as one reader. The seam where it could be cut: checkAgreement and
// attachDetails (the JSON half) into a file of their own, the fuzz target taking both.

#include "reports/results_file.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <iomanip>
#include <iterator>
#include <map>
#include <set>
#include <sstream>
#include <tuple>
#include <utility>

// Line by line, on this thread: result files are small and a reader thread buys nothing.
#define CSV_IO_NO_THREAD
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstringop-truncation"  // the parser's file-name copy
#include <libfccp/csv.h>
#pragma GCC diagnostic pop

#include "harness/comm/mesh.h"
#include "harness/hidden_text.h"
#include "harness/in_file.h"
#include "harness/measure/timing.h"
#include "harness/parse_number.h"
#include "harness/run/predict.h"
#include "harness/run/records.h"
#include "harness/strategy.h"

namespace sb::reports {
namespace {

// Every column `run` writes: the parser needs the count at compile time.
constexpr const auto& kColumns = harness::kCsvColumns;
constexpr size_t kN = kColumns.size();

// "2026-11-29T13:05:09Z", as `run` writes the time a run started (UTC, to the second): runs
// are ordered by it, and a text that is no such time would order them as text.
bool validTimestamp(const std::string& t) {
  if (t.size() != 20) return false;
  for (size_t i = 0; i < t.size(); ++i) {
    const char want = i == 4 || i == 7     ? '-'
                      : i == 10            ? 'T'
                      : i == 13 || i == 16 ? ':'
                      : i == 19            ? 'Z'
                                           : '0';
    if (want == '0' ? !(t[i] >= '0' && t[i] <= '9') : t[i] != want) return false;
  }
  const auto num = [&](size_t at) { return (t[at] - '0') * 10 + (t[at + 1] - '0'); };
  return num(5) >= 1 && num(5) <= 12 && num(8) >= 1 && num(8) <= 31 && num(11) <= 23 &&
         num(14) <= 59 && num(17) <= 60;
}

// The names of the predictions a row contradicts, joined by '+' as `run` judges them: memory,
// then time, then the executor's own claims (a pipeline's bubble, checkpointing's held_memory,
// a solver's optimum), each a lower-case name, none twice.
bool validMispredicted(const std::string& m) {
  if (m.empty()) return true;
  std::set<std::string> seen;
  size_t at = 0, index = 0;
  while (at <= m.size()) {
    const size_t plus = std::min(m.find('+', at), m.size());
    const std::string part = m.substr(at, plus - at);
    if (!harness::validPredictionName(part)) return false;
    if (!seen.insert(part).second) return false;
    // memory only first; time only first or after memory.
    if (part == "memory" && index != 0) return false;
    if (part == "time" && index > (seen.count("memory") ? 1u : 0u)) return false;
    ++index;
    at = plus + 1;
  }
  return true;
}

// Added to schema 1 after it first shipped (adding a column is compatible): a file without
// them still reads, it just cannot be gated on per-repetition times or per-tensor errors.
bool isOptional(const std::string& c) {
  return c == "err_ratio" || c == "worst_tensor" || c == "tensor_err_ratio" ||
         c == "time_us_samples" || c == "predicted_time_us" || c == "params" || c == "mispredicted";
}

using Reader = io::CSVReader<kN, io::trim_chars<' ', '\t'>, io::double_quote_escape<',', '"'>>;

template <size_t... I>
void readHeader(Reader& r, std::index_sequence<I...>) {
  r.read_header(io::ignore_extra_column | io::ignore_missing_column, kColumns[I]...);
}

template <size_t... I>
bool readRow(Reader& r, std::array<std::string, kN>& f, std::index_sequence<I...>) {
  return r.read_row(f[I]...);
}

// Field access by column name for one row, with errors naming the file, line and column.
class Fields {
 public:
  Fields(const std::array<std::string, kN>& f, std::string where)
      : f_(f), where_(std::move(where)) {}

  // The field as the run wrote the value: a text field's CSV-injection apostrophe removed.
  std::string str(const char* col) const { return harness::csvTextValue(f_[index(col)]); }

  std::optional<double> optDouble(const char* col) const {
    const std::string& s = str(col);
    if (s.empty()) return std::nullopt;
    return toDouble(s, col);
  }

  std::optional<int64_t> optInt(const char* col) const {
    const std::string& s = str(col);
    if (s.empty()) return std::nullopt;
    errno = 0;
    char* end = nullptr;
    const long long v = std::strtoll(s.c_str(), &end, 10);
    if (errno != 0 || end == s.c_str() || *end != '\0') bad(col, s, "an integer");
    return v;
  }

  int64_t requiredInt(const char* col) const {
    auto v = optInt(col);
    if (!v) bad(col, "", "an integer");
    return *v;
  }

  // An integer a run writes within [lo, hi] (a world of 0 ranks, or -1 repetitions, comes
  // from no run and would divide or index by it downstream).
  int64_t requiredInt(const char* col, int64_t lo, int64_t hi, const char* expected) const {
    const int64_t v = requiredInt(col);
    if (v < lo || v > hi) bad(col, str(col), expected);
    return v;
  }

  // A seed: any 64-bit unsigned number (`run --seed` takes up to 2^64 - 1), digits only.
  uint64_t requiredSeed(const char* col) const {
    const std::string& s = str(col);
    uint64_t v = 0;
    if (!harness::parseWholeNumber(s, 0, UINT64_MAX, &v)) {
      bad(col, s, "a seed, a whole number from 0 to 2^64 - 1");
    }
    return v;
  }

  // A time, a count or a size a run writes: finite and not negative. NaN or a negative value
  // cannot come from `stratbench run`, and read as numbers they would pass the gate's
  // comparisons (a NaN time is never "slower"), so they are refused, naming the column.
  std::optional<double> optTime(const char* col) const {
    const auto v = optDouble(col);
    if (v && !(std::isfinite(*v) && *v >= 0)) {
      bad(col, str(col), "a finite, non-negative time (no run writes this)");
    }
    return v;
  }
  double time(const std::string& s, const char* col) const {
    const double v = toDouble(s, col);
    if (!(std::isfinite(v) && v >= 0))
      bad(col, s, "a finite, non-negative time (no run writes this)");
    return v;
  }
  // An error, a tolerance or their ratio: 0 or more, or NaN / infinity (a diverged row's);
  // a negative one comes from no run and would pass every "within tolerance" comparison.
  std::optional<double> optMagnitude(const char* col) const {
    const auto v = optDouble(col);
    if (v && *v < 0) bad(col, str(col), "0 or more (no run writes a negative one)");
    return v;
  }
  std::optional<int64_t> optCount(const char* col) const {
    const auto v = optInt(col);
    if (v && *v < 0) bad(col, str(col), "a count of 0 or more (no run writes this)");
    return v;
  }

  double toDouble(const std::string& s, const char* col) const {
    if (s == "nan" || s == "-nan") return std::nan("");
    if (s == "inf") return INFINITY;
    if (s == "-inf") return -INFINITY;
    errno = 0;
    char* end = nullptr;
    const double v = std::strtod(s.c_str(), &end);
    if (errno == ERANGE || end == s.c_str() || *end != '\0') bad(col, s, "a number");
    return v;
  }

  [[noreturn]] void bad(const char* col, const std::string& value, const char* expected) const {
    throw ReportInputError(where_ + ": column '" + col + "': '" + value + "' is not " + expected);
  }

  const std::string& where() const { return where_; }

 private:
  static size_t index(const char* col) {
    for (size_t i = 0; i < kN; ++i) {
      if (std::string(kColumns[i]) == col) return i;
    }
    throw std::logic_error(std::string("reports: unknown column ") + col);
  }
  const std::array<std::string, kN>& f_;
  std::string where_;
};

std::vector<std::string> splitList(const std::string& s) {
  std::vector<std::string> out;
  if (s.empty()) return out;
  size_t start = 0;
  while (true) {
    const size_t pos = s.find(harness::kListSeparator, start);
    out.push_back(s.substr(start, pos == std::string::npos ? std::string::npos : pos - start));
    if (pos == std::string::npos) break;
    start = pos + 1;
  }
  return out;
}

ResultRow parseRow(const Fields& f, const std::string& file, int line) {
  ResultRow r;
  r.file = file;
  r.line = line;
  r.schemaVersion = static_cast<int>(f.requiredInt("schema_version"));
  if (r.schemaVersion != harness::kSchemaVersion) {
    throw ReportInputError(f.where() + ": schema_version " + std::to_string(r.schemaVersion) +
                           " is not one this stratbench reads (it reads " +
                           std::to_string(harness::kSchemaVersion) + ")");
  }
  r.runId = f.str("run_id");
  r.gitSha = f.str("git_sha");
  r.timestampUtc = f.str("timestamp_utc");
  r.host = f.str("host");
  r.device = f.str("device");
  r.torchVersion = f.str("torch_version");
  r.backend = f.str("backend");
  r.worldSize = static_cast<int>(
      f.requiredInt("world_size", 1, 1 << 20, "a number of ranks from 1 (no run writes this)"));
  r.mesh = f.str("mesh");
  try {  // a mesh as a case names it ("2x2"), of at most the ranks a mesh may have
    harness::DeviceMesh::parseShape(r.mesh);
  } catch (const std::exception&) {
    f.bad("mesh", r.mesh, "a mesh as run writes it (4, 2x2: sizes from 1, at most 65,536 ranks)");
  }
  r.suite = f.str("suite");
  r.caseName = f.str("case");
  r.workload = f.str("workload");
  r.shape = f.str("shape");
  r.dtype = f.str("dtype");
  r.inputs = f.str("inputs");
  r.seed = f.requiredSeed("seed");
  r.family = f.str("family");
  r.strategyId = f.str("strategy_id");
  r.strategy = f.str("strategy");
  r.status = f.str("status");
  static const std::array<const char*, 5> kStatuses = {"pass", "fail", "error", "unsupported",
                                                       "skipped"};
  if (std::find(kStatuses.begin(), kStatuses.end(), r.status) == kStatuses.end()) {
    throw ReportInputError(f.where() + ": column 'status': '" + r.status +
                           "' is not one of pass, fail, error, unsupported, skipped");
  }
  // Text that reaches report.md, report.html, the CSVs and the console: nothing a terminal or
  // a page would act on (the suite reader refuses these in names; a CSV edited apart from it
  // carried them through, an OSC-8 link and a screen clear among them).
  for (const char* col : {"suite",         "case",         "strategy_id",
                          "strategy",      "workload",     "backend",
                          "mesh",          "family",       "dtype",
                          "inputs",        "run_id",       "git_sha",
                          "host",          "device",       "torch_version",
                          "timestamp_utc", "worst_tensor", "message",
                          "shape",         "params",       "tensor_err_ratio",
                          "mispredicted",  "status"}) {
    const std::string c = col;
    const harness::TextKind kind = c == "message" ? harness::TextKind::kText
                                   : c == "suite" || c == "case" || c == "strategy_id"
                                       ? harness::TextKind::kName
                                       : harness::TextKind::kLine;
    if (const auto hidden = harness::hiddenCharacter(f.str(col), kind)) {
      throw ReportInputError(f.where() + ": column '" + col + "' holds " + hidden.text() +
                             ", which no run writes there (a terminal or a page would act on it)");
    }
  }
  if (!validTimestamp(r.timestampUtc)) {
    f.bad("timestamp_utc", r.timestampUtc,
          "a UTC time as run writes it, e.g. 2026-11-29T13:05:09Z");
  }
  if (r.suite.empty() || r.caseName.empty() || r.strategyId.empty() || r.runId.empty()) {
    throw ReportInputError(f.where() + ": suite, case, strategy_id and run_id must not be empty");
  }
  // Values `run` writes from closed sets (a backend, a family, the case's inputs): anything
  // else comes from an edit, and would be compared as a key no run has.
  const auto oneOf = [&](const char* col, const std::string& value,
                         const std::vector<std::string>& allowed) {
    if (std::find(allowed.begin(), allowed.end(), value) != allowed.end()) return;
    std::string list;
    for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
    f.bad(col, value, ("one of " + list).c_str());
  };
  oneOf("backend", r.backend, {"threads", "gloo", "nccl"});
  if (!r.family.empty()) oneOf("family", r.family, harness::familyNames());
  if (!r.inputs.empty()) oneOf("inputs", r.inputs, {"random", "exact"});
  // The names `run` writes (harness::dtypeName), or nothing on a row that never built its case.
  if (static const std::array<const char*, 4> kDtypes = {"float32", "float64", "float16",
                                                         "bfloat16"};
      !r.dtype.empty() && std::find(kDtypes.begin(), kDtypes.end(), r.dtype) == kDtypes.end()) {
    f.bad("dtype", r.dtype, "one of float32, float64, float16, bfloat16");
  }
  r.maxAbsErr = f.optMagnitude("max_abs_err");
  r.maxRelErr = f.optMagnitude("max_rel_err");
  r.mismatches = f.optCount("mismatches");
  r.atol = f.optMagnitude("atol");
  r.rtol = f.optMagnitude("rtol");
  r.errRatio = f.optMagnitude("err_ratio");
  r.worstTensor = f.str("worst_tensor");
  for (const auto& item : splitList(f.str("tensor_err_ratio"))) {
    const size_t eq = item.rfind('=');
    if (eq == std::string::npos || eq == 0) f.bad("tensor_err_ratio", item, "tensor=number");
    const double ratio = f.toDouble(item.substr(eq + 1), "tensor_err_ratio");
    if (ratio < 0) f.bad("tensor_err_ratio", item, "a ratio of 0 or more (no run writes this)");
    r.tensorErrRatio.emplace_back(item.substr(0, eq), ratio);
  }
  for (const auto& item : splitList(f.str("time_us_samples"))) {
    r.timeSamplesUs.push_back(f.time(item, "time_us_samples"));
  }
  r.timeMedianUs = f.optTime("time_us_median");
  r.timeMeanUs = f.optTime("time_us_mean");
  r.timeStddevUs = f.optTime("time_us_stddev");
  r.timeMinUs = f.optTime("time_us_min");
  r.timeMaxUs = f.optTime("time_us_max");
  // The least, the median and the largest of one set of samples come in that order.
  for (const auto& [low, lowCol, high, highCol] :
       {std::tuple{r.timeMinUs, "time_us_min", r.timeMedianUs, "time_us_median"},
        std::tuple{r.timeMedianUs, "time_us_median", r.timeMaxUs, "time_us_max"},
        std::tuple{r.timeMinUs, "time_us_min", r.timeMaxUs, "time_us_max"}}) {
    if (low && high && *low > *high) {
      throw ReportInputError(f.where() + ": column '" + lowCol + "' (" + f.str(lowCol) +
                             ") is above '" + highCol + "' (" + f.str(highCol) +
                             "): no run writes this");
    }
  }
  r.repetitions = static_cast<int>(f.requiredInt(
      "repetitions", 0, INT32_MAX, "a count of repetitions, 0 or more (no run writes this)"));
  // A timed row has one sample per repetition (Google Benchmark's repetitions); a row that was
  // not timed has none.
  if (!r.timeSamplesUs.empty() && r.timeSamplesUs.size() != static_cast<size_t>(r.repetitions)) {
    throw ReportInputError(
        f.where() + ": column 'time_us_samples' holds " + std::to_string(r.timeSamplesUs.size()) +
        " sample(s) but 'repetitions' is " + std::to_string(r.repetitions) +
        ": a run writes one sample per repetition, or none (no run writes this)");
  }
  r.peakMemBytes = f.optCount("peak_mem_bytes");
  r.predictedMemBytes = f.optCount("predicted_mem_bytes");
  r.commBytes = f.optCount("comm_bytes");
  r.predictedCommBytes = f.optCount("predicted_comm_bytes");
  r.commCalls = f.optCount("comm_calls");
  r.predictedTimeUs = f.optTime("predicted_time_us");
  r.mispredicted = f.str("mispredicted");
  if (!validMispredicted(r.mispredicted)) {
    f.bad("mispredicted", r.mispredicted,
          "empty (none missed), or the names of the predictions that missed joined by '+', "
          "memory and time first (memory+time+bubble)");
  }
  for (const auto& item : splitList(f.str("params"))) {
    const size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0) f.bad("params", item, "key=value");
    r.params.emplace_back(item.substr(0, eq), item.substr(eq + 1));
  }
  r.message = f.str("message");
  return r;
}

// A row's columns against its record in the results.json beside it (`run` writes both from one
// record, by two writers) and its summaries against the per-rank values and samples they
// summarise: a column written from the wrong field, or a file edited or damaged apart from
// the other, is bad input naming the line, the column and both values, never a report of
// numbers that are not the run's.
void checkAgreement(const ResultRow& row, const nlohmann::json& rec, const std::string& json) {
  const auto disagree = [&](const std::string& column, const std::string& csvValue,
                            const std::string& other) {
    throw ReportInputError(row.where() + ": column '" + column + "' is " + csvValue + ", but " +
                           other +
                           ": the results disagree (a file edited or damaged, or a "
                           "column written from another field)");
  };
  const auto show = [](const auto& v) -> std::string {
    if (!v) return "empty";
    std::ostringstream s;
    s << std::setprecision(12) << *v;
    return s.str();
  };
  const auto same = [](double a, double b) {
    if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
    if (std::isinf(a) || std::isinf(b)) return a == b;
    // %.9g in the CSV: a value, and a median of such values, within a few units of the 9th digit
    return std::abs(a - b) <= 1e-7 * std::max(std::abs(a), std::abs(b));
  };
  const auto numberOf = [](const nlohmann::json& v) -> std::optional<double> {
    if (v.is_number()) return v.get<double>();
    if (v.is_string()) {  // a NaN or an infinity, as the JSON writer keeps them
      const std::string s = v.get<std::string>();
      if (s == "nan") return std::nan("");
      if (s == "inf") return INFINITY;
      if (s == "-inf") return -INFINITY;
    }
    return std::nullopt;
  };
  const auto field = [&](const char* column, const auto& csv) {
    if (!rec.contains(column)) return;
    const std::optional<double> j = numberOf(rec.at(column));
    const std::optional<double> c =
        csv ? std::optional<double>(static_cast<double>(*csv)) : std::nullopt;
    if (c.has_value() != j.has_value() || (c && !same(*c, *j))) {
      disagree(column, show(c), json + " says " + show(j));
    }
  };
  field("mismatches", row.mismatches);
  field("max_abs_err", row.maxAbsErr);
  field("time_us_median", row.timeMedianUs);
  field("time_us_min", row.timeMinUs);
  field("time_us_max", row.timeMaxUs);
  field("peak_mem_bytes", row.peakMemBytes);
  field("predicted_mem_bytes", row.predictedMemBytes);
  field("comm_bytes", row.commBytes);
  field("predicted_comm_bytes", row.predictedCommBytes);
  field("comm_calls", row.commCalls);
  field("predicted_time_us", row.predictedTimeUs);
  for (const auto& [column, csv] :
       {std::pair<const char*, const std::string*>{"status", &row.status},
        {"mispredicted", &row.mispredicted}}) {
    if (rec.contains(column) && rec.at(column).is_string() && rec.at(column) != *csv) {
      disagree(column, "'" + *csv + "'", json + " says " + rec.at(column).dump());
    }
  }
  // The summaries against what they summarise: the peak and its prediction are the largest
  // rank's; the median, least and largest time are the samples'.
  const nlohmann::json& d = rec.at("details");
  const auto largest = [&](const char* key) -> std::optional<double> {
    if (!d.contains(key) || !d.at(key).is_array() || d.at(key).empty()) return std::nullopt;
    double m = -INFINITY;
    for (const auto& v : d.at(key)) {
      if (!v.is_number()) return std::nullopt;
      m = std::max(m, v.get<double>());
    }
    return m;
  };
  if (const auto m = largest("peak_mem_bytes_per_rank");
      m && row.peakMemBytes && !same(*m, *row.peakMemBytes)) {
    disagree("peak_mem_bytes", show(row.peakMemBytes),
             "the largest of details.peak_mem_bytes_per_rank is " + show(m));
  }
  if (const auto m = largest("predicted_peak_mem_bytes_per_rank");
      m && row.predictedMemBytes && !same(*m, *row.predictedMemBytes)) {
    disagree("predicted_mem_bytes", show(row.predictedMemBytes),
             "the largest of details.predicted_peak_mem_bytes_per_rank is " + show(m));
  }
  if (!row.timeSamplesUs.empty()) {
    // As `run` summarises them (TimingStats::fromSamples), from the samples the row has.
    const auto t = harness::TimingStats::fromSamples(row.timeSamplesUs, 1);
    for (const auto& [column, value, of] :
         {std::tuple<const char*, std::optional<double>, std::optional<double>>{
              "time_us_median", row.timeMedianUs, t.medianUs},
          {"time_us_min", row.timeMinUs, t.minUs},
          {"time_us_max", row.timeMaxUs, t.maxUs}}) {
      if (value && !same(*value, *of)) {
        disagree(column, show(value), "the samples in time_us_samples give " + show(of));
      }
    }
  }
}

// The records' first divergences and communication per node from the results.json beside `csv`
// (results.partial.json beside results.partial.csv: the pair a run writes together), matched to
// the rows by their key, each row checked against its record (checkAgreement). A file that is
// missing is nothing to read (a CSV copied alone); one that is not the JSON `run` writes is bad
// input.
void attachDetails(const std::string& csv, std::vector<ResultRow>& rows) {
  const std::filesystem::path p(csv);
  const std::string path =
      (p.parent_path() /
       (p.filename() == "results.partial.csv" ? "results.partial.json" : "results.json"))
          .string();
  // Missing: a CSV copied alone. Anything else that is not a file (a FIFO, a device, a folder)
  // is said, not skipped: its checks would be lost without a word.
  if (const std::string why = harness::whyNotAFile(path); why == "no such file") {
    return;
  } else if (!why.empty()) {
    throw ReportInputError(path + ": " + why + " (expected the results.json `run` writes beside " +
                           p.filename().string() + ")");
  }
  std::ifstream in(path);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw ReportInputError(path + ": not valid JSON: " + e.what());
  }
  if (!j.is_object() || !j.contains("records") || !j.at("records").is_array()) {
    throw ReportInputError(path + ": expected an object with a 'records' array");
  }
  // The schema it was written in: the CSV beside it says the same (checked row by row there).
  if (!j.contains("schema_version") || !j.at("schema_version").is_number_integer() ||
      j.at("schema_version").get<int64_t>() != harness::kSchemaVersion) {
    throw ReportInputError(
        path + ": schema_version " +
        (j.contains("schema_version") ? j.at("schema_version").dump() : std::string("missing")) +
        ": expected " + std::to_string(harness::kSchemaVersion) +
        ", the schema this stratbench reads");
  }
  // The JSON the report reads past the CSV, type-checked here so that a hand-edited or hostile
  // results.json is bad input naming the key, never an abort in a table or a trace.
  const auto bad = [](const std::string& where, const std::string& expected,
                      const nlohmann::json& got) {
    std::string text = got.dump();
    if (text.size() > 80) text = text.substr(0, 77) + "...";
    throw ReportInputError(where + ": expected " + expected + ", got " + text);
  };
  const auto checkDivergence = [&](const nlohmann::json& d, const std::string& where) {
    if (!d.is_object()) bad(where, "an object", d);
    const auto typed = [&](const nlohmann::json& o, const std::string& at, const char* key,
                           bool (nlohmann::json::*is)() const noexcept, const char* what) {
      if (o.contains(key) && !(o.at(key).*is)()) bad(at + "." + key, what, o.at(key));
    };
    for (const char* k : {"error", "node", "phase", "tensor"}) {
      typed(d, where, k, &nlohmann::json::is_string, "a string");
    }
    typed(d, where, "found", &nlohmann::json::is_boolean, "true or false");
    for (const char* k : {"compared", "rank", "index", "of"}) {
      typed(d, where, k, &nlohmann::json::is_number_integer, "an integer");
    }
    if (d.contains("ranks")) {
      const auto& ranks = d.at("ranks");
      if (!ranks.is_array() || ranks.size() > 65536)
        bad(where + ".ranks", "a list of ranks", ranks);
      for (const auto& x : ranks) {
        if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() > 65535) {
          bad(where + ".ranks", "ranks from 0 to 65535", x);
        }
      }
    }
    if (d.contains("check")) {
      const auto& c = d.at("check");
      if (!c.is_object()) bad(where + ".check", "an object", c);
      typed(c, where + ".check", "problem", &nlohmann::json::is_string, "a string");
      for (const char* k : {"mismatches", "numel"}) {
        typed(c, where + ".check", k, &nlohmann::json::is_number_integer, "an integer");
      }
    }
  };
  // A pipeline run's timeline: at most 65536 ranks and a million actions over both runs (what
  // the trace and the plot draw), each a named span of finite times.
  const auto checkPipelineRun = [&](const nlohmann::json& r, const std::string& where,
                                    size_t& actions) {
    if (r.contains("schedule") && !r.at("schedule").is_string()) {
      bad(where + ".schedule", "a string", r.at("schedule"));
    }
    const auto& ranks = r.at("per_rank");
    if (ranks.size() > 65536) bad(where + ".per_rank", "at most 65536 ranks", ranks.size());
    for (const auto& rank : ranks) {
      if (!rank.is_object()) bad(where + ".per_rank[]", "an object", rank);
      if (rank.contains("rank") &&
          (!rank.at("rank").is_number_integer() || rank.at("rank").get<int64_t>() < 0 ||
           rank.at("rank").get<int64_t>() > 65535)) {
        bad(where + ".per_rank[].rank", "a rank from 0 to 65535", rank.at("rank"));
      }
      if (!rank.contains("actions")) continue;
      const auto& list = rank.at("actions");
      if (!list.is_array()) bad(where + ".per_rank[].actions", "a list", list);
      actions += list.size();
      if (actions > 1000000) bad(where, "at most a million timeline actions", actions);
      for (const auto& a : list) {
        if (!a.is_object()) bad(where + ".per_rank[].actions[]", "an object", a);
        if (a.contains("action") && !a.at("action").is_string()) {
          bad(where + ".per_rank[].actions[].action", "a string", a.at("action"));
        }
        for (const char* k : {"start_us", "end_us"}) {
          if (a.contains(k) && (!a.at(k).is_number() || !std::isfinite(a.at(k).get<double>()))) {
            bad(where + ".per_rank[].actions[]." + k, "a finite number", a.at(k));
          }
        }
      }
    }
  };
  // Every string of a record, its keys included, at any depth: nothing a terminal or a page
  // would act on (the report prints a divergence's node, a pipeline's actions, an executor's
  // words), and no deeper nesting than any run writes.
  std::string at;
  const std::function<void(const nlohmann::json&, int)> plain = [&](const nlohmann::json& v,
                                                                    int depth) {
    if (depth > 64) bad(at, "at most 64 levels of nesting (no run writes deeper)", v);
    const auto check = [&](const std::string& s, const char* what) {
      if (const auto hidden = harness::hiddenCharacter(s, harness::TextKind::kText)) {
        throw ReportInputError(
            at + ": " + what + " holds " + hidden.text() +
            ", which no run writes there (a terminal or a page would act on it)");
      }
    };
    if (v.is_string()) {
      check(v.get_ref<const std::string&>(), "the string");
    } else if (v.is_object()) {
      for (const auto& [k, x] : v.items()) {
        check(k, "a key");
        const size_t was = at.size();
        at += "." + k;
        plain(x, depth + 1);
        at.resize(was);
      }
    } else if (v.is_array()) {
      const size_t was = at.size();
      at += "[]";
      for (const auto& x : v) plain(x, depth + 1);
      at.resize(was);
    }
  };
  // Per field, the last record of a key that has it (as `run` writes one record per key).
  std::map<std::string, const nlohmann::json*> divergences, comms, pipelines, records;
  // The records of each run id, by key, counted: checked one to one against the CSV's rows.
  std::map<std::string, std::map<std::string, int>> keysOfRun;
  size_t index = 0;
  for (const auto& r : j.at("records")) {
    at = path + ": records[" + std::to_string(index++) + "]";
    if (!r.is_object()) bad(at, "a record (an object)", r);
    plain(r, 0);
    if (!r.contains("details") || !r.at("details").is_object()) {
      bad(at + ".details", "an object", r.contains("details") ? r.at("details") : nlohmann::json());
    }
    const auto text = [&](const char* k) {
      return r.contains(k) && r.at(k).is_string() ? r.at(k).get<std::string>() : "";
    };
    const std::string key = text("suite") + "\x1f" + text("case") + "\x1f" + text("strategy_id") +
                            "\x1f" + text("backend");
    records[key] = &r;
    ++keysOfRun[text("run_id")][key];
    const nlohmann::json& d = r.at("details");
    // The per-rank values the row's columns summarise (checkAgreement): numbers, or absent.
    for (const char* k : {"peak_mem_bytes_per_rank", "predicted_peak_mem_bytes_per_rank"}) {
      if (!d.contains(k)) continue;
      const auto& v = d.at(k);
      if (!v.is_array() || v.size() > 65536) bad(at + ".details." + k, "a list of byte counts", v);
      for (const auto& x : v) {
        if (!x.is_number() || x.get<double>() < 0) {
          bad(at + ".details." + k + "[]", "a number of bytes, 0 or more", x);
        }
      }
    }
    if (d.contains("first_divergence")) divergences[key] = &d.at("first_divergence");
    if (d.contains("comm_by_node") && d.at("comm_by_node").is_array()) {
      comms[key] = &d.at("comm_by_node");
    }
    if (d.contains("executor") && d.at("executor").is_object() &&
        d.at("executor").contains("pipeline") && d.at("executor").at("pipeline").is_object()) {
      pipelines[key] = &d.at("executor").at("pipeline");
    }
  }
  // The committed pair (results.csv, results.json) holds the same records: every row of the
  // JSON's run has exactly one record, and every record of that run a row. (A partial pair is
  // written CSV first, so an interrupted run may hold a row whose record never came: there a
  // row may lack its record, but no record is given twice or lacks its row.)
  const bool committed = p.filename() == "results.csv";
  const std::string jsonRun = j.contains("run") && j.at("run").is_object() &&
                                      j.at("run").contains("run_id") &&
                                      j.at("run").at("run_id").is_string()
                                  ? j.at("run").at("run_id").get<std::string>()
                                  : "";
  // Only where the CSV holds rows of that run: a CSV beside another run's JSON (copied,
  // promoted, or left by a commit whose CSV rename failed after the JSON's) has nothing to
  // agree with here. Rows of other runs in the CSV (a merged baseline) are not this JSON's.
  std::set<std::string> otherRunKeys;
  bool holdsJsonRun = false;
  for (const auto& row : rows) {
    if (row.runId == jsonRun) {
      holdsJsonRun = true;
    } else {
      otherRunKeys.insert(row.key());
    }
  }
  if (!jsonRun.empty() && holdsJsonRun) {
    std::map<std::string, const ResultRow*> rowOf;
    for (const auto& row : rows) {
      if (row.runId != jsonRun) continue;
      rowOf[row.key()] = &row;
      const auto& keys = keysOfRun[jsonRun];
      const auto it = keys.find(row.key());
      const int n = it == keys.end() ? 0 : it->second;
      // A partial pair is written CSV first: its last rows may not have their records yet.
      if (n > 1 || (n == 0 && committed)) {
        throw ReportInputError(
            row.where() + ": case '" + row.caseName + "', " + row.strategyId + " has " +
            std::to_string(n) + " records of run " + jsonRun + " in " + path +
            " (expected 1: the two files `run` writes together disagree; one was edited, "
            "damaged or copied from elsewhere)");
      }
    }
    for (const auto& [key, n] : keysOfRun[jsonRun]) {
      if (rowOf.count(key) || otherRunKeys.count(key)) continue;
      std::string shown = key;
      std::replace(shown.begin(), shown.end(), '\x1f', '/');
      throw ReportInputError(path + ": a record of run " + jsonRun + " (" + shown +
                             ") has no row in " + csv +
                             " (the two files `run` writes together disagree; one was edited, "
                             "damaged or copied from elsewhere)");
    }
  }
  for (auto& row : rows) {
    const std::string where = path + ": case '" + row.caseName + "', " + row.strategyId + ": ";
    // Only a record of the row's own run: a CSV beside another run's JSON (a baseline copied
    // into a run's folder, a CSV promoted alone) has nothing here to agree or disagree with.
    if (auto it = records.find(row.key()); it != records.end()) {
      const nlohmann::json& rec = *it->second;
      if (!rec.contains("run_id") || rec.at("run_id") != row.runId) continue;
      checkAgreement(row, rec, path);
    }
    if (auto it = divergences.find(row.key()); it != divergences.end()) {
      checkDivergence(*it->second, where + "details.first_divergence");
      row.firstDivergence = *it->second;
    }
    if (auto it = comms.find(row.key()); it != comms.end()) row.commByNode = *it->second;
    if (auto it = pipelines.find(row.key()); it != pipelines.end()) {
      const nlohmann::json& p = *it->second;
      const auto run = [&](const char* side) -> nlohmann::json {
        if (!p.contains(side) || !p.at(side).is_object() || !p.at(side).contains("run")) {
          return nullptr;
        }
        const nlohmann::json& r = p.at(side).at("run");
        if (!r.is_object() || !r.contains("per_rank") || !r.at("per_rank").is_array()) {
          throw ReportInputError(path + ": " + row.caseName + " " + row.strategyId +
                                 ": details.executor.pipeline." + side +
                                 ".run has no per_rank array");
        }
        return r;
      };
      nlohmann::json m = run("measured"), pr = run("predicted");
      size_t actions = 0;
      using Side = std::pair<const char*, const nlohmann::json*>;
      const std::initializer_list<Side> sides = {{"measured", &m}, {"predicted", &pr}};
      for (const auto& [side, r] : sides) {
        if (!r->is_null()) {
          checkPipelineRun(*r, where + "details.executor.pipeline." + side + ".run", actions);
        }
      }
      if (!m.is_null()) row.pipelineRuns = {{"measured", m}, {"predicted", pr}};
    }
  }
}

}  // namespace

std::string resultsCsvPath(const std::string& given) {
  if (!std::filesystem::is_directory(given)) return given;
  // A run that was interrupted (or still goes on) left only its partial results: read, and
  // said to be partial by every row, never ignored.
  const std::string whole = given + "/results.csv", partial = given + "/results.partial.csv";
  // (Whatever the partial file is: a FIFO or a dangling link is then named, not results.csv.)
  std::error_code ec;
  const auto present = [&](const std::string& f) {
    return std::filesystem::symlink_status(f, ec).type() != std::filesystem::file_type::not_found;
  };
  return !present(whole) && present(partial) ? partial : whole;
}

std::vector<ResultRow> readResults(const std::string& given) {
  const std::string path = resultsCsvPath(given);
  if (const std::string why = harness::whyNotAFile(path); !why.empty()) {
    throw ReportInputError(path + ": " + (why == "no such file" ? "no such results file" : why) +
                           " (expected a run's folder or its results.csv)");
  }
  const bool partial = std::filesystem::path(path).filename() == "results.partial.csv";
  // The JSON half of a run given for the CSV half: said as such, not as a CSV without a header.
  if (const auto ext = std::filesystem::path(path).extension(); ext == ".json") {
    throw ReportInputError(path +
                           ": a JSON file; give the run's folder or its results.csv (the "
                           "results.json beside it is read with it)");
  }
  std::vector<ResultRow> rows;
  try {
    Reader reader(path);
    readHeader(reader, std::make_index_sequence<kN>{});
    std::vector<std::string> missing;
    for (const char* c : kColumns) {
      if (!isOptional(c) && !reader.has_column(c)) missing.emplace_back(c);
    }
    if (!missing.empty()) {
      std::string list;
      for (size_t i = 0; i < missing.size() && i < 6; ++i) list += (i ? ", " : "") + missing[i];
      if (missing.size() > 6) list += ", ... (" + std::to_string(missing.size()) + " in all)";
      throw ReportInputError(path + ":1: the header lacks column(s) " + list +
                             "; expected the header of a stratbench results.csv (schema " +
                             std::to_string(harness::kSchemaVersion) + ")");
    }
    const bool judged = reader.has_column("mispredicted");
    std::array<std::string, kN> fields;
    while (true) {
      for (auto& f : fields) f.clear();
      if (!readRow(reader, fields, std::make_index_sequence<kN>{})) break;
      const int line = static_cast<int>(reader.get_file_line());
      rows.push_back(parseRow(Fields(fields, path + ":" + std::to_string(line)), path, line));
      rows.back().predictionsJudged = judged;
      rows.back().partial = partial;
    }
  } catch (const io::error::base& e) {
    // A blank line (an edit, or files concatenated) is said as one; the parser's own words
    // would be "Too few columns in line 7".
    if (const auto* at = dynamic_cast<const io::error::with_file_line*>(&e);
        at && dynamic_cast<const io::error::too_few_columns*>(&e) && at->file_line > 0) {
      std::ifstream in(path);
      std::string text;
      for (int k = 0; k < at->file_line && std::getline(in, text);) ++k;
      if (text.find_first_not_of(" \t\r") == std::string::npos) {
        throw ReportInputError(path + ":" + std::to_string(at->file_line) +
                               ": a blank line; a results file `run` writes has none (remove "
                               "it, or give each run's results.csv as it was written)");
      }
    }
    // The parser's own messages name the file and line ("Too few columns in line 7 in file
    // ...").
    throw ReportInputError(path + ": " + e.what());
  }
  attachDetails(path, rows);
  return rows;
}

std::vector<ResultRow> readAll(const std::vector<std::string>& paths) {
  std::vector<ResultRow> all;
  std::map<std::string, std::string> seen;
  for (const auto& p : paths) {
    for (auto& r : readResults(p)) {
      auto [it, fresh] = seen.emplace(r.key(), r.where());
      if (!fresh) {
        throw ReportInputError(r.where() + ": case '" + r.caseName + "' strategy '" + r.strategyId +
                               "' on backend '" + r.backend + "' was already read at " +
                               it->second + "; give each run's results once");
      }
      all.push_back(std::move(r));
    }
  }
  return all;
}

}  // namespace sb::reports
