#pragma once

// The parts of `stratbench report` (report.cpp's flow) that live in files of their own: the
// tables of the document (tables.cpp), the CSV outputs (summary_csv.cpp), the plots subprocess
// (plots.cpp) and the staging folder the set is built in (staging.cpp). Internal to reports/.

#include <set>
#include <string>
#include <vector>

#include "reports/compare.h"
#include "reports/document.h"
#include "reports/results_file.h"

namespace sb::reports {

// ---- tables.cpp -----------------------------------------------------------------------------

// `v` formatted by printf's format `f`.
std::string fmt(const char* f, double v);
// The distinct values of `field` over `rows`, and a set as "a, b, c" ("-" when empty).
std::set<std::string> distinct(const std::vector<ResultRow>& rows, std::string ResultRow::*field);
std::string joined(const std::set<std::string>& s);
// The provenance of the results and the baseline, the counts per family, and one case's rows.
Table provenanceTable(const std::vector<ResultRow>& cur, const std::vector<ResultRow>& base);
Table familyTable(const Comparison& cmp);
Table caseTable(const std::vector<const RowComparison*>& rows, bool hasBaseline,
                const std::string& id);
// Where the rows that were located first left the reference (ResultRow::firstDivergence): one
// line per row, the failing ones first; empty where none was.
Table divergenceTable(const std::vector<ResultRow>& rows);
// One row's communication per node and phase (ResultRow::commByNode), ranks that agree merged:
// node, phase, collective, ranks, counted, predicted; `summary` its one line (how many nodes
// communicate, and the first node where counted and predicted part), `differs` whether any do.
struct CommNodeTable {
  std::string summary;
  bool differs = false;
  Table table;
};
// Every row that has one, those whose nodes differ first, then in the rows' order; at most
// `limit` (the rest are in results.json).
std::vector<CommNodeTable> commNodeTables(const std::vector<ResultRow>& rows, size_t limit);

// ---- gate_output.cpp ------------------------------------------------------------------------

// What the report leads with: every change since the baseline a team lead acts on (newly
// failing, regressed, mispredicted, suspicious, improved, gone with why, new; at most `limit`
// rows, `changed` counts them all and `changeCounts` per kind), the ten slowest rows, the ten
// whose median time grew most, and the rows that did not run grouped by reason.
struct LeadTables {
  Table changes, slowest, mostRegressed, notRun;
  int changed = 0;
  std::vector<std::pair<std::string, int>> changeCounts;
};
LeadTables leadTables(const Comparison& cmp, const std::vector<ResultRow>& current, size_t limit);
// The gate's findings as JSON (gate.json: verdict, whether enforced, promotable and why not,
// per-row findings with their time class) and as JUnit XML (gate.junit.xml: a testcase per
// row, a failure per gate finding, skipped rows as skipped).
std::string gateJson(const Comparison& cmp, const std::vector<ResultRow>& current,
                     const GateOptions& o, bool enforced);
std::string gateJunit(const Comparison& cmp);

// ---- versions.cpp ---------------------------------------------------------------------------

// Whether the baseline ran on another LibTorch than the results (their torch_version sets
// differ): the report then shows what the upgrade changed.
bool versionsDiffer(const std::vector<ResultRow>& cur, const std::vector<ResultRow>& base);
// Over the rows both have: per family, how many keep their status, error ratio and peak to the
// byte, how many peaks each side's model predicts to the byte, how many each side flagged
// mispredicted, and the geometric mean of the median times' ratio (new / old); and the rows
// whose status, peak, exactness or prediction verdict moved (at most `limit`; `changed` counts
// them all).
struct VersionTables {
  Table families;
  Table changes;
  int both = 0, samePeak = 0, changed = 0;  // over every family
};
VersionTables versionTables(const Comparison& cmp, size_t limit);

// ---- pipeline_trace.cpp ---------------------------------------------------------------------

// A pipeline row's runs (ResultRow::pipelineRuns) as a Chrome trace: process "measured" and
// process "dry run", a thread per rank, each action a span; Perfetto and chrome://tracing open it.
std::string pipelineTrace(const nlohmann::json& runs);

// ---- summary_csv.cpp ------------------------------------------------------------------------

// One run of a --history directory.
struct HistoryRun {
  std::string dir;
  std::string timestamp;  // earliest row's
  std::vector<ResultRow> rows;
};

// A row's gate failures and warnings, "; "-separated.
std::string reasons(const RowComparison& rc);
// summary.csv (a row per comparison), tensors.csv (a row per tensor's error) and history.csv
// (a row per run and result).
std::string summaryCsv(const Comparison& cmp);
std::string tensorsCsv(const std::vector<ResultRow>& rows);
std::string historyCsv(const std::vector<HistoryRun>& runs);

// ---- plots.cpp ------------------------------------------------------------------------------

// Runs the plot scripts on DIR; returns an empty string or what went wrong.
std::string runPlots(const std::string& dir);

// ---- staging.cpp ----------------------------------------------------------------------------

// Writes `text` to `path` atomically (harness::writeFileAtomic).
void writeText(const std::string& path, const std::string& text);
// Removes a folder and everything in it, without following links; best effort. POSIX's nftw,
// not std::filesystem::remove_all: on the GPU machine (LibTorch 2.11 from a pip wheel, GCC 13)
// report crashed right after its last line, with its staging folder left behind, the one
// remove_all left to do; std::filesystem's symbols may resolve to the copy a wheel's LibTorch
// carries from its own toolchain. Not confirmed there yet (docs/gpu.md).
void removeTree(const std::string& path);

// Removes the staging folder unless the set was committed (an exception on the way out).
struct StagingGuard {
  std::string path;
  ~StagingGuard() { removeTree(path); }
};

// The staging folder of this process: .report.new.HOST.PID (the host, so that a report folder
// shared between machines never has one machine's live staging taken for a dead one).
std::string stagingName();

// Staging folders of this host's reports that died before their commit (SIGKILL, a crash):
// their pid is gone. A live one, or another host's, is left alone.
void removeStaleStaging(const std::string& dir);

// Moves a complete staged set into the report folder, with SIGINT, SIGTERM and SIGHUP held so
// that an interrupt lands before or after the whole move. Files of the previous set that the
// new one does not have (a plot no longer drawn, history.csv) go: those the previous report's
// manifest (.stratbench-report, moved in with each set) names, never another file. A plots/ or
// pipeline/ that is a symbolic link is refused before anything moves. report.html is moved
// last.
void commitSet(const std::string& stage, const std::string& dir,
               const std::vector<std::string>& files);

}  // namespace sb::reports
