#pragma once

#include <iosfwd>
#include <string>
#include <vector>

#include "reports/compare.h"

namespace sb::reports {

// `stratbench report RESULTS... [--baseline FILE...] [--out DIR] [--history DIR] [--gate]`.
struct ReportOptions {
  std::vector<std::string> results;    // results.csv files or directories holding one
  std::vector<std::string> baselines;  // the same, for the baseline
  std::string outDir;                  // default: the directory of the first results file
  std::string historyDir;  // a directory of runs (each a folder with results.csv), oldest first
  bool gate = false;       // exit 1 when the gate fails
  GateOptions gateOptions;
  bool plots = true;  // run reports/plots/make_plots.py (python3 + matplotlib)
};

// What one report wrote.
struct ReportFiles {
  std::string markdown, html, summaryCsv, tensorsCsv, historyCsv, plotsDir;
  std::vector<std::string> plots;  // PNG paths
  std::string plotProblem;         // why plots are missing, if they are
};

// Reads, compares, writes DIR/report.md, DIR/report.html (plots embedded), DIR/summary.csv,
// DIR/tensors.csv, DIR/history.csv (with a history) and DIR/plots/*.png; prints a short
// summary (and the gate's findings) to `out`. Returns the exit code: 0, or 1 when `gate` is set
// and the gate failed. Throws ReportInputError for bad input (exit 2), before writing anything.
int runReport(const ReportOptions& options, std::ostream& out, ReportFiles* files = nullptr);

// A case's name as a file name: [A-Za-z0-9._-] kept, anything else '_', prefixed by the suite;
// where a character was replaced or the name is long (150 bytes kept), a hash of the whole name
// follows, so that names differing only there get files of their own.
std::string caseSlug(const std::string& suite, const std::string& caseName);

}  // namespace sb::reports
