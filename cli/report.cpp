// `stratbench report`: merge result files, compare with a baseline, gate, and write
// report.md/html and plots (reports/report.h). One subcommand per file (cli/commands.h).

#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <set>

#include <unistd.h>

#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "cli/common.h"
#include "cli/numbers.h"
#include "harness/error.h"
#include "harness/out_file.h"
#include "harness/run/run_util.h"
#include "reports/report.h"

namespace sb::cli {

Command addReport(CLI::App& app) {
  struct Args {
    sb::reports::ReportOptions ropts;
    bool noPlots = false;
    std::string noisePath;
    std::vector<std::string> confirm;
  };
  const auto a = std::make_shared<Args>();
  auto& ropts = a->ropts;
  auto* report = app.add_subcommand(
      "report",
      "Merge result files, compare with a baseline, gate, write report.md/html and plots");
  report->add_option("results", ropts.results, "results.csv files or run directories")
      ->check(sb::cli::pathName());
  report->add_option("--baseline", ropts.baselines, "Baseline results.csv files or directories")
      ->check(sb::cli::pathName());
  report
      ->add_option("--out", ropts.outDir,
                   "Report directory (default: that of the first results file)")
      ->check(sb::cli::pathName());
  report
      ->add_option("--history", ropts.historyDir,
                   "Directory of runs (folders with results.csv) for the trend plots")
      ->check(sb::cli::pathName());
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
  report
      ->add_option("--noise", a->noisePath,
                   "Noise file (`stratbench noise`): each row's time judged against its own "
                   "band, not the fixed --perf-threshold")
      ->check(sb::cli::pathName());
  report
      ->add_option("--confirm", a->confirm,
                   "A rerun of some rows (results): a time regression counts only where its "
                   "rerun reproduces it")
      ->check(sb::cli::pathName());
  report->add_flag("--allow-empty-suite", ropts.gateOptions.allowEmptySuite,
                   "A suite whose every row was skipped or unsupported only warns");
  report->add_flag("--no-plots", a->noPlots, "Skip the matplotlib plots");
  return {report, [a] {
            a->ropts.plots = !a->noPlots;
            try {
              if (!a->noisePath.empty()) {
                a->ropts.gateOptions.noise = sb::reports::readNoise(a->noisePath);
              }
              if (!a->confirm.empty()) {
                a->ropts.gateOptions.confirm = sb::reports::readAll(a->confirm);
              }
              return sb::reports::runReport(a->ropts, std::cout);
            } catch (const sb::reports::ReportInputError& e) {
              std::cerr << "stratbench report: " << sb::harness::errorText(e) << "\n";
              return kExitBadInput;
            } catch (const std::exception& e) {
              // A file that could not be written or moved in (the previous set stays whole):
              // said, and the staging folder removed on the way out, not an abort.
              std::cerr << "stratbench report: " << sb::harness::errorText(e) << "\n";
              return kExitBadInput;
            }
          }};
}

// `stratbench noise RUN... --out FILE`: the machine's noise from runs of one build.
Command addNoise(CLI::App& app) {
  struct Args {
    std::vector<std::string> runs;
    std::string out;
    double floorPct = 5.0, factor = 3.0;
  };
  const auto a = std::make_shared<Args>();
  auto* noise = app.add_subcommand(
      "noise",
      "The machine's noise: each row's spread of median time over runs of one build, as the "
      "band `report --noise` judges time against");
  noise->add_option("runs", a->runs, "Run directories (or results.csv files) of one build, >= 2")
      ->check(sb::cli::pathName())
      ->required();
  noise->add_option("--out", a->out, "The noise file to write (JSON)")
      ->check(sb::cli::pathName())
      ->required();
  noise->add_option("--floor", a->floorPct, "Smallest band, in %: no row is judged finer than this")
      ->capture_default_str()
      ->check(sb::cli::realNumber(0, 1000, true, "percent"));
  noise
      ->add_option("--factor", a->factor,
                   "Band = factor x the row's spread ((max - min) / median of its runs' medians) "
                   "pooled with the median spread of the rows of its decade of time")
      ->capture_default_str()
      ->check(sb::cli::realNumber(1, 100, true, "factor"));
  return {
      noise, [a] {
        try {
          if (a->runs.size() < 2) {
            throw sb::reports::ReportInputError(
                std::to_string(a->runs.size()) +
                " run given; the spread needs at least 2 runs of the same build (3 or more "
                "to be worth trusting)");
          }
          // The file is refused before any work when it is not one to replace: a device, a
          // FIFO or a folder at --out (as root, a rename over /dev/zero replaced it).
          sb::harness::InputFiles runs;  // a run given as a CSV file of another name
          for (const auto& r : a->runs) runs.emplace_back("the run list", r);
          try {
            sb::harness::checkResultPath(a->out, runs);
          } catch (const sb::harness::InputError& e) {
            throw sb::reports::ReportInputError("--out " + sb::harness::errorText(e));
          }
          std::vector<std::vector<sb::reports::ResultRow>> rows;
          std::set<std::string> suites, shas;
          std::map<std::string, std::string> backends;  // backend -> the first run on it
          std::map<std::string, std::string> runIds;    // run_id -> the run given first with it
          for (const auto& r : a->runs) {
            rows.push_back(sb::reports::readResults(r));
            if (!rows.back().empty()) {
              const auto [it, fresh] = runIds.emplace(rows.back().front().runId, r);
              if (!fresh) {
                throw sb::reports::ReportInputError(
                    r + " is the run " + it->second + " again (run_id " + it->first +
                    "): the spread of a run against itself is 0; give runs "
                    "made one after another");
              }
            }
            // One backend: a row's spread is its times on one; across two nothing pairs up
            // ("no row passed with a time in two of the runs", though every row passed).
            if (!rows.back().empty()) {
              const std::string& backend = rows.back().front().backend;
              backends.emplace(backend, r);
              if (backends.size() > 1) {
                const auto& other =
                    backends.begin()->first == backend ? *backends.rbegin() : *backends.begin();
                throw sb::reports::ReportInputError(
                    other.second + " ran on " + other.first + ", " + r + " on " + backend +
                    ": the spread is measured on one backend; give runs of one");
              }
            }
            for (const auto& row : rows.back()) {
              suites.insert(row.suite);
              shas.insert(row.gitSha);
              if (row.partial) {
                throw sb::reports::ReportInputError(
                    r + ": partial results (an interrupted run) cannot calibrate");
              }
            }
          }
          if (suites.size() != 1) {
            throw sb::reports::ReportInputError("the runs hold " + std::to_string(suites.size()) +
                                                " suites; calibrate on runs of one suite");
          }
          if (shas.size() != 1) {
            std::cerr << "stratbench noise: warning: the runs come from " << shas.size()
                      << " builds (git_sha); the spread then includes what changed\n";
          }
          const std::string json = sb::reports::noiseJson(rows, a->runs, a->floorPct, a->factor);
          // Read back before it replaces anything: the file must be one `report --noise`
          // takes, with a row in it.
          const std::string check = (std::filesystem::temp_directory_path() /
                                     ("stratbench-noise." + std::to_string(::getpid()) + ".json"))
                                        .string();
          {
            std::ofstream f(check);
            f << json;
            if (!f) throw sb::reports::ReportInputError(check + ": cannot write");
          }
          std::error_code ec;
          sb::reports::NoiseModel model;
          try {
            model = sb::reports::readNoise(check);
          } catch (...) {
            std::filesystem::remove(check, ec);
            throw;
          }
          std::filesystem::remove(check, ec);
          if (model.byKey.empty()) {
            throw sb::reports::ReportInputError(
                "no row passed with a time in two of the runs; nothing to calibrate "
                "(" +
                a->out + " not written)");
          }
          try {
            sb::harness::replaceResultFile(a->out, json, runs);
          } catch (const sb::harness::InputError& e) {
            throw sb::reports::ReportInputError("--out " + sb::harness::errorText(e));
          }
          double widest = 0;
          for (const auto& [k, b] : model.byKey) widest = std::max(widest, b.bandPct);
          std::cout << "noise: " << model.byKey.size() << " rows over " << a->runs.size()
                    << " runs; widest band " << widest << "%; " << a->out << "\n";
          return 0;
        } catch (const sb::reports::ReportInputError& e) {
          std::cerr << "stratbench noise: " << sb::harness::errorText(e) << "\n";
          return kExitBadInput;
        }
      }};
}

}  // namespace sb::cli
