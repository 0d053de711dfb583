// `stratbench report`: merge result files, compare with a baseline, gate, and write
// report.md/html and plots (reports/report.h). One subcommand per file (cli/commands.h).

#include <iostream>
#include <memory>

#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "cli/common.h"
#include "cli/numbers.h"
#include "harness/run/run_util.h"
#include "reports/report.h"

namespace sb::cli {

Command addReport(CLI::App& app) {
  struct Args {
    sb::reports::ReportOptions ropts;
    bool noPlots = false;
  };
  const auto a = std::make_shared<Args>();
  auto& ropts = a->ropts;
  auto* report = app.add_subcommand(
      "report",
      "Merge result files, compare with a baseline, gate, write report.md/html and plots");
  report->add_option("results", ropts.results, "results.csv files or run directories");
  report->add_option("--baseline", ropts.baselines, "Baseline results.csv files or directories");
  report->add_option("--out", ropts.outDir,
                     "Report directory (default: that of the first results file)");
  report->add_option("--history", ropts.historyDir,
                     "Directory of runs (folders with results.csv) for the trend plots");
  report->add_flag("--gate", ropts.gate, "Exit 1 when the gate fails");
  report->add_flag("--gate-perf", ropts.gateOptions.hardPerf,
                   "Time regressions fail the gate too (soft by default)");
  report->add_flag("--allow-gone", ropts.gateOptions.allowGone,
                   "A baseline row missing from the results only warns");
  report->add_flag("--allow-mispredicted", ropts.gateOptions.allowMispredicted,
                   "A row whose prediction is past its strategy's tolerance only warns");
  report
      ->add_option("--perf-threshold", ropts.gateOptions.perfThresholdPct,
                   "Minimum change of the median time, in %")
      ->capture_default_str()
      ->check(sb::cli::realNumber(0, 1000, true, "percent"));
  report
      ->add_option("--mem-threshold", ropts.gateOptions.memThresholdPct,
                   "Minimum change of peak memory, in %")
      ->capture_default_str()
      ->check(sb::cli::realNumber(0, 1000, false, "percent"));
  report->add_flag("--no-plots", a->noPlots, "Skip the matplotlib plots");
  return {report, [a] {
            a->ropts.plots = !a->noPlots;
            try {
              return sb::reports::runReport(a->ropts, std::cout);
            } catch (const sb::reports::ReportInputError& e) {
              std::cerr << "stratbench report: " << sb::harness::errorText(e) << "\n";
              return kExitBadInput;
            }
          }};
}

}  // namespace sb::cli
