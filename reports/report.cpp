// `stratbench report` (report.h): reads and checks every input, compares, builds the document
// and the CSVs in a staging folder, renders, commits the set and prints the summary. The parts
// are files of their own (report_internal.h, document.h), one per output as in
// google/benchmark's reporters.

#include "reports/report.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <tuple>

#include "harness/out_file.h"
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
    // A run that was interrupted left results.partial.csv: a run of the history too (read
    // and said partial), so that the newest night is never an older complete one by default.
    // A folder holding neither file is no run; one holding either as something other than a
    // file (a FIFO, a device, a dangling link) is a run left out with a word below, not in
    // silence.
    const auto present = [&](const char* name) {
      // Anything there, or a folder that cannot be looked into (EACCES): said below, not
      // skipped.
      const auto type = fs::symlink_status(it->path() / name, entryEc).type();
      return type != fs::file_type::not_found ||
             (entryEc && entryEc != std::errc::no_such_file_or_directory);
    };
    if (!it->is_directory(entryEc) ||
        (!present("results.csv") && !present("results.partial.csv"))) {
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
  const std::string raw = suite + "__" + caseName;
  std::string s = raw;
  for (char& c : s) {
    const bool keep = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                      c == '-' || c == '_' || c == '.';
    if (!keep) c = '_';
  }
  // Two names that differ only where characters were replaced ("a b" and "a_b") must not share
  // a file, and a file name stays well under the 255 bytes a file system allows (plot and
  // pipeline names add prefixes and suffixes): such a slug ends in a hash of the whole name.
  constexpr size_t kMaxSlug = 150;
  if (s == raw && s.size() <= kMaxSlug) return s;
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : raw) h = (h ^ c) * 1099511628211ull;
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return s.substr(0, kMaxSlug) + "-" + std::string(hex, 10);
}

