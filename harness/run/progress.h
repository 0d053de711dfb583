#pragma once

// What a run tells the outside while it goes: the runner calls a RunObserver at each step
// (session, suite, case, row, summary, results) and never prints itself, as google/benchmark's
// runner hands its runs to reporters and llvm lit's to its progress callback. The console
// observer prints `stratbench run`'s progress lines and summary table. Its own file so that how
// a run is shown can change, or be replaced by a caller, without touching how it runs.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <iosfwd>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "harness/case.h"
#include "harness/dist/dist_env.h"
#include "harness/run/plan.h"
#include "harness/run/records.h"
#include "harness/run/run_options.h"
#include "harness/run/suite.h"

namespace sb::harness {

// Receives a run's events in order: sessionStarted (multi-process runs only), suiteStarted,
// then per case caseStarted, rowFinished for each record, caseFinished; then suiteFinished and,
// where this process writes the results, resultsWritten. Every method does nothing by default:
// a plain RunObserver is a silent one (ranks other than 0 of a multi-process run get one).
class RunObserver {
 public:
  virtual ~RunObserver() = default;
  // A multi-process run's session is up (rank 0 only): the launcher's environment, the
  // backend, rank 0's address and the collective timeout.
  virtual void sessionStarted(const DistEnv& env, const std::string& backend,
                              const std::string& rank0Address, std::chrono::milliseconds timeout) {}
  // The results directory is taken; nothing has run yet.
  virtual void suiteStarted(const Suite& suite, const std::vector<PlannedCase>& plan,
                            const RunOptions& options, const Provenance& prov) {}
  // Case `index` (from 0) of `count` starts: its reference is built next.
  virtual void caseStarted(size_t index, size_t count, const CaseSpec& c) {}
  // Row `index` (from 0) of the case's `count` starts: strategy `id`.
  virtual void rowStarted(size_t index, size_t count, const std::string& id) {}
  // A row's record, as written (on the process that writes the results).
  virtual void rowFinished(const Record& rec) {}
  // Case `index` of `count` is done (or stopped), `seconds` after it started.
  virtual void caseFinished(size_t index, size_t count, const CaseSpec& c, double seconds) {}
  // Every case is done, or the run `stopped` because a rank was lost.
  virtual void suiteFinished(bool stopped) {}
  // The results files are committed, `seconds` after the run started.
  virtual void resultsWritten(const std::string& csvPath, const std::string& jsonPath,
                              double seconds) {}
  // A line about the run besides its rows (e.g. where the golden losses were written).
  virtual void note(const std::string& text) {}
};

// What the running row does now: its phase ("reference", "measured step", "timing",
// "locating the divergence") and the steps timed so far. Set by the runner (a store of a
// pointer to a literal and an increment: nothing in the timed step waits on it), read by the
// console's progress line.
struct LiveStatus {
  std::atomic<const char*> phase{""};
  std::atomic<int64_t> stepsTimed{0};
};
LiveStatus& liveStatus();

// `stratbench run`'s console output: one line per case with its counts and time, then a table
// of counts per case, every failed or errored row with its message, skipped rows by reason, and
// where the results are. With `live` (stderr is a terminal) a case running past two seconds
// shows, on one line of stderr rewritten each second, the strategy n of m, its phase and the
// steps timed; quiet otherwise (a log or CI gets only the lines above).
class ConsoleObserver final : public RunObserver {
 public:
  explicit ConsoleObserver(std::ostream& out, bool live = false);
  ~ConsoleObserver() override;
  void sessionStarted(const DistEnv& env, const std::string& backend,
                      const std::string& rank0Address, std::chrono::milliseconds timeout) override;
  void suiteStarted(const Suite& suite, const std::vector<PlannedCase>& plan,
                    const RunOptions& options, const Provenance& prov) override;
  void caseStarted(size_t index, size_t count, const CaseSpec& c) override;
  void rowStarted(size_t index, size_t count, const std::string& id) override;
  void rowFinished(const Record& rec) override;
  void caseFinished(size_t index, size_t count, const CaseSpec& c, double seconds) override;
  void suiteFinished(bool stopped) override;
  void resultsWritten(const std::string& csvPath, const std::string& jsonPath,
                      double seconds) override;
  void note(const std::string& text) override { out_ << text << "\n"; }

  // Rows by status, of one case or of the run.
  struct Tally {
    int pass = 0, fail = 0, error = 0, unsupported = 0, skipped = 0;
    void add(Status s);
  };

 private:
  std::ostream& out_;
  Tally tally_;  // the current case's
  Tally total_;
  std::vector<std::pair<std::string, Tally>> tallies_;
  std::vector<Record> bad_;
  std::vector<std::pair<std::string, int>> skipped_;  // reason -> rows, in first-seen order

  // The live line (live only): what the ticker thread shows, under mu_.
  void tick();
  void clearLine();
  bool live_ = false;
  std::mutex mu_;
  std::condition_variable wake_;
  bool stop_ = false, shown_ = false;
  std::string caseName_, rowId_;
  size_t rowIndex_ = 0, rowCount_ = 0, caseIndex_ = 0, caseCount_ = 0;
  std::chrono::steady_clock::time_point caseStart_;
  bool inCase_ = false;
  std::thread ticker_;
};

}  // namespace sb::harness
