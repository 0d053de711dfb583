// The console observer: `stratbench run`'s progress lines and summary table (see progress.h).

#include "harness/run/progress.h"

#include <algorithm>
#include <iomanip>
#include <ostream>

#include "harness/run/run_util.h"
#include "reference/workload.h"

namespace sb::harness {

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
}

void ConsoleObserver::rowFinished(const Record& rec) {
  tally_.add(rec.status);
  total_.add(rec.status);
  if (rec.status == Status::kFail || rec.status == Status::kError) bad_.push_back(rec);
}

void ConsoleObserver::caseFinished(size_t index, size_t count, const CaseSpec& c, double secs) {
  std::ostream& out = out_;
  const Tally& tally = tally_;
  out << "[" << (index + 1) << "/" << count << "] " << c.name << " (" << c.workload << " "
      << reference::findWorkload(c.workload)->shapeString(c.shape) << ", mesh " << c.meshString()
      << ", " << dtypeName(c.dtype)
      << (c.inputs == reference::InputMode::kExact ? ", exact inputs" : "") << "): " << tally.pass
      << " pass, " << tally.fail << " fail, " << tally.error << " error, " << tally.unsupported
      << " unsupported  " << std::fixed << std::setprecision(1) << secs << " s\n"
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
      << "  pass  fail error unsup\n";
  for (const auto& [name, t] : tallies_) {
    out << std::left << std::setw(width) << name << std::right << std::setw(6) << t.pass
        << std::setw(6) << t.fail << std::setw(6) << t.error << std::setw(6) << t.unsupported
        << "\n";
  }
  out << std::left << std::setw(width) << "total" << std::right << std::setw(6) << total.pass
      << std::setw(6) << total.fail << std::setw(6) << total.error << std::setw(6)
      << total.unsupported << "\n";
  for (const auto& r : bad_) {
    out << statusName(r.status) << ": " << r.caseName << " " << r.strategyId << ": " << r.message
        << "\n";
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
