// The console observer: `stratbench run`'s progress lines and summary table (see progress.h).

#include "harness/run/progress.h"

#include <unistd.h>

#include <algorithm>
#include <iomanip>
#include <iostream>
#include <ostream>
#include <sstream>

#include "harness/hidden_text.h"
#include "harness/run/run_util.h"
#include "reference/workload.h"

namespace sb::harness {

LiveStatus& liveStatus() {
  static LiveStatus s;
  return s;
}

ConsoleObserver::ConsoleObserver(std::ostream& out, bool live) : out_(out), live_(live) {
  if (!live_) return;
  ticker_ = std::thread([this] {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
      wake_.wait_for(lock, std::chrono::seconds(1));
      if (!stop_) tick();
    }
  });
}

ConsoleObserver::~ConsoleObserver() {
  if (!live_) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    clearLine();
  }
  wake_.notify_all();
  ticker_.join();
}

// Under mu_.
void ConsoleObserver::tick() {
  if (!inCase_) return;
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - caseStart_).count();
  if (secs < 2) return;
  const LiveStatus& s = liveStatus();
  std::ostringstream line;
  line << "[" << (caseIndex_ + 1) << "/" << caseCount_ << "] " << caseName_ << ": strategy "
       << (rowIndex_ + 1) << "/" << rowCount_ << " " << rowId_ << ": " << s.phase.load();
  if (std::string(s.phase.load()) == "timing") line << ", " << s.stepsTimed.load() << " steps";
  line << "  " << static_cast<int>(secs) << " s";
  std::string text = line.str();
  if (text.size() > 150) text = text.substr(0, 147) + "...";
  clearTerminalLine();
  std::cerr << text << std::flush;
  shown_ = true;
}

// Under mu_.
void ConsoleObserver::clearLine() {
  if (!shown_) return;
  clearTerminalLine();
  shown_ = false;
}

void ConsoleObserver::rowStarted(size_t index, size_t count, const std::string& id) {
  if (!live_) return;
  std::lock_guard<std::mutex> lock(mu_);
  rowIndex_ = index;
  rowCount_ = count;
  rowId_ = id;
}

void ConsoleObserver::Tally::add(Status s) {
  switch (s) {
    case Status::kPass:
      ++pass;
      break;
    case Status::kFail:
      ++fail;
      break;
    case Status::kError:
      ++error;
      break;
    case Status::kUnsupported:
      ++unsupported;
      break;
    case Status::kSkipped:
      ++skipped;
      break;
  }
}

void ConsoleObserver::sessionStarted(const DistEnv& env, const std::string& backend,
                                     const std::string& rank0Address,
                                     std::chrono::milliseconds timeout) {
  out_ << "stratbench: " << env.worldSize << " ranks on " << backend << " (launcher "
       << env.launcher << ", store " << env.masterAddr << ":" << env.masterPort << ", rank 0 at "
       << rank0Address << ", timeout " << seconds(timeout) << ")\n";
}

void ConsoleObserver::suiteStarted(const Suite& suite, const std::vector<PlannedCase>& plan,
                                   const RunOptions& options, const Provenance& prov) {
  out_ << "stratbench run " << suite.name << " (" << plan.size() << " cases, backend "
       << options.backend << ", run " << prov.runId << ")\n";
}

void ConsoleObserver::caseStarted(size_t index, size_t count, const CaseSpec& c) {
  tally_ = Tally();
  if (!live_) return;
  std::lock_guard<std::mutex> lock(mu_);
  caseIndex_ = index;
  caseCount_ = count;
  caseName_ = c.name;
  caseStart_ = std::chrono::steady_clock::now();
  rowIndex_ = rowCount_ = 0;
  rowId_ = "(reference)";
  inCase_ = true;
}

void ConsoleObserver::rowFinished(const Record& rec) {
  tally_.add(rec.status);
  total_.add(rec.status);
  if (rec.status == Status::kFail || rec.status == Status::kError) bad_.push_back(rec);
  if (rec.status == Status::kSkipped) {
    auto it = std::find_if(skipped_.begin(), skipped_.end(),
                           [&](const auto& e) { return e.first == rec.message; });
    if (it == skipped_.end()) {
      skipped_.emplace_back(rec.message, 1);
    } else {
      ++it->second;
    }
  }
}

void ConsoleObserver::caseFinished(size_t index, size_t count, const CaseSpec& c, double secs) {
  if (live_) {
    std::lock_guard<std::mutex> lock(mu_);
    inCase_ = false;
    clearLine();
  }
  std::ostream& out = out_;
  const Tally& tally = tally_;
  out << "[" << (index + 1) << "/" << count << "] " << c.name << " (" << c.workload << " "
      << reference::findWorkload(c.workload)->shapeString(c.shape) << ", mesh " << c.meshString()
      << ", " << dtypeName(c.dtype)
      << (c.inputs == reference::InputMode::kExact ? ", exact inputs" : "") << "): " << tally.pass
      << " pass, " << tally.fail << " fail, " << tally.error << " error, " << tally.unsupported
      << " unsupported, " << tally.skipped << " skipped  " << std::fixed << std::setprecision(1)
      << secs << " s\n"
      << std::defaultfloat;
  out.flush();
  tallies_.emplace_back(c.name, tally);
}

void ConsoleObserver::suiteFinished(bool stopped) {
  std::ostream& out = out_;
  const Tally& total = total_;
  size_t width = 4;
  for (const auto& [name, t] : tallies_) width = std::max(width, name.size());
  out << "\n"
      << std::left << std::setw(width) << "case"
      << "  pass  fail error unsup  skip\n";
  for (const auto& [name, t] : tallies_) {
    out << std::left << std::setw(width) << name << std::right << std::setw(6) << t.pass
        << std::setw(6) << t.fail << std::setw(6) << t.error << std::setw(6) << t.unsupported
        << std::setw(6) << t.skipped << "\n";
  }
  out << std::left << std::setw(width) << "total" << std::right << std::setw(6) << total.pass
      << std::setw(6) << total.fail << std::setw(6) << total.error << std::setw(6)
      << total.unsupported << std::setw(6) << total.skipped << "\n";
  for (const auto& r : bad_) {
    out << statusName(r.status) << ": " << r.caseName << " " << r.strategyId << ": " << r.message
        << "\n";
  }
  // Skipped rows by reason: a run that skipped a whole suite must say so where it is read.
  for (const auto& [why, n] : skipped_) out << "skipped: " << n << " row(s): " << why << "\n";
  if (total.pass + total.fail + total.error == 0 && total.skipped + total.unsupported > 0) {
    out << "nothing ran: every row was skipped or unsupported\n";
  }
  if (stopped) out << "stopped: a rank was lost; every finished row is in the results\n";
}

void ConsoleObserver::resultsWritten(const std::string& csvPath, const std::string& jsonPath,
                                     double secs) {
  out_ << "results: " << csvPath << ", " << jsonPath << " (" << std::fixed << std::setprecision(1)
       << secs << " s)\n"
       << std::defaultfloat;
}

}  // namespace sb::harness
