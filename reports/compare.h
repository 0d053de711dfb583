#pragma once

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
struct GateOptions {
  double perfThresholdPct = 10.0;  // minimum effect size on the median time
  double memThresholdPct = 5.0;    // peak memory is near-deterministic: a tight threshold
  double alpha = 0.05;             // significance level of the U test
  int minSamples = 9;              // per side, for the U test to be trusted at all
  double noisyCv = 0.10;           // stddev / mean above which a row is marked noisy
  bool hardPerf = false;           // --gate-perf
  bool allowGone = false;          // a row missing from the current run only warns
  bool allowMispredicted = false;  // a row flagged `mispredicted` only warns
};

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
                             // "too few repetitions", "n/a"
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
  bool gateFailed() const;
  std::vector<std::string> gateFailures() const;  // "suite/case strategy: why", every row
  std::vector<std::string> warnings() const;
};

// Matches rows by key and applies the gate rules. With an empty baseline every row is judged
// on its own: a failing or erroring row still fails the numerics gate (nightly CI goes red on
// a wrong strategy whether or not it has a history). Throws ReportInputError when the baseline
// comes from another suite than the results.
Comparison compare(const std::vector<ResultRow>& current, const std::vector<ResultRow>& baseline,
                   const GateOptions& options);

}  // namespace sb::reports