namespace {

// A file the report reads (the results, the baseline, the noise file) kept in the report's
// folder under a name the report writes (summary.csv, gate.json, ...) was replaced by it, exit
// 0: refused before anything is written, through links.
void checkReadsNoneOfItsFiles(const std::string& dir, const std::vector<std::string>& results,
                              const ReportOptions& options) {
  static const std::set<std::string> written = {
      "summary.csv", "tensors.csv", "gate.json",   "gate.junit.xml",
      "report.md",   "report.html", "history.csv", ".stratbench-report"};
  harness::InputFiles reads;
  for (const auto& r : results) reads.emplace_back("the results", resultsCsvPath(r));
  for (const auto& b : options.baselines) reads.emplace_back("--baseline", resultsCsvPath(b));
  if (options.gateOptions.noise) reads.emplace_back("--noise", options.gateOptions.noise->file);
  if (const auto hit = harness::inputAmongOutputs(dir, written, reads)) {
    throw ReportInputError(hit->path + " (" + hit->option + ") is a file the report writes into " +
                           dir + " (" + hit->name +
                           "): it would be replaced; give the report another --out");
  }
}

}  // namespace

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
  // The results judged are not their own baseline: every row equals itself and the gate passed
  // whatever they held (`--baseline "$NEW"`, a CI variable set to the wrong run).
  for (const auto& b : options.baselines) {
    for (const auto& r : resultPaths) {
      std::error_code same_ec;
      if (fs::equivalent(resultsCsvPath(b), resultsCsvPath(r), same_ec)) {
        throw ReportInputError("--baseline " + b + " is the results being judged (" + r +
                               "): a baseline is an earlier run's");
      }
    }
  }
  const std::vector<ResultRow> baseline = readAll(options.baselines);
  if (!options.baselines.empty() && baseline.empty()) {
    throw ReportInputError(options.baselines.front() + ": the baseline holds no result rows");
  }
  Comparison cmp = compare(current, baseline, options.gateOptions);
  // A baseline promoted by force (ci/nightly.sh --promote-anyway) says so on every report
  // against it: its record, BASELINE.promotion.json, beside the baseline's results.csv.
  std::vector<std::string> baselineNotes;
  for (const auto& b : options.baselines) {
    const std::string csv = fs::is_directory(b) ? b + "/results.csv" : b;
    const std::string rec = csv + ".promotion.json";
    std::error_code rec_ec;
    if (!fs::is_regular_file(rec, rec_ec)) continue;
    nlohmann::json j;
    try {
      std::ifstream in(rec);
      j = nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {
      throw ReportInputError(rec + ": not JSON: " + e.what());
    }
    if (!j.is_object()) throw ReportInputError(rec + ": expected an object");
    const auto text = [&](const char* k) {
      return j.contains(k) && j[k].is_string() ? j[k].get<std::string>() : std::string("?");
    };
    if (j.contains("forced") && j["forced"] == true) {
      std::string note = "the baseline was promoted by force from " + text("promoted_from") +
                         " at " + text("at_utc") + ": \"" + text("reason") + "\"";
      if (j.contains("blockers") && j["blockers"].is_array()) {
        note += " over " + std::to_string(j["blockers"].size()) + " finding(s)";
      }
      cmp.runWarnings.push_back(note + " (" + rec + ")");
      baselineNotes.push_back(note);
    } else {
      baselineNotes.push_back("the baseline was promoted from " + text("promoted_from") +
                              " (its gate passed, no time regression)");
    }
  }

  // The report is one set of files (CSVs, plots, report.md, report.html), built whole in a
  // staging folder inside the report's and moved into place only when complete (commitSet):
  // an interrupted or failed report leaves the previous set as it was, never a mix.
  ReportFiles files;
  const std::string dir =
      options.outDir.empty() ? defaultOutDir(resultPaths.front()) : options.outDir;
  checkReadsNoneOfItsFiles(dir, resultPaths, options);
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

  // The document: the verdict and what changed first, then per family and per case, the
  // per-node communication tables last.
  const auto failures = cmp.gateFailures();
  const auto warnings = cmp.warnings();
  const GateOptions& go = options.gateOptions;
  std::map<std::string, int> statusCount;
  for (const auto& r : current) statusCount[r.status]++;
  const auto count = [&](const char* s) { return statusCount.count(s) ? statusCount.at(s) : 0; };
  const std::string rowsLine =
      std::to_string(current.size()) + " rows: " + std::to_string(count("pass")) + " pass, " +
      std::to_string(count("fail")) + " fail, " + std::to_string(count("error")) + " error, " +
      std::to_string(count("unsupported")) + " unsupported, " + std::to_string(count("skipped")) +
      " skipped" + (cmp.partial ? " (PARTIAL: the run was interrupted)" : "") +
      (cmp.hasBaseline ? "; against " + std::to_string(baseline.size()) + " baseline rows" : "") +
      ".";
  const LeadTables lead = leadTables(cmp, current, 50);

  Document doc;
  doc.heading(1, "stratbench report: " + joined(distinct(current, &ResultRow::suite)));
  if (failures.empty()) {
    doc.paragraph("PASS: the gate found nothing (" + std::to_string(warnings.size()) +
                      " warning(s)). " + rowsLine,
                  "verdict-pass");
  } else if (options.gate) {
    doc.paragraph("FAIL: " + std::to_string(failures.size()) + " gate finding(s). " + rowsLine,
                  "verdict-fail");
  } else {
    doc.paragraph("WOULD FAIL: " + std::to_string(failures.size()) +
                      " gate finding(s), not enforced (report without --gate exits 0). " + rowsLine,
                  "verdict-warn");
  }
  doc.toc();

  doc.heading(2, "What changed");
  for (const auto& n : baselineNotes) doc.paragraph("Baseline: " + n + ".");
  if (!cmp.hasBaseline) {
    doc.paragraph(
        "No baseline given: every row is judged on its own (numerics, predictions, a "
        "suite that ran nothing); no time or memory comparison.");
  }
  if (lead.changes.rows.empty()) {
    doc.paragraph(cmp.hasBaseline ? "Nothing changed past its threshold since the baseline."
                                  : "No row fails on its own.");
  } else {
    std::string counts;
    for (const auto& [kind, n] : lead.changeCounts) {
      counts += (counts.empty() ? "" : ", ") + std::to_string(n) + " " + kind;
    }
    doc.paragraph(
        counts +
        (static_cast<size_t>(lead.changed) > lead.changes.rows.size()
             ? " (the first " + std::to_string(lead.changes.rows.size()) +
                   " here; every row is in summary.csv, every finding and warning in gate.json)"
             : std::string()) +
        ".");
    doc.table(lead.changes);
  }
  if (!lead.mostRegressed.rows.empty()) {
    doc.paragraph(
        "Most slowed down (median time against the baseline; only a \"regression\" is "
        "past its noise band and significant):");
    doc.table(lead.mostRegressed);
  }
  if (!lead.slowest.rows.empty()) {
    doc.paragraph("Slowest rows of this run:");
    doc.table(lead.slowest);
  }
  if (!lead.notRun.rows.empty()) {
    doc.paragraph("Rows that did not run, by reason (" + std::to_string(count("skipped")) +
                  " skipped, " + std::to_string(count("unsupported")) + " unsupported):");
    doc.table(lead.notRun);
  }

  doc.heading(2, "Gate");
  if (failures.empty()) {
    doc.paragraph("Gate passed: no numerics regression, no misprediction, no memory regression" +
                      std::string(go.hardPerf ? ", no time regression" : "") +
                      ", no suite that ran nothing.",
                  "gate-pass");
  } else {
    doc.paragraph(std::string(options.gate ? "Gate failed: " : "Gate would fail (not enforced): ") +
                      std::to_string(failures.size()) + " finding(s).",
                  "gate-fail");
    doc.list(failures);
  }
  if (!warnings.empty()) {
    doc.paragraph("Warnings (" + std::to_string(warnings.size()) + "), reported but not gating:");
    doc.list(warnings);
  }
  const auto blockers = cmp.promotionBlockers();
  doc.paragraph(blockers.empty()
                    ? "Promotable: this run may become the baseline."
                    : "Not promotable: " + std::to_string(blockers.size()) +
                          " reason(s) (the gate's findings, and any time regression, soft or "
                          "hard).");
  doc.paragraph(
      "Thresholds: time " +
      (go.noise
           ? "past each row's noise band from " + go.noise->file + " (" +
                 std::to_string(go.noise->runs) + " runs of build " + go.noise->gitSha + " on " +
                 go.noise->host + "; band = " + fmt("%.3g", go.noise->factor) +
                 " x the row's spread pooled with its time scale's, at least " +
                 fmt("%.3g", go.perfThresholdPct) +
                 "%; a row without a band: " + fmt("%.3g", go.perfThresholdPct) + "%)"
           : fmt("%.3g", go.perfThresholdPct) + "% on the median (uncalibrated: no --noise file)") +
      " and Mann-Whitney p < " + fmt("%.3g", go.alpha) +
      " over >= " + std::to_string(go.minSamples) + " repetitions a side (" +
      (go.hardPerf ? "hard" : "soft") + "); memory " + fmt("%.3g", go.memThresholdPct) +
      "% (hard); numerics hard; predictions within each strategy's stated tolerance " +
      (go.allowMispredicted ? "(soft: --allow-mispredicted)" : "(hard)") +
      "; a suite that ran nothing " +
      (go.allowEmptySuite ? "(soft: --allow-empty-suite)." : "(hard)."));

  doc.heading(2, "Provenance");
  doc.table(provenanceTable(current, baseline));
  if (!files.plotProblem.empty()) doc.paragraph("Plots are missing: " + files.plotProblem, "warn");

  // Where the located rows first left the reference (a failing row, or any with run --capture).
  if (Table located = divergenceTable(current); !located.rows.empty()) {
    doc.heading(2, "Where rows diverge");
    doc.paragraph(
        "The first intermediate value (in the step's execution order) whose piece leaves its "
        "tolerance against the same value of the reference run: the node that made it, the "
        "phase, the ranks where it is the first, and its error (details.first_divergence).");
    doc.table(std::move(located));
  }

  // Another LibTorch in the baseline: what the upgrade changed, row by row.
  std::optional<VersionTables> versions;
  if (versionsDiffer(current, baseline)) {
    constexpr size_t kChangedRows = 500;
    versions = versionTables(cmp, kChangedRows);
    doc.heading(2, "Across LibTorch versions");
    doc.paragraph("The baseline ran LibTorch " +
                  joined(distinct(baseline, &ResultRow::torchVersion)) + ", the results " +
                  joined(distinct(current, &ResultRow::torchVersion)) +
                  ": the rows both have, old -> new. A peak predicted to the byte on one and not "
                  "the other is a memory model that encodes what one ATen allocates.");
    doc.table(versions->families);
    if (versions->changes.rows.empty()) {
      doc.paragraph(
          "No row changed its status, its peak, the exactness of its memory model or "
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
  doc.heading(2, "Cases");
  for (const auto& slug : caseOrder) {
    const auto& rows = byCase[slug];
    const ResultRow& a = rows.front()->any();
    doc.heading(3, "Case " + a.suite + "/" + a.caseName);
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

  writeText(stage + "/report.md", doc.markdown());
  writeText(stage + "/report.html",
            doc.html("stratbench report: " + joined(distinct(current, &ResultRow::suite)), stage));
  writeText(stage + "/gate.json", gateJson(cmp, current, go, options.gate));
  writeText(stage + "/gate.junit.xml", gateJunit(cmp));
  staged.push_back("gate.json");
  staged.push_back("gate.junit.xml");
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
  out << "report: " << rowsLine << "\n";
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
  } else if (!failures.empty()) {
    out << "gate: would fail (" << failures.size()
        << " finding(s)), not enforced: give --gate to exit 1\n";
  }
  out << "gate: " << (blockers.empty() ? "promotable" : "not promotable") << "; " << dir
      << "/gate.json, " << dir << "/gate.junit.xml\n";
  if (filesOut) *filesOut = files;
  return options.gate && !failures.empty() ? 1 : 0;
}

}  // namespace sb::reports
