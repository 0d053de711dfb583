// `stratbench report` (report.h): reads and checks every input, compares, builds the document
// and the CSVs in a staging folder, renders, commits the set and prints the summary. The parts
// are files of their own (report_internal.h, document.h), one per output as in
// google/benchmark's reporters.

#include "reports/report.h"

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <map>
#include <optional>
#include <tuple>

#include "reports/document.h"
#include "reports/report_internal.h"

namespace sb::reports {
namespace fs = std::filesystem;
namespace {

// ---- inputs ---------------------------------------------------------------------------------

std::vector<HistoryRun> readHistory(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    throw ReportInputError(dir + ": --history expects a directory" +
                           (ec ? " (" + ec.message() + ")" : ""));
  }
  std::vector<HistoryRun> runs;
  // One level, every step with an error code: an entry that is a loop of symbolic links or
  // cannot be read is no run, never an uncaught filesystem_error.
  fs::directory_iterator it(dir, ec), end;
  if (ec) throw ReportInputError(dir + ": --history: " + ec.message());
  for (; it != end; it.increment(ec)) {
    if (ec) throw ReportInputError(dir + ": --history: " + ec.message());
    std::error_code entryEc;
    if (!it->is_directory(entryEc) || !fs::is_regular_file(it->path() / "results.csv", entryEc)) {
      continue;
    }
    HistoryRun run;
    run.dir = it->path().string();
    try {
      run.rows = readResults(run.dir);
    } catch (const ReportInputError& e) {
      // One unreadable run leaves out that run, said on stderr, not the whole history.
      std::cerr << "stratbench report: --history: leaving out " << run.dir << ": " << e.what()
                << "\n";
      continue;
    }
    if (run.rows.empty()) continue;
    run.timestamp = run.rows.front().timestampUtc;
    for (const auto& r : run.rows) run.timestamp = std::min(run.timestamp, r.timestampUtc);
    runs.push_back(std::move(run));
  }
  if (runs.empty()) {
    throw ReportInputError(dir + ": no runs in it (expected folders each holding a results.csv)");
  }
  std::sort(runs.begin(), runs.end(), [](const HistoryRun& a, const HistoryRun& b) {
    return std::tie(a.timestamp, a.dir) < std::tie(b.timestamp, b.dir);
  });
  return runs;
}

std::string defaultOutDir(const std::string& results) {
  if (fs::is_directory(results)) return results;
  const fs::path p(results);
  return p.has_parent_path() ? p.parent_path().string() : ".";
}

}  // namespace

std::string caseSlug(const std::string& suite, const std::string& caseName) {
  std::string s = suite + "__" + caseName;
  for (char& c : s) {
    const bool keep = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                      c == '-' || c == '_' || c == '.';
    if (!keep) c = '_';
  }
  return s;
}

