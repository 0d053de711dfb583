#pragma once

#include <signal.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/measure/timing.h"

namespace sb::harness {

// Bumped whenever a column is renamed, removed or changes meaning (adding one is compatible).
inline constexpr int kSchemaVersion = 1;

// Lists in one CSV field: per-repetition times "12.5;13.1;..." and per-tensor error ratios
// "output=0.01;grad_weight=0.4". Readers split on ';' and then on '='.
inline constexpr char kListSeparator = ';';

enum class Status { kPass, kFail, kError, kUnsupported, kSkipped };
const char* statusName(Status s);  // "pass", "fail", "error", "unsupported", "skipped"

// Where and with what a run was made; the same for every record of a run.
struct Provenance {
  std::string runId;
  std::string gitSha;
  std::string timestampUtc;  // ISO 8601, e.g. 2026-11-21T07:45:00Z
  std::string host;
  std::string device;  // e.g. "cpu (AMD EPYC 7B13)"
  std::string torchVersion;

  // Fills every field from this process and machine; the run id is new each call.
  static Provenance collect();
};

// One (case, strategy) result: one CSV row and one JSON object.
struct Record {
  Provenance provenance;
  std::string backend;
  int worldSize = 0;
  std::string mesh;
  std::string suite;
  std::string caseName;
  std::string workload;
  std::string shape;
  std::string dtype;
  std::string inputs;  // random | exact
  uint64_t seed = 0;
  std::string family;
  std::string strategyId;
  std::string strategy;  // display name
  Status status = Status::kError;
  std::optional<double> maxAbsErr;
  std::optional<double> maxRelErr;
  std::optional<int64_t> mismatches;
  std::optional<double> atol;
  std::optional<double> rtol;
  // The worst tensor's max |a - e| / (atol + rtol |e|) (<= 1 passes; see ErrorStats), its name,
  // and the same number for every compared tensor, worst rank first-seen order.
  std::optional<double> errRatio;
  std::string worstTensor;
  std::vector<std::pair<std::string, double>> tensorErrRatio;
  std::string tolerance;  // "rtol=1.3e-06 atol=1e-05", "bitwise (reason)"
  std::optional<TimingStats> timing;
  int repetitions = 0;
  std::optional<int64_t> peakMemBytes;        // largest rank's peak
  std::optional<int64_t> predictedMemBytes;   // largest rank's prediction
  std::optional<int64_t> commBytes;           // largest rank's counted bytes
  std::optional<int64_t> predictedCommBytes;  // largest rank's predicted bytes
  std::optional<int64_t> commCalls;           // largest rank's collective calls
  std::optional<double> predictedTimeUs;      // the strategy's cost model, where it has one
  // The predictions the measurement contradicts, beyond the tolerance the strategy states
  // (Strategy::predictionTolerance, and an executor's own claims such as a pipeline's bubble):
  // "", or "memory", "time" and "bubble" joined by '+' ("memory+time"). A flagged row fails
  // `report`'s gate; the message and details["prediction"] say by how much.
  std::string mispredicted;
  // Family-specific parameters and numbers ("budget=0.5;recomputed_forwards=3").
  std::vector<std::pair<std::string, std::string>> params;
  std::string message;
  nlohmann::json details = nlohmann::json::object();  // per tensor, per rank, layouts

