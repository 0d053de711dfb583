#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "reports/results_file.h"

namespace sb::reports {

// How results are compared with a baseline and what fails the gate (DESIGN.md, "Gating
// semantics"). Numerics always gate, and so does a row `run` flagged `mispredicted` (a
// prediction past the tolerance its strategy states) unless allowMispredicted; memory gates
// past its threshold; time gates only with
// `hardPerf`, and then only when the median moved past the threshold and the Mann-Whitney U
// test over the repetitions says the move is significant.
// How much a row's median time moves between runs of the same build on the same machine: from
// repeated runs (`stratbench noise`, kept by ci/nightly.sh --calibrate), as Megatron-LM's
// golden statistics. A row's band is `factor` times the spread (max - min) of its runs'
// medians relative to their median, never below `floorPct`: the smallest change of the median
// that the gate calls a regression or an improvement.
struct NoiseBand {
  double bandPct = 0;
  double spreadPct = 0;  // (max - min) / median of the calibration runs' medians, in %
  int runs = 0;
};
struct NoiseModel {
  std::string file;  // where it was read, for messages
  int runs = 0;      // calibration runs it was made from
  double floorPct = 0, factor = 0;
  std::string gitSha, host;        // the build and machine it was measured on
  std::map<std::string, NoiseBand> byKey;  // ResultRow::key()
};

struct GateOptions {
  double perfThresholdPct = 10.0;  // minimum effect size on the median time
  double memThresholdPct = 5.0;    // peak memory is near-deterministic: a tight threshold
  double alpha = 0.05;             // significance level of the U test
  int minSamples = 9;              // per side, for the U test to be trusted at all
  double noisyCv = 0.10;           // stddev / mean above which a row is marked noisy
  bool hardPerf = false;           // --gate-perf
  bool allowGone = false;          // a row missing from the current run only warns
  bool allowMispredicted = false;  // a row flagged `mispredicted` only warns
  bool allowEmptySuite = false;    // a suite that ran no row (all skipped/unsupported) only warns
  // The machine's noise per row: with it a time change must pass the row's band (and the U
  // test) to be a regression or an improvement. A row it has no band for, and every row
  // without it, is judged against perfThresholdPct, and the finding says so.
  std::optional<NoiseModel> noise;
  // An improvement past max(2 x band, this) is reported as unexplained: a benchmark that got
  // much faster without a change meant to do so usually stopped doing its work.
  double largeImprovementPct = 25.0;
  // A rerun of some rows (ci/nightly.sh reruns the rows a night found slower): a row's time
  // regression counts only where its rerun is past the band and significant too; otherwise it
  // is "suspicious" (not reproduced). A shared machine's one-off stall is not a regression.
  std::vector<ResultRow> confirm;
};

// Reads a noise file `stratbench noise` wrote; throws ReportInputError naming the file and
// the key for anything else.
NoiseModel readNoise(const std::string& path);
// The noise of `runs` (each one run's rows, the same suite): per row present in at least two
// runs, the spread of the medians and the band. JSON as readNoise reads it.
std::string noiseJson(const std::vector<std::vector<ResultRow>>& runs,
                      const std::vector<std::string>& runDirs, double floorPct, double factor);

enum class Verdict { kRegressed, kImproved, kUnchanged, kNew, kGone };
const char* verdictName(Verdict v);  // "regressed", "improved", "unchanged", "new", "gone"

// One (case, strategy) against its baseline.
struct RowComparison {
  const ResultRow* current = nullptr;   // null when gone
  const ResultRow* baseline = nullptr;  // null when new, or when there is no baseline at all
  const ResultRow& any() const { return current ? *current : *baseline; }

  // "ok", "regressed", "fixed", "still failing", "new failure", "n/a"
  std::string numerics = "n/a";
  std::optional<double> timeChangePct;  // of the median, current vs baseline
  std::optional<double> timePValue;
  std::string time = "n/a";  // "regressed", "improved", "unchanged", "not significant",
                             // "too few repetitions", "not reproduced", "n/a"
  // The finding's class, as a perf dashboard names it: "regression", "improvement",
  // "suspicious" (past the band, but the U test not significant or a rerun not reproducing
  // it), "insufficient data" (too few repetitions), "unchanged", "n/a".
  std::string timeClass = "n/a";
  std::optional<double> timeBandPct;  // the band the change was judged against
  bool largeImprovement = false;
  std::optional<double> confirmChangePct;  // the rerun's change of median, where there is one
  bool noisy = false;        // cv above GateOptions::noisyCv on either side
  std::optional<double> memChangePct;
  std::string mem = "n/a";  // "regressed", "improved", "unchanged", "n/a"
  // The row's own predictions against its measurements, as `run` judged them: "ok" or
  // "mispredicted (memory)" etc.; "not judged" for a results file from before runs judged
  // them; "n/a" for a row without predictions.
  std::string prediction = "n/a";
  Verdict verdict = Verdict::kUnchanged;

  std::vector<std::string> gateFailures;  // each a sentence naming why
  std::vector<std::string> warnings;      // soft findings: reported, never fail the gate
};

struct Comparison {
  std::vector<RowComparison> rows;  // current order, then gone rows in baseline order
  bool hasBaseline = false;
  // Findings about the run as a whole, not one row: a suite that ran nothing, partial results.
  std::vector<std::string> runFailures, runWarnings;
  bool partial = false;  // read from results.partial.csv: the run was interrupted
  bool gateFailed() const;
  std::vector<std::string> gateFailures() const;  // "suite/case strategy: why", every row
  std::vector<std::string> warnings() const;
  // Whether this run may become the baseline: the gate passed and no row's time is a
  // regression, hard or soft (a slower night promoted is every later night's reference).
  // `promotionBlockers` says why not, one line each.
  std::vector<std::string> promotionBlockers() const;
};

// Matches rows by key and applies the gate rules. With an empty baseline every row is judged
// on its own: a failing or erroring row still fails the numerics gate (nightly CI goes red on
// a wrong strategy whether or not it has a history). Throws ReportInputError when the baseline
// comes from another suite than the results.
Comparison compare(const std::vector<ResultRow>& current, const std::vector<ResultRow>& baseline,
                   const GateOptions& options);

}  // namespace sb::reports