int runReport(const ReportOptions& options, std::ostream& out, ReportFiles* filesOut) {
  // Everything is read and checked before anything is written: bad input leaves the output
  // directory as it was.
  std::vector<HistoryRun> history;
  if (!options.historyDir.empty()) history = readHistory(options.historyDir);
  std::vector<ResultRow> current;
  std::vector<std::string> resultPaths = options.results;
  if (resultPaths.empty()) {
    if (history.empty()) throw ReportInputError("give results files or --history DIR");
    resultPaths.push_back(history.back().dir);  // the newest run of the history
  }
  current = readAll(resultPaths);
  if (current.empty()) throw ReportInputError(resultPaths.front() + ": holds no result rows");
  const std::vector<ResultRow> baseline = readAll(options.baselines);
  if (!options.baselines.empty() && baseline.empty()) {
    throw ReportInputError(options.baselines.front() + ": the baseline holds no result rows");
  }
  const Comparison cmp = compare(current, baseline, options.gateOptions);

  // The report is one set of files (CSVs, plots, report.md, report.html), built whole in a
  // staging folder inside the report's and moved into place only when complete (commitSet):
  // an interrupted or failed report leaves the previous set as it was, never a mix.
  ReportFiles files;
  const std::string dir =
      options.outDir.empty() ? defaultOutDir(resultPaths.front()) : options.outDir;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw ReportInputError(dir + ": cannot create the report directory: " + ec.message());
  removeStaleStaging(dir);
  const std::string stage = dir + "/" + stagingName();
  removeTree(stage);
  fs::create_directories(stage + "/plots", ec);
  if (ec) throw ReportInputError(stage + ": cannot create the staging folder: " + ec.message());
  StagingGuard guard{stage};
  std::vector<std::string> staged = {"summary.csv", "tensors.csv"};
  writeText(stage + "/summary.csv", summaryCsv(cmp));
  writeText(stage + "/tensors.csv", tensorsCsv(current));
  if (!history.empty()) {
    staged.push_back("history.csv");
    writeText(stage + "/history.csv", historyCsv(history));
  }
  // Pipeline rows: both runs (measured, dry run) for the timeline plot, and a Chrome trace of
  // them that Perfetto opens (process "measured" above "dry run", a thread per rank).
  std::map<std::string, std::vector<std::pair<std::string, std::string>>> timelines;  // by case
  for (const auto& r : current) {
    if (r.pipelineRuns.is_null()) continue;
    // A file name as a case's (caseSlug: every character but letters, digits, - _ . as _).
    const std::string name = caseSlug(r.suite, r.caseName + "__" + r.strategyId + "__" + r.backend);
    fs::create_directories(stage + "/pipeline", ec);
    if (ec) throw ReportInputError(stage + "/pipeline: cannot create: " + ec.message());
    writeText(stage + "/pipeline/" + name + ".json", r.pipelineRuns.dump(1) + "\n");
    writeText(stage + "/pipeline/" + name + ".trace.json", pipelineTrace(r.pipelineRuns));
    staged.push_back("pipeline/" + name + ".json");
    staged.push_back("pipeline/" + name + ".trace.json");
    timelines[caseSlug(r.suite, r.caseName)].push_back({name, r.strategyId});
  }

  if (options.plots)
    files.plotProblem = runPlots(stage);
  else
    files.plotProblem = "plots not requested (--no-plots)";
  const auto plot = [&](const std::string& name) -> std::optional<std::string> {
    const std::string rel = "plots/" + name + ".png";
    if (fs::is_regular_file(stage + "/" + rel) && fs::file_size(stage + "/" + rel) > 0) {
      files.plots.push_back(dir + "/" + rel);
      staged.push_back(rel);
      return rel;
    }
    return std::nullopt;
  };

  // The document.
  Document doc;
  doc.heading(1, "stratbench report");
  doc.table(provenanceTable(current, baseline));
  if (!files.plotProblem.empty()) doc.paragraph("Plots are missing: " + files.plotProblem, "warn");

  const auto failures = cmp.gateFailures();
  const auto warnings = cmp.warnings();
  doc.heading(2, "Gate");
  if (!cmp.hasBaseline) {
    doc.paragraph("No baseline given: every row is judged on its own (numerics only).");
  }
  if (failures.empty()) {
    doc.paragraph("Gate passed: no numerics regression, no misprediction, no memory regression" +
                      std::string(options.gateOptions.hardPerf ? ", no time regression" : "") + ".",
                  "gate-pass");
  } else {
    doc.paragraph("Gate failed: " + std::to_string(failures.size()) + " finding(s).", "gate-fail");
    doc.list(failures);
  }
  if (!warnings.empty()) {
    doc.paragraph("Warnings (" + std::to_string(warnings.size()) + "), reported but not gating:");
    doc.list(warnings);
  }
  doc.paragraph(
      "Thresholds: time " + fmt("%.3g", options.gateOptions.perfThresholdPct) +
      "% on the median and Mann-Whitney p < " + fmt("%.3g", options.gateOptions.alpha) +
      " over >= " + std::to_string(options.gateOptions.minSamples) + " repetitions a side (" +
      (options.gateOptions.hardPerf ? "hard" : "soft") + "); memory " +
      fmt("%.3g", options.gateOptions.memThresholdPct) +
      "% (hard); numerics hard; predictions within each strategy's stated tolerance " +
      (options.gateOptions.allowMispredicted ? "(soft: --allow-mispredicted)." : "(hard)."));

  // Where the located rows first left the reference (a failing row, or any with run --capture).
  if (Table located = divergenceTable(current); !located.rows.empty()) {
    doc.heading(2, "Where rows diverge");
    doc.paragraph(
        "The first intermediate value (in the step's execution order) whose piece leaves its "
        "tolerance against the same value of the reference run: the node that made it, the "
        "phase, the ranks where it is the first, and its error (details.first_divergence).");
    doc.table(std::move(located));
  }

  // Communication per node and phase (details.comm_by_node), each row's table on request.
  constexpr size_t kCommTables = 200;
  if (auto tables = commNodeTables(current, kCommTables); !tables.empty()) {
    doc.heading(2, "Communication per node");
    size_t rowsWith = 0;
    for (const auto& r : current) rowsWith += r.commByNode.is_array() && !r.commByNode.empty();
    doc.paragraph(
        "Per graph node (or module, or operator) and phase, the collectives each rank issued "
        "(counted by the communicator) beside what the strategy predicts there; ranks that agree "
        "are merged. Rows whose nodes differ first. " +
        (rowsWith > tables.size()
             ? std::to_string(tables.size()) + " of " + std::to_string(rowsWith) +
                   " rows shown; every row's is in results.json (details.comm_by_node)."
             : std::string("The same data is in results.json (details.comm_by_node).")));
    for (auto& t : tables) doc.details(t.summary, std::move(t.table), t.differs ? "fail" : "");
  }

  // Another LibTorch in the baseline: what the upgrade changed, row by row.
  std::optional<VersionTables> versions;
  if (versionsDiffer(current, baseline)) {
    constexpr size_t kChangedRows = 500;
    versions = versionTables(cmp, kChangedRows);
    doc.heading(2, "Across LibTorch versions");
    doc.paragraph("The baseline ran LibTorch " + joined(distinct(baseline, &ResultRow::torchVersion)) +
                  ", the results " + joined(distinct(current, &ResultRow::torchVersion)) +
                  ": the rows both have, old -> new. A peak predicted to the byte on one and not "
                  "the other is a memory model that encodes what one ATen allocates.");
    doc.table(versions->families);
    if (versions->changes.rows.empty()) {
      doc.paragraph("No row changed its status, its peak, the exactness of its memory model or "
                    "its verdict on predictions.");
    } else {
      doc.paragraph(std::to_string(versions->changed) +
                    " row(s) changed their status, peak, exactness or verdict on predictions" +
                    (static_cast<size_t>(versions->changed) > versions->changes.rows.size()
                         ? " (the first " + std::to_string(versions->changes.rows.size()) + " here)"
                         : std::string()) +
                    ":");
      doc.table(versions->changes);
    }
  }

  doc.heading(2, "Summary by family");
  doc.table(familyTable(cmp));

  doc.heading(2, "Across cases");
  if (auto p = plot("predicted_vs_measured")) doc.image(*p, "predicted vs measured");
  // Family sweeps (checkpointing budgets): one plot per swept case family.
  std::vector<std::string> sweeps;
  for (const auto& e : fs::directory_iterator(stage + "/plots")) {
    const std::string name = e.path().stem().string();
    if (name.rfind("sweep_", 0) == 0 && e.path().extension() == ".png") sweeps.push_back(name);
  }
  std::sort(sweeps.begin(), sweeps.end());
  for (const auto& name : sweeps) {
    if (auto p = plot(name)) doc.image(*p, name);
  }
  if (!history.empty()) {
    doc.paragraph("History: " + std::to_string(history.size()) + " runs in " + options.historyDir +
                  ", oldest " + history.front().timestamp + ", newest " + history.back().timestamp +
                  ".");
    if (auto p = plot("history_status")) doc.image(*p, "history of statuses");
  }

  // Cases, in the order the results list them; gone rows join their case.
  std::vector<std::string> caseOrder;
  std::map<std::string, std::vector<const RowComparison*>> byCase;
  for (const auto& rc : cmp.rows) {
    const std::string slug = caseSlug(rc.any().suite, rc.any().caseName);
    if (!byCase.count(slug)) caseOrder.push_back(slug);
    byCase[slug].push_back(&rc);
  }
  for (const auto& slug : caseOrder) {
    const auto& rows = byCase[slug];
    const ResultRow& a = rows.front()->any();
    doc.heading(2, "Case " + a.suite + "/" + a.caseName);
    doc.paragraph("workload " + a.workload + ", shape " + a.shape + ", " + a.dtype + ", mesh " +
                  a.mesh + ", inputs " + a.inputs + ", seed " + std::to_string(a.seed) +
                  ", backend " + a.backend + ", world size " + std::to_string(a.worldSize));
    doc.table(caseTable(rows, cmp.hasBaseline, "case-" + slug));
    for (const char* kind : {"time_", "memory_", "errors_", "history_"}) {
      if (auto p = plot(kind + slug)) doc.image(*p, std::string(kind) + slug);
    }
    for (const auto& [name, strategy] : timelines[slug]) {
      doc.paragraph(strategy +
                    ": each rank's actions in the measured step above the dry run's "
                    "(F, B, I, W; idle the gaps); Chrome trace for Perfetto: pipeline/" +
                    name + ".trace.json");
      if (auto p = plot("pipeline_" + name)) doc.image(*p, "pipeline timeline " + name);
    }
  }

  writeText(stage + "/report.md", doc.markdown());
  writeText(stage + "/report.html",
            doc.html("stratbench report: " + joined(distinct(current, &ResultRow::suite)), stage));
  staged.push_back("report.md");
  staged.push_back("report.html");  // last: a reader that sees it sees the whole set
  commitSet(stage, dir, staged);
  files.plotsDir = dir + "/plots";
  files.summaryCsv = dir + "/summary.csv";
  files.tensorsCsv = dir + "/tensors.csv";
  if (!history.empty()) files.historyCsv = dir + "/history.csv";
  files.markdown = dir + "/report.md";
  files.html = dir + "/report.html";

  // The console summary.
  int pass = 0, bad = 0;
  for (const auto& r : current) {
    if (r.status == "pass") ++pass;
    if (r.isBad()) ++bad;
  }
  out << "report: " << current.size() << " rows (" << pass << " pass, " << bad << " fail or error)"
      << (cmp.hasBaseline ? " against " + std::to_string(baseline.size()) + " baseline rows" : "")
      << "\n";
  if (versions) {
    out << "  LibTorch " << joined(distinct(baseline, &ResultRow::torchVersion)) << " -> "
        << joined(distinct(current, &ResultRow::torchVersion)) << ": " << versions->both
        << " rows in both, " << versions->samePeak << " with the same peak, " << versions->changed
        << " changed (report: \"Across LibTorch versions\")\n";
  }
  for (const auto& w : warnings) out << "  warning: " << w << "\n";
  for (const auto& f : failures) out << "  GATE: " << f << "\n";
  if (!files.plotProblem.empty()) out << "  plots: " << files.plotProblem << "\n";
  out << "report: " << files.html << " (" << files.plots.size() << " plots), " << files.markdown
      << ", " << files.summaryCsv << "\n";
  if (options.gate) {
    out << "gate: "
        << (failures.empty() ? "passed"
                             : "FAILED (" + std::to_string(failures.size()) + " finding(s))")
        << "\n";
  }
  if (filesOut) *filesOut = files;
  return options.gate && !failures.empty() ? 1 : 0;
}

}  // namespace sb::reports