  nlohmann::json toJson() const;
};

// The CSV header, in column order; an array so that readers that need the count at compile
// time (the CSV parser of reports/) use the same list.
inline constexpr std::array<const char*, 45> kCsvColumns = {"schema_version",
                                                            "run_id",
                                                            "git_sha",
                                                            "timestamp_utc",
                                                            "host",
                                                            "device",
                                                            "torch_version",
                                                            "backend",
                                                            "world_size",
                                                            "mesh",
                                                            "suite",
                                                            "case",
                                                            "workload",
                                                            "shape",
                                                            "dtype",
                                                            "inputs",
                                                            "seed",
                                                            "family",
                                                            "strategy_id",
                                                            "strategy",
                                                            "status",
                                                            "max_abs_err",
                                                            "max_rel_err",
                                                            "mismatches",
                                                            "atol",
                                                            "rtol",
                                                            "err_ratio",
                                                            "worst_tensor",
                                                            "tensor_err_ratio",
                                                            "time_us_median",
                                                            "time_us_mean",
                                                            "time_us_stddev",
                                                            "time_us_min",
                                                            "time_us_max",
                                                            "time_us_samples",
                                                            "repetitions",
                                                            "peak_mem_bytes",
                                                            "predicted_mem_bytes",
                                                            "comm_bytes",
                                                            "predicted_comm_bytes",
                                                            "comm_calls",
                                                            "predicted_time_us",
                                                            "mispredicted",
                                                            "params",
                                                            "message"};
const std::vector<std::string>& csvColumns();
// `s` as one CSV field: quoted, with quotes doubled, where it holds a comma, quote or newline.
std::string csvQuote(const std::string& s);
// A text field as result files write it: one that a spreadsheet would run as a formula (it
// starts with =, +, -, @, a tab or a carriage return) gets a leading apostrophe, the usual
// defence against CSV injection; csvTextValue removes it again when `report` reads the file.
// Applied to the text columns (names, shape, params, message), never to numbers.
std::string csvTextField(const std::string& s);
std::string csvTextValue(const std::string& field);
// A double as records write it: 9 significant digits, "nan", "inf", "-inf".
std::string formatDouble(double v);
// One CSV line (no trailing newline), fields quoted where they need it (RFC 4180).
std::string csvRow(const Record& r);

// Writes a run's `results.csv` and `results.json` into a directory, one consistent set:
//
//   - The directory is locked for the writer's lifetime (an flock on `.stratbench.lock`, which
//     holds the owner's pid; unlinked, still held, when the writer goes): a second run into it
//     is refused with the first one's pid, and a lock left by a process that died is free
//     again.
//   - While the run goes on, the records so far go to `results.partial.csv` and
//     `results.partial.json` (rewritten together, at most once per `kFlushInterval` while
//     records arrive, at every flush() and when the writer is destroyed), so an interrupted run
//     keeps what it finished there.
//   - commit() (the end of the run) writes the full set to temporaries, flushed to disk, and
//     only then renames them over `results.json` and `results.csv`, with SIGINT and SIGTERM
//     held off between the two renames. The previous set stays whole until the new one is
//     complete; a write that fails (a full disk) leaves it as it was.
// Every file is replaced by rename, so a reader sees a previous complete file or a new
// complete one, never a truncated one.
class ResultWriter {
 public:
  static constexpr std::chrono::milliseconds kFlushInterval{1000};
  // Creates `dir` if needed and takes its lock. Throws OutputBusy when another live process
  // holds it, and a c10::Error naming the directory if it cannot be written.
  explicit ResultWriter(std::string dir, nlohmann::json runInfo);
  ~ResultWriter();
  ResultWriter(const ResultWriter&) = delete;
  ResultWriter& operator=(const ResultWriter&) = delete;
  void add(const Record& r);
  // Writes the partial files now, if anything changed since they were last written.
  void flush();
  // Replaces results.csv and results.json with every record added, and removes the partial
  // files.
  void commit();
  const std::string& dir() const { return dir_; }
  std::string csvPath() const { return dir_ + "/results.csv"; }
  std::string jsonPath() const { return dir_ + "/results.json"; }

 private:
  void write();
  std::pair<std::string, std::string> contents() const;  // csv, json
  std::string dir_;
  nlohmann::json runInfo_;
  int lockFd_ = -1;
  std::vector<std::string> csvLines_;
  std::vector<std::string> jsonRecords_;  // each record serialised once
  size_t written_ = 0;                    // records in the partial files on disk
  bool committed_ = false;
  std::chrono::steady_clock::time_point lastWrite_;
};

// Another run holds the output directory's lock.
class OutputBusy : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Atomically replaces `path` with `content` (temporary file, fsync, rename).
void writeFileAtomic(const std::string& path, const std::string& content);

// Holds SIGINT, SIGTERM and SIGHUP off while alive, for the few renames that replace one set
// of files by another (results.csv with results.json, a report's files): an interrupt lands
// before or after the whole replacement, never inside it. Process-wide: a handler that only
// notes the signal is installed for the three (a mask would cover the calling thread only,
// and `run` has OpenMP's threads alive), and the destructor restores the previous handlers
// and then raises what arrived in between.
class SignalHold {
 public:
  SignalHold();
  ~SignalHold();
  SignalHold(const SignalHold&) = delete;
  SignalHold& operator=(const SignalHold&) = delete;

 private:
  struct sigaction previous_[3];
};

}  // namespace sb::harness
